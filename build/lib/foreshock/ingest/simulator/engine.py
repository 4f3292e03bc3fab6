"""The simulator: a schedule of failures plus telemetry generated chunk by chunk.

Time runs on a fixed grid ``start_ms + k * interval_ms``. A chunk is a run of consecutive steps
sized so that it holds about ``chunk_rows`` GPU samples, whatever the number of days: memory is
bounded by the chunk, not the run. Each chunk draws from its own random stream derived from
``(seed, chunk index)``, and state (counters, last Xid) flows from chunk to chunk, so the same
arguments give the same bytes.

Anything that happens between two samples (a failure, a repair, an Xid) belongs to the step of
the first sample at or after it. A node is down from its failure's step up to its repair's
step: it reports no GPU or link samples then. The failure's own Xids carry the failure's
exact timestamp.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from foreshock.ingest.contract import GPU_FIELDS, LINK_COUNTERS
from foreshock.ingest.dataset import EVENT_SCHEMA, GROUND_TRUTH_SCHEMA, XID_SCHEMA
from foreshock.ingest.simulator.counters import KeptRows
from foreshock.ingest.simulator.gpu import XID_MESSAGES, GpuBaseline, GpuGenerator, pci_bus_ids
from foreshock.ingest.simulator.links import LINK_STATES, LinkBaseline, LinkGenerator, link_port_names
from foreshock.ingest.simulator.profile import Profile
from foreshock.ingest.simulator.schedule import MS_PER_DAY, Failure, Schedule, draw_schedule

__all__ = ["Simulator", "Chunk", "DEFAULT_START_MS", "DEFAULT_CHUNK_ROWS"]

DEFAULT_START_MS: Final = 1_735_689_600_000  # 2025-01-01T00:00:00Z
DEFAULT_CHUNK_ROWS: Final = 1 << 17
_STREAM_BASELINE: Final = 0xBA5E
_STREAM_CHUNK: Final = 0xC4C
_STREAM_MISSING: Final = 0x1057  # its own stream: losing scrapes changes nothing else
_NOT_REPORTED: Final = frozenset({"retired_sbe", "retired_dbe", "retired_pending"})  # H100 remaps rows


@dataclass(frozen=True, slots=True)
class Chunk:
    """One time chunk of every telemetry table, ready to write or to stream."""

    index: int
    start_ms: int
    end_ms: int
    gpu: pa.Table
    xid: pa.Table
    link: pa.Table


class Simulator:
    """A simulated cluster: ``nodes`` x ``gpus_per_node`` GPUs failing as ``profile`` says.

    ``rate_multiplier`` (default: the profile's, itself 1.0) scales the failure rate so that
    small, short runs hold enough failures to train on. Iterate :meth:`chunks` for telemetry;
    :attr:`schedule` is the ground truth, known before any telemetry is generated.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        nodes: int,
        duration_ms: int,
        interval_ms: int,
        seed: int,
        start_ms: int = DEFAULT_START_MS,
        rate_multiplier: float | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ):
        if nodes < 1 or duration_ms <= 0 or interval_ms <= 0:
            raise ValueError("nodes, duration and interval must be positive")
        if rate_multiplier is not None and rate_multiplier <= 0:
            raise ValueError("rate_multiplier must be > 0")
        self.profile = profile
        self.nodes = nodes
        self.gpus = profile.cluster.gpus_per_node
        self.ports = profile.cluster.ib_ports_per_node
        self.interval_ms = interval_ms
        self.seed = seed
        self.start_ms = start_ms
        self.steps = -(-duration_ms // interval_ms)
        self.end_ms = start_ms + duration_ms
        self.rate_multiplier = profile.cluster.rate_multiplier if rate_multiplier is None else rate_multiplier
        self.steps_per_chunk = max(1, chunk_rows // (nodes * self.gpus))
        self.n_chunks = -(-self.steps // self.steps_per_chunk)
        self.schedule: Schedule = draw_schedule(
            profile, nodes, start_ms, self.end_ms, seed, self.rate_multiplier
        )
        self.node_names = tuple(f"node{i:0{max(4, len(str(nodes - 1)))}d}" for i in range(nodes))
        self._node_dictionary = pa.array(self.node_names)

    @property
    def gpu_samples(self) -> int:
        """GPU samples of the whole run if no node were ever down (the size of the work)."""
        return self.steps * self.nodes * self.gpus

    def step_of(self, ts_ms: int) -> int:
        """The first step whose sample is at or after ``ts_ms``."""
        return -(-(ts_ms - self.start_ms) // self.interval_ms)

    def manifest(self) -> dict[str, Any]:
        """The dataset manifest of this run (the layout's keys plus how it was made)."""
        return {
            "profile": self.profile.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "interval_ms": self.interval_ms,
            "seed": self.seed,
            "rate_multiplier": self.rate_multiplier,
            "ib_ports_per_node": self.ports,
            "failures": len(self.schedule.failures),
            "generator": "foreshock-simulator",
        }

    def chunks(self) -> Iterator[Chunk]:
        """Telemetry chunks in time order (a fresh generator state on each call)."""
        rng = np.random.default_rng([self.seed, _STREAM_BASELINE])
        gpu_gen = GpuGenerator(
            self.profile, self.nodes, self.interval_ms, GpuBaseline.draw(self.profile, self.nodes, rng)
        )
        noisy = self.profile.noise.noisy_gpu_fraction
        link_gen = LinkGenerator(
            self.nodes, self.ports, self.interval_ms, LinkBaseline.draw(self.nodes, self.ports, noisy, rng)
        )
        for index in range(self.n_chunks):
            yield self._chunk(index, gpu_gen, link_gen)

    def _chunk(self, index: int, gpu_gen: GpuGenerator, link_gen: LinkGenerator) -> Chunk:
        k0 = index * self.steps_per_chunk
        k1 = min(k0 + self.steps_per_chunk, self.steps)
        ts = self.start_ms + np.arange(k0, k1, dtype=np.int64) * self.interval_ms
        # the chunk owns (ts[0] - interval, ts[-1]]: events there attach to one of its steps
        lo, hi = int(ts[0]) - self.interval_ms + 1, int(ts[-1]) + 1
        rng = np.random.default_rng([self.seed, _STREAM_CHUNK, index])
        up = np.ones((ts.size, self.nodes), dtype=bool)
        repairs: list[tuple[int, Failure]] = []
        for f in self.schedule.down_between(lo - 1, hi):
            down0, down1 = self.step_of(f.ts) - k0, self.step_of(f.repair_ts) - k0
            if down1 < 0:
                continue
            up[max(down0, 0) : down1, f.node] = False
            if down1 < ts.size:
                repairs.append((down1, f))
        reported = up
        if self.profile.noise.missing_scrape_fraction > 0:  # lost scrapes: the node runs on, unseen
            lost = np.random.default_rng([self.seed, _STREAM_MISSING, index]).random(up.shape)
            reported = up & (lost >= self.profile.noise.missing_scrape_fraction)
        up_or_none = None if up.all() else up
        reported_or_none = None if reported.all() else reported
        episodes = self.schedule.episodes_between(lo - self.interval_ms, hi)
        gpu_rows = link_rows = KeptRows(reported_or_none, ts.size, self.nodes, self.gpus)
        if self.ports != self.gpus:  # else one port per GPU: the same rows, so the same key columns
            link_rows = KeptRows(reported_or_none, ts.size, self.nodes, self.ports)
        gpu = gpu_gen.generate(rng, ts, up_or_none, gpu_rows, episodes, repairs)
        link_cols, link_state = link_gen.generate(rng, ts, link_rows, episodes, repairs)
        gpu_keys = self._keys(ts, gpu_rows)
        link_keys = gpu_keys if link_rows is gpu_rows else self._keys(ts, link_rows)
        gpu_table = self._gpu_table(gpu_keys, gpu.columns)
        link_table = self._link_table(link_keys, link_cols, link_state)
        xid_table = self._xid_table(gpu, self.schedule.failures_between(lo, hi))
        return Chunk(index, int(ts[0]), int(ts[-1]), gpu_table, xid_table, link_table)

    def _dictionary(self, index: np.ndarray, values: tuple[str, ...] | pa.Array) -> pa.DictionaryArray:
        """Indices into ``values``; every index is in range by construction, so arrow need not check."""
        return pa.DictionaryArray.from_arrays(
            pa.array(index.astype(np.int32, copy=False)), pa.array(values), safe=False
        )

    def _keys(self, ts: np.ndarray, rows: KeptRows) -> tuple[pa.Array, pa.Array, np.ndarray]:
        """node and ts columns of the kept rows in (step, node, unit) order, plus each row's unit index."""
        node = rows.per_unit(np.arange(self.nodes, dtype=np.int32)[:, None])
        return (
            self._dictionary(node, self._node_dictionary),
            pa.array(rows.per_step(ts)),
            rows.per_unit(np.arange(rows.units, dtype=np.int64)),
        )

    def _gpu_table(
        self, keys: tuple[pa.Array, pa.Array, np.ndarray], cols: dict[str, np.ndarray]
    ) -> pa.Table:
        node, ts_col, gpu = keys
        nulls = pa.nulls(gpu.size, pa.float64())
        arrays = [node, ts_col, pa.array(gpu)]
        arrays += [nulls if field in _NOT_REPORTED else pa.array(cols[field]) for field in GPU_FIELDS]
        return pa.Table.from_arrays(arrays, names=["node", "ts", "gpu", *GPU_FIELDS])

    def _link_table(
        self, keys: tuple[pa.Array, pa.Array, np.ndarray], cols: dict[str, np.ndarray], state: np.ndarray
    ) -> pa.Table:
        node, ts_col, port = keys
        arrays = [
            node,
            ts_col,
            self._dictionary(port, link_port_names(self.ports)),
            self._dictionary(np.zeros(port.size, dtype=np.int32), ("ib",)),
            self._dictionary(state, LINK_STATES),
        ]
        arrays += [pa.array(cols[name]) for name in LINK_COUNTERS]
        return pa.Table.from_arrays(arrays, names=["node", "ts", "port", "kind", "state", *LINK_COUNTERS])

    def _xid_table(self, gpu, failures: list[Failure]) -> pa.Table:
        ts, node, unit, code = [gpu.xid_ts], [gpu.xid_node], [gpu.xid_gpu], [gpu.xid_code]
        for f in failures:
            units = range(self.gpus) if f.gpu is None else (f.gpu,)
            for u in units:
                for x in f.xid:
                    ts.append(np.array([f.ts]))
                    node.append(np.array([f.node]))
                    unit.append(np.array([u]))
                    code.append(np.array([x]))
        ts_a, node_a, unit_a, code_a = (np.concatenate(a).astype(np.int64) for a in (ts, node, unit, code))
        np.maximum(ts_a, self.start_ms, out=ts_a)  # an Xid "since the previous sample" of the first one
        order = np.lexsort((unit_a, node_a, ts_a))
        ts_a, node_a, unit_a, code_a = ts_a[order], node_a[order], unit_a[order], code_a[order]
        buses = pci_bus_ids(self.gpus)
        return pa.Table.from_pydict(
            {
                "node": [self.node_names[i] for i in node_a],
                "ts": ts_a,
                "gpu": unit_a,
                "xid": code_a,
                "count": np.ones(ts_a.size, dtype=np.int64),
                "message": [XID_MESSAGES.get(int(c), "") for c in code_a],
                "pci_bus_id": [buses[u] for u in unit_a],
            },
            schema=XID_SCHEMA,
        )

    def events_table(self) -> pa.Table:
        """Node lifecycle events of the run: ``failed`` at each failure, ``repaired`` when back in the run."""
        rows = []
        for f in self.schedule.failures:
            detail = failure_detail(f)
            rows.append((f.ts, f.node, "failed", f.cause, f.detectable, detail))
            if f.repair_ts < self.end_ms:
                rows.append((f.repair_ts, f.node, "repaired", f.cause, None, None))
        rows.sort(key=lambda r: (r[0], r[1]))
        return pa.Table.from_pydict(
            {
                "node": [self.node_names[r[1]] for r in rows],
                "ts": [r[0] for r in rows],
                "event": [r[2] for r in rows],
                "cause": [r[3] for r in rows],
                "detectable": [r[4] for r in rows],
                "detail": [r[5] for r in rows],
            },
            schema=EVENT_SCHEMA,
        )

    def ground_truth_table(self) -> pa.Table:
        """One row per injected failure (the dataset's ground_truth.parquet)."""
        fs = self.schedule.failures
        return pa.Table.from_pydict(
            {
                "node": [self.node_names[f.node] for f in fs],
                "ts": [f.ts for f in fs],
                "cause": [f.cause for f in fs],
                "detectable": [f.detectable for f in fs],
                "precursor": [f.precursor for f in fs],
                "precursor_start_ms": [f.precursor_start_ms for f in fs],
                "precursor_strength": [f.precursor_strength for f in fs],
                "repair_ts": [f.repair_ts for f in fs],
            },
            schema=GROUND_TRUTH_SCHEMA,
        )

    def gpu_days(self) -> float:
        return self.nodes * self.gpus * (self.end_ms - self.start_ms) / MS_PER_DAY


def failure_detail(f: Failure) -> str:
    """The ``detail`` of a ``failed`` event: where it struck, its Xids and its foreshock window."""
    parts = [
        f"gpu={'all' if f.gpu is None else f.gpu}",
        f"xid={','.join(map(str, f.xid)) or '-'}",
        f"precursor={f.precursor}",
    ]
    if f.precursor_start_ms is not None:
        parts.append(f"precursor_start_ms={f.precursor_start_ms}")
    parts.append(f"repair_ts={f.repair_ts}")
    return " ".join(parts)
