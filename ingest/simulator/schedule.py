"""When and where things go wrong: injected failures, their foreshocks, and false alarms.

The schedule is drawn once per run from its own random stream (``seed``), before any
telemetry, so the ground truth does not depend on how the telemetry is chunked. Its size grows
with the number of failures (a few per node-year), not with the number of samples.

Each node fails as a Poisson process while it is up: after a failure it is down until repair
(lognormal repair time of the failure's class) and cannot fail again before. A profile's
``[refault]`` table adds repeat failures: a repair fails with its probability (the node fails
again of the same cause a lognormal delay after its return), and its lemon nodes fail as a
Poisson process that many times faster. Those draws come from a stream of their own, so a
profile without the table draws exactly what it did before there was one. A detectable
failure carries an :class:`Episode` (its foreshock) that starts ``lead`` minutes before the
failure and grows until the failure; a false alarm is an episode of the same kinds on a healthy
node, weaker, that rises and then fades with no failure after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from foreshock.ingest.simulator.profile import Profile

__all__ = ["Failure", "Episode", "Schedule", "draw_schedule", "intensities", "MS_PER_DAY"]

MS_PER_DAY: Final = 86_400_000
_MS_PER_MINUTE: Final = 60_000
_STREAM_SCHEDULE: Final = 0x5CED
_STREAM_REFAULT: Final = 0x2EFA
_FALSE_ALARM_RISE: Final = 0.6  # fraction of a false alarm spent rising before it fades


@dataclass(frozen=True, slots=True)
class Episode:
    """A foreshock signature on one node: intensity rises over [start_ms, peak_ms), fades to end_ms.

    ``gpu`` is the GPU (and its InfiniBand port) that shows it, or ``None`` for all of them.
    For a failure's foreshock ``peak_ms == end_ms == failure ts``; intensity there is ``strength``.
    """

    node: int
    gpu: int | None
    kind: str
    start_ms: int
    peak_ms: int
    end_ms: int
    strength: float
    failure: bool

    def intensity(self, ts: np.ndarray) -> np.ndarray:
        """Intensity at each timestamp: a convex rise (slow, then fast) and a linear fade."""
        return intensities([self], ts)[0]


def intensities(episodes: list[Episode], ts: np.ndarray) -> np.ndarray:
    """``(len(episodes), ts.size)``: every episode's :meth:`Episode.intensity` in one vectorised pass.

    A chunk overlaps many episodes; one pass over all of them costs about what one episode did.
    """

    def column(values: list) -> np.ndarray:
        return np.array(values, dtype=np.float64).reshape(-1, 1)

    t = ts.astype(np.float64)
    start = column([e.start_ms for e in episodes])
    peak = column([e.peak_ms for e in episodes])
    end = column([e.end_ms for e in episodes])
    rise = np.clip((t - start) / column([max(e.peak_ms - e.start_ms, 1) for e in episodes]), 0.0, 1.0) ** 2
    fade = np.clip((end - t) / column([max(e.end_ms - e.peak_ms, 1) for e in episodes]), 0.0, 1.0)
    x = np.where(t < peak, rise, fade) * column([e.strength for e in episodes])
    x[(t < start) | (t >= end)] = 0.0
    return x


@dataclass(frozen=True, slots=True)
class Failure:
    """One injected failure (a ground-truth row). ``gpu`` is ``None`` for a whole-node failure;
    ``precursor_strength`` is its foreshock's :attr:`Episode.strength` (``None`` without one)."""

    node: int
    ts: int
    cause: str
    detectable: bool
    precursor: str
    precursor_start_ms: int | None
    precursor_strength: float | None
    repair_ts: int
    gpu: int | None
    xid: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Schedule:
    """Everything the telemetry generator needs to know about failures, in time order."""

    failures: tuple[Failure, ...]
    episodes: tuple[Episode, ...]

    def episodes_between(self, start_ms: int, end_ms: int) -> list[Episode]:
        """Episodes active at some instant of [start_ms, end_ms)."""
        return [e for e in self.episodes if e.start_ms < end_ms and e.end_ms > start_ms]

    def failures_between(self, start_ms: int, end_ms: int) -> list[Failure]:
        """Failures whose instant falls in [start_ms, end_ms)."""
        return [f for f in self.failures if start_ms <= f.ts < end_ms]

    def down_between(self, start_ms: int, end_ms: int) -> list[Failure]:
        """Failures whose down time [ts, repair_ts) overlaps [start_ms, end_ms)."""
        return [f for f in self.failures if f.ts < end_ms and f.repair_ts > start_ms]


def draw_schedule(
    profile: Profile, nodes: int, start_ms: int, end_ms: int, seed: int, rate_multiplier: float | None = None
) -> Schedule:
    """Draw the failures and false alarms of a run; same arguments, same schedule."""
    rng = np.random.default_rng([seed, _STREAM_SCHEDULE])
    classes = profile.failures
    shares = np.array([f.share for f in classes])
    shares = shares / shares.sum()
    gpus = profile.cluster.gpus_per_node
    mean_gap_ms = MS_PER_DAY / profile.node_failures_per_day(rate_multiplier)
    refault = profile.refault
    if refault is not None:
        refault_rng = np.random.default_rng([seed, _STREAM_REFAULT])
        lemons = refault_rng.random(nodes) < refault.lemon_fraction
        first_rate = refault.first_failure_rate(profile.node_failures_per_day(rate_multiplier),
                                                profile.mean_repair_days((end_ms - start_ms) / MS_PER_DAY))
        mean_gap_ms = MS_PER_DAY / first_rate
    failures: list[Failure] = []
    episodes: list[Episode] = []
    for node in range(nodes):
        t = float(start_ms)
        up_since = start_ms
        node_gap_ms = mean_gap_ms
        if refault is not None and lemons[node]:
            node_gap_ms /= refault.lemon_rate_multiplier
        previous = None  # the node's last failure class, which a failed repair brings back
        while True:
            if (refault is not None and previous is not None
                    and refault_rng.random() < refault.failed_repair_probability):
                t += refault_rng.lognormal(np.log(refault.failed_repair_median_hours),
                                           refault.failed_repair_sigma) * 3_600_000
                cls = previous
            else:
                t += rng.exponential(node_gap_ms)
                cls = None
            if t >= end_ms:
                break
            if cls is None:
                cls = classes[int(rng.choice(len(classes), p=shares))]
            ts = int(t)
            gpu = int(rng.integers(gpus)) if cls.scope == "gpu" else None
            detectable = cls.precursor != "none" and bool(rng.random() < cls.detectable)
            lead_ms = int(rng.uniform(*cls.lead_minutes) * _MS_PER_MINUTE)
            severity = float(np.clip(rng.lognormal(0.0, 0.4), 0.35, 3.0))
            repair_ms = int(rng.lognormal(np.log(cls.repair_median_hours), cls.repair_sigma) * 3_600_000)
            repair_ts = ts + max(repair_ms, _MS_PER_MINUTE)
            precursor_start = None
            if detectable:
                precursor_start = max(ts - lead_ms, up_since)
                episodes.append(Episode(node, gpu, cls.precursor, precursor_start, ts, ts, severity, True))
            failures.append(
                Failure(
                    node,
                    ts,
                    cls.cause,
                    detectable,
                    cls.precursor,
                    precursor_start,
                    severity if detectable else None,
                    repair_ts,
                    gpu,
                    cls.xid,
                )
            )
            t = float(repair_ts)
            up_since = repair_ts
            previous = cls
    episodes.extend(_false_alarms(profile, nodes, start_ms, end_ms, rng, rate_multiplier))
    failures.sort(key=lambda f: (f.ts, f.node))
    episodes.sort(key=lambda e: (e.start_ms, e.node))
    return Schedule(tuple(failures), tuple(episodes))


def _false_alarms(
    profile: Profile,
    nodes: int,
    start_ms: int,
    end_ms: int,
    rng: np.random.Generator,
    rate_multiplier: float | None,
) -> list[Episode]:
    """Weak foreshocks on healthy nodes: kinds in proportion to the detectable failures'."""
    kinds = [f for f in profile.failures if f.precursor != "none" and f.detectable > 0]
    rate = profile.noise.false_alarms_per_failure * profile.node_failures_per_day(rate_multiplier)
    if not kinds or rate <= 0:
        return []
    weights = np.array([f.share * f.detectable for f in kinds])
    weights = weights / weights.sum()
    expected = rate * nodes * (end_ms - start_ms) / MS_PER_DAY
    out = []
    lo, hi = profile.noise.false_alarm_strength
    for _ in range(int(rng.poisson(expected))):
        cls = kinds[int(rng.choice(len(kinds), p=weights))]
        node = int(rng.integers(nodes))
        begin = int(rng.uniform(start_ms, end_ms))
        length = int(rng.uniform(*cls.lead_minutes) * _MS_PER_MINUTE) + _MS_PER_MINUTE
        peak = begin + int(length * _FALSE_ALARM_RISE)
        gpu = int(rng.integers(profile.cluster.gpus_per_node)) if cls.scope == "gpu" else None
        out.append(
            Episode(node, gpu, cls.precursor, begin, peak, begin + length, float(rng.uniform(lo, hi)), False)
        )
    return out
