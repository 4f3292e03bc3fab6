"""InfiniBand port counters of one time chunk (one HCA port per GPU by default).

Healthy links see congestion discards and, on a few marginal cables, a steady trickle of
symbol errors that never lead anywhere. An ``ib_link`` foreshock makes the port's symbol
errors, receive errors and link-error recoveries grow, and the link flaps (a sample in state
``DOWN``, ``link_downed`` + 1) more and more often until it goes down for good. Counters
restart from zero when the node comes back from a repair (driver reload), as sysfs ones do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from foreshock.ingest.contract import LINK_COUNTERS
from foreshock.ingest.simulator.counters import Background, Increments, KeptRows, cumulative
from foreshock.ingest.simulator.schedule import Episode, Failure, intensities

__all__ = ["LinkBaseline", "LinkGenerator", "link_port_names", "LINK_STATES"]

_SYMBOL_PER_HOUR: Final = 0.05
_NOISY_PORT_FACTOR: Final = 60.0
_DISCARDS_PER_HOUR: Final = 1.5
_BACKGROUND_PER_HOUR: Final = {
    "link_error_recovery": 0.0005,
    "port_rcv_errors": 0.005,
    "port_rcv_remote_physical_errors": 0.002,
}
# foreshock rates per hour at intensity 1
_IB_LINK: Final = {
    "symbol_error": 2500.0,
    "port_rcv_errors": 60.0,
    "link_error_recovery": 2.0,
    "local_link_integrity_errors": 0.6,
    "port_rcv_remote_physical_errors": 6.0,
}
_FLAPS_PER_HOUR: Final = 2.0
LINK_STATES: Final = ("ACTIVE", "DOWN")
"""Port states as the sysfs collector reports them (``4: ACTIVE`` -> ``ACTIVE``)."""


@dataclass(frozen=True, slots=True)
class LinkBaseline:
    """Per-port background rates, drawn once per run."""

    symbol_rate_h: np.ndarray
    discard_rate_h: np.ndarray

    @classmethod
    def draw(cls, nodes: int, ports: int, noisy_fraction: float, rng: np.random.Generator) -> LinkBaseline:
        shape = (nodes, ports)
        noisy = rng.random(shape) < noisy_fraction
        return cls(
            symbol_rate_h=rng.lognormal(np.log(_SYMBOL_PER_HOUR), 1.0, shape)
            * np.where(noisy, _NOISY_PORT_FACTOR, 1.0),
            discard_rate_h=rng.lognormal(np.log(_DISCARDS_PER_HOUR), 1.0, shape),
        )


def link_port_names(ports: int) -> tuple[str, ...]:
    """Port ids as the InfiniBand sysfs collector names them (``device/port``)."""
    return tuple(f"mlx5_{i}/1" for i in range(ports))


class LinkGenerator:
    """Generates link chunks in time order, carrying counters from one to the next."""

    def __init__(self, nodes: int, ports: int, interval_ms: int, baseline: LinkBaseline):
        self.nodes = nodes
        self.ports = ports
        self.hours = interval_ms / 3_600_000
        self._carry = {name: np.zeros((nodes, ports), dtype=np.int64) for name in LINK_COUNTERS}
        self._background = {
            "symbol_error": Background(baseline.symbol_rate_h * self.hours, burst_mean=4.0),
            "port_xmit_discards": Background(baseline.discard_rate_h * self.hours, burst_mean=20.0),
        }
        for name, per_hour in _BACKGROUND_PER_HOUR.items():
            self._background[name] = Background(np.full((nodes, ports), per_hour * self.hours))

    def generate(
        self,
        rng: np.random.Generator,
        ts: np.ndarray,
        rows: KeptRows,
        episodes: list[Episode],
        repairs: list[tuple[int, Failure]],
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Counter columns and port states (index into :data:`LINK_STATES`) of the kept ``rows``, in
        (step, node, port) order."""
        steps = ts.size
        state = np.zeros((steps, self.nodes, self.ports), dtype=np.int32)
        inc = {name: Increments() for name in LINK_COUNTERS}
        for name, background in self._background.items():
            background.scatter(rng, steps, inc[name])
        links = [ep for ep in episodes if ep.kind == "ib_link"]
        for ep, x in zip(links, intensities(links, ts), strict=True):
            active = np.flatnonzero(x > 0)
            lam = x[active] * self.hours
            for port in range(self.ports) if ep.gpu is None else (ep.gpu % self.ports,):
                for name, per_hour in _IB_LINK.items():
                    inc[name].add(active, ep.node, port, rng.poisson(lam * per_hour))
                flaps = active[rng.random(active.size) < lam * _FLAPS_PER_HOUR]  # down, then retrained
                inc["link_downed"].add(flaps, ep.node, port, 1)
                state[flaps, ep.node, port] = LINK_STATES.index("DOWN")
        resets = [(s, f.node) for s, f in repairs]
        counters = {name: cumulative(self._carry[name], rows, inc[name], resets) for name in LINK_COUNTERS}
        return counters, rows.select(state, np.int32)
