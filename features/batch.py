"""The batch engine: telemetry tables -> one feature row per (node, tick) at a fixed cadence.

A dataset is read once, in time order: each table's parts a row group at a time, merged by
time, and cut into slices at bucket boundaries (:func:`_slices`). Each slice is bucketized
(:func:`foreshock.features.buckets.bucketize`, carrying each counter's last value across
slices, so the statistics are those one bucketize of everything would give) and added to a
bucket history that holds no more than a day plus the longest window. When a day's ticks are
complete, each group of nodes lays its history on a dense (node, bucket) grid per statistic and
evaluates every feature at every tick through the kernel table; the day's rows of each peer
group then get their peer features and go to a sink (memory, or a partition of the feature table:
:mod:`foreshock.features.table`). Memory holds one slice, the history and one day's rows of one
peer group, whatever the number of days; datasets too large for one history are read in several
passes (*units*: sets of peer groups), which Dask runs side by side.

A tick ``t`` (a multiple of ``cadence_ms``) sees the records with ``ts < t``; a node has a row
at ``t`` when it sent a record in ``[t - live_ms, t)``. A node's windows read nothing from before
its last return to service (:mod:`foreshock.features.returns`).

Reductions take exact shortcuts the online engine cannot: prefix sums for integer-valued
statistics, max/min by doubling, a running position for ``last``; float sums (mean, std,
slope) use the same direct summation as the online engine, so both agree to the last bit on
those and exactly on the rest. A grid that starts at a day's first window gives the same
values as one that starts at the first record: every reduction reads only its window.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from numpy.lib.stride_tricks import sliding_window_view

from foreshock.features.buckets import BucketTable, Carry, Columns, bucketize
from foreshock.features.default_set import DEFAULT_FEATURE_SET
from foreshock.features.frames import KINDS, Codes, needed_columns, to_columns
from foreshock.features.history import EventLog, history_events, lifecycle_events
from foreshock.features.kernels import (
    AGGREGATIONS,
    EXACT_STAT_KINDS,
    add_peer_features,
    empty_value,
    history_values,
    reduce_direct,
)
from foreshock.features.returns import return_times, window_floors
from foreshock.features.spec import FeatureSet, Reduction
from foreshock.features.table import DAY_MS, FeatureTable, Partition, TableIdentity, TableWriter
from foreshock.features.timeslices import dataset_extent, time_slices
from foreshock.ingest.contract import partition_of
from foreshock.ingest.dataset import part_paths, read_events, read_manifest

__all__ = ["Progress", "compute_features", "write_feature_table", "peer_group", "tick_range", "read_frames"]

_NO_EVENTS: Final = pd.DataFrame({"node": [], "ts": [], "event": []})
_GRID_BYTES: Final = 128 * 2**20
_WINDOW_BYTES: Final = 32 * 2**20
_PASS_BYTES: Final = 1536 * 2**20
"""Bucket history one pass may hold (a day plus the longest window of each of its nodes): a
dataset with more nodes is read in several passes, each over a share of the peer groups."""

Progress = Callable[[str, int, int], None]
"""``progress(label, done, total)``, called as work gets done (the CLI draws a bar from it)."""


def read_frames(
    data_dir: str | Path, fs: FeatureSet, nodes: Sequence[str] | None = None
) -> dict[str, pd.DataFrame]:
    """The columns ``fs`` reads from a dataset folder, optionally only for ``nodes``."""
    read_manifest(data_dir)
    out = {}
    filters = [("node", "in", list(nodes))] if nodes is not None else None
    for kind in KINDS:
        tables = []
        for path in part_paths(data_dir, kind):
            names = set(pq.read_schema(path).names)
            cols = [c for c in needed_columns(kind, fs) if c in names]
            tables.append(pq.read_table(path, columns=cols, filters=filters).to_pandas())
        tables = [t for t in tables if len(t)]
        if tables:
            out[kind] = pd.concat(tables, ignore_index=True)
    return out


def tick_range(
    first_ts: int, last_ts: int, cadence_ms: int, start_ms: int | None = None, end_ms: int | None = None
) -> np.ndarray:
    """Ticks (multiples of ``cadence_ms``) from the first one after ``first_ts`` to the first one
    after ``last_ts`` (so every record is seen), clipped to [start_ms, end_ms]."""
    ticks = np.arange(first_ts // cadence_ms + 1, last_ts // cadence_ms + 2, dtype=np.int64) * cadence_ms
    if start_ms is not None:
        ticks = ticks[ticks >= start_ms]
    if end_ms is not None:
        ticks = ticks[ticks <= end_ms]
    return ticks


class _Grid:
    """One statistic's dense (node, bucket) array, with cached helpers for fast reductions."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._prefix: np.ndarray | None = None
        self._levels: dict[tuple[str, int], np.ndarray] = {}

    def prefix(self) -> np.ndarray:
        if self._prefix is None:
            self._prefix = np.zeros((self.x.shape[0], self.x.shape[1] + 1))
            np.cumsum(self.x, axis=1, out=self._prefix[:, 1:])
        return self._prefix

    def level(self, op: str, p: int) -> np.ndarray:
        """``out[:, i] = op(x[:, i : i + 2**p])`` (sparse-table level ``p``)."""
        if (op, p) not in self._levels:
            if p == 0:
                self._levels[(op, p)] = self.x
            else:
                m, h = self.level(op, p - 1), 1 << (p - 1)
                self._levels[(op, p)] = (np.maximum if op == "max" else np.minimum)(m[:, :-h], m[:, h:])
        return self._levels[(op, p)]


def _reduce(
    r: Reduction, grids: dict[Any, _Grid], w: int, ends: np.ndarray, floor: np.ndarray | None
) -> np.ndarray:
    """Reduction ``r`` over the ``w`` buckets before each of ``ends`` -> (nodes, ticks), reading
    no bucket before ``floor`` (nodes, ticks; grid columns) where one is given."""
    out = _reduce_full(r, grids, w, ends)
    if floor is not None:
        _reduce_floored(r, grids, w, ends, floor, out)
    return out


def _reduce_floored(
    r: Reduction, grids: dict[Any, _Grid], w: int, ends: np.ndarray, floor: np.ndarray, out: np.ndarray
) -> None:
    """Redo, in ``out``, the windows that begin before their node's floor: the buckets before it
    read as empty. Float sums go through the reference kernel, as the online engine's do (their
    bits depend on the order of the terms); the exact reductions (max, min, sums of integer
    values) run from the floor, once per node and floor (:func:`_from_floor`)."""
    nodes, cols = np.nonzero(floor > (ends - w)[None, :])
    if not len(nodes):
        return
    if r.op in ("max", "min") or (r.op == "sum" and r.stat.kind in EXACT_STAT_KINDS):
        _from_floor(r.op, grids[r.stat].x, empty_value(r.stat), ends, floor, nodes, cols, out)
        return
    step = max(1, _WINDOW_BYTES // (w * 8))
    offsets = np.arange(w)
    for i in range(0, len(nodes), step):
        n, c = nodes[i : i + step], cols[i : i + step]
        buckets = (ends[c] - w)[:, None] + offsets
        before = buckets < floor[n, c][:, None]
        win, aux = (
            np.where(before, empty_value(s), grids[s].x[n[:, None], buckets]) if s is not None else None
            for s in (r.stat, r.aux)
        )
        out[n, c] = reduce_direct(r.op, win, aux)


def _from_floor(
    op: str, x: np.ndarray, empty: float, ends: np.ndarray, floor: np.ndarray, nodes: np.ndarray,
    cols: np.ndarray, out: np.ndarray,
) -> None:
    """``op`` over ``x[n, floor : end)`` for the floored windows (``nodes``, ``cols``): a floored
    window starts at its floor, so a running ``op`` from each (node, floor) answers all of its
    windows at once. Exact for max, min and sums of integer values, in any order."""
    ufunc = {"max": np.maximum, "min": np.minimum, "sum": np.add}[op]
    at_floor = floor[nodes, cols]
    span = int(at_floor.max()) + 1
    key = nodes.astype(np.int64) * span + at_floor  # one per (node, floor)
    order = np.argsort(key, kind="stable")
    starts = np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1]])
    for lo, hi in zip(starts, [*starts[1:], len(order)], strict=True):
        mine = order[lo:hi]
        n, f = divmod(int(key[mine[0]]), span)
        last = ends[cols[mine]] - 1 - f  # the window's last bucket, counted from the floor
        if last.max() < 0:
            out[n, cols[mine]] = empty
            continue
        running = ufunc.accumulate(x[n, f : f + int(last.max()) + 1])
        out[n, cols[mine]] = np.where(last >= 0, running[np.maximum(last, 0)], empty)


def _reduce_full(r: Reduction, grids: dict[Any, _Grid], w: int, ends: np.ndarray) -> np.ndarray:
    """Reduction ``r`` over all ``w`` buckets before each of ``ends`` -> (nodes, ticks)."""
    g = grids[r.stat]
    starts = ends - w
    if r.op == "sum" and r.stat.kind in EXACT_STAT_KINDS:
        c = g.prefix()
        return c[:, ends] - c[:, starts]
    if r.op in ("max", "min"):
        p = w.bit_length() - 1
        lv = g.level(r.op, p)
        f = np.maximum if r.op == "max" else np.minimum
        return f(lv[:, starts], lv[:, ends - (1 << p)])
    if r.op == "last":
        pos = np.where(grids[r.aux].x > 0, np.arange(g.x.shape[1]), -1)
        last = np.maximum.accumulate(pos, axis=1)[:, ends - 1]
        val = np.take_along_axis(g.x, np.maximum(last, 0), axis=1)
        return np.where(last >= starts, val, np.nan)
    views = sliding_window_view(g.x, w, axis=1)
    step = max(1, _WINDOW_BYTES // max(1, g.x.shape[0] * w * 8))
    return (
        np.concatenate(
            [reduce_direct(r.op, views[:, starts[i : i + step]]) for i in range(0, len(starts), step)], axis=1
        )
        if len(starts)
        else np.empty((g.x.shape[0], 0))
    )


def _longest(fs: FeatureSet) -> int:
    """Buckets of the longest telemetry window (the live window included; history features read
    events, not buckets)."""
    return max([f.window_ms for _, f, _, _ in fs.plan] + [fs.live_ms]) // fs.bucket_ms


def _rows(
    table: BucketTable, names: Sequence[str], ticks: np.ndarray, fs: FeatureSet, returns: pd.DataFrame | None
) -> pd.DataFrame:
    """Base features (no peers) at ``ticks`` of the nodes ``names`` (``table.node`` indexes them),
    from their bucket statistics; buckets before the first tick's longest window are not read.

    ``returns`` (``node``, ``ts``, ``event``: :func:`foreshock.features.history.lifecycle_events`):
    its returns start windows afresh when ``fs.reset_on_return``, and the history features read
    its events; those of other nodes are ignored."""
    if not len(names) or not len(ticks) or not len(table.node):
        return pd.DataFrame(columns=["node", "ts", *[f.name for f in fs.features]])
    b = fs.bucket_ms
    b_lo = int(ticks[0] // b) - _longest(fs)
    nb = int(ticks[-1] // b) - b_lo
    # positions, not a mask: ``values[mask, j]`` would turn the mask into positions once a statistic
    keep = np.flatnonzero((table.bucket >= b_lo) & (table.bucket < b_lo + nb))
    cell = table.node[keep] * nb + (table.bucket[keep] - b_lo)  # in a flat (node, bucket) grid
    grids = {}
    for j, s in enumerate(fs.stats):
        x = np.full(len(names) * nb, empty_value(s))
        x[cell] = table.values[keep, j]
        grids[s] = _Grid(x.reshape(len(names), nb))
    ends = (ticks // b - b_lo).astype(np.int64)
    floor = None
    index = {n: i for i, n in enumerate(names)}
    mine = returns[returns["node"].isin(index)] if returns is not None else None
    if fs.reset_on_return and mine is not None:
        back = return_times(mine)
        if len(back):
            at = np.array([index[n] for n in back["node"]], dtype=np.int64)
            floor = window_floors(at, back["ts"].to_numpy(np.int64), len(names), ticks, b) - b_lo
    t = np.broadcast_to(ticks.astype(np.float64), (len(names), len(ticks)))
    live = _reduce(Reduction("sum", fs.records_stat), grids, fs.live_ms // b, ends, floor) > 0
    values = np.empty((len(fs.features), int(live.sum())))  # a feature a row: each one written whole
    for j, f, w, reductions in fs.plan:
        reduced = [_reduce(r, grids, w, ends, floor) for r in reductions]
        values[j] = AGGREGATIONS[f.agg].finalize(reduced, f, t, b)[live]
    node_idx, tick_idx = np.nonzero(live)
    if fs.history_plan:
        events = history_events(mine) if mine is not None else history_events(_NO_EVENTS)
        at = np.array([index[n] for n in events["node"]], dtype=np.int64)
        log = EventLog.of(at, events["field"], events["ts"])
        values[[j for j, _ in fs.history_plan]] = history_values(fs, log, node_idx, ticks[tick_idx]).T
    out = pd.DataFrame(values.T, columns=[f.name for f in fs.features])
    out.insert(0, "node", np.asarray(names, dtype=object)[node_idx])
    out.insert(1, "ts", ticks[tick_idx])
    return out


def _finish(parts: list[pd.DataFrame], fs: FeatureSet, peer_groups: Mapping[str, str] | None) -> pd.DataFrame:
    """The groups' rows as one table sorted by (ts, node), with the peer features.

    Empties ``parts``: each group's rows are freed once concatenated, so no more than two copies
    of the table live at once (at one row a minute, 512 nodes x 14 days are 8 GB a copy).
    """
    nonempty = [p for p in parts if len(p)]
    parts.clear()
    if not nonempty:
        return pd.DataFrame(columns=["node", "ts", *fs.names])
    table = pd.concat(nonempty, ignore_index=True)
    del nonempty
    table = table.sort_values(["ts", "node"], kind="stable", ignore_index=True)
    table["ts"] = table["ts"].astype(np.int64)
    return add_peer_features(table, fs, peer_groups)  # columns: node, ts, then fs.names in order


def peer_group(node: str, fs: FeatureSet) -> int:
    """The peer group of ``node`` (:attr:`~foreshock.features.spec.FeatureSet.peer_partitions`):
    the nodes its peer features compare it with, and the feature table's partition of its rows."""
    return partition_of(node, fs.peer_partitions)


class _Nodes:
    """Every node seen so far: its code (:class:`Codes`) and, per peer group, its grid groups
    (nodes whose grids are built together, ``per_grid`` at most)."""

    def __init__(self, fs: FeatureSet, per_grid: int):
        self.fs = fs
        self.per_grid = per_grid
        self.codes = Codes()
        self.grids: dict[int, list[list[int]]] = {}
        self._known = 0

    def register(self) -> None:
        """Place the codes :attr:`codes` gave out since the last call."""
        for code in range(self._known, len(self.codes)):
            grids = self.grids.setdefault(peer_group(self.codes.names[code], self.fs), [])
            if not grids or len(grids[-1]) >= self.per_grid:
                grids.append([])
            grids[-1].append(code)
        self._known = len(self.codes)


class _History:
    """The bucket statistics of a pass's nodes, a table per slice as slices add them; old buckets
    are dropped. The tables are never joined into one: joined, a day plus the longest window of a
    pass's nodes (up to :data:`_PASS_BYTES`) was held twice, and in part a third time while its
    recent buckets were copied out."""

    def __init__(self) -> None:
        self._parts: list[BucketTable] = []

    def add(self, table: BucketTable) -> None:
        if len(table.node):
            self._parts.append(table)

    def drop_before(self, bucket: int) -> None:
        """Keep the buckets from ``bucket`` on, each table replaced by its kept rows in turn (the
        old one freed before the next is copied)."""
        for i in range(len(self._parts)):
            keep = self._parts[i].bucket >= bucket
            if not keep.all():
                part = self._parts[i]
                self._parts[i] = BucketTable(part.node[keep], part.bucket[keep], part.values[keep])
                del part
        self._parts = [part for part in self._parts if len(part.node)]

    def of(self, codes: np.ndarray, n_stats: int) -> BucketTable:
        """The buckets of the nodes ``codes``, their node renumbered as positions in ``codes``, in
        the order the slices added them."""
        if not self._parts:
            return BucketTable(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, n_stats)))
        top = max(max(int(part.node.max()) for part in self._parts), int(codes.max()))
        position = np.full(top + 1, -1, dtype=np.int64)
        position[codes] = np.arange(len(codes))
        picked = []
        for part in self._parts:
            local = position[part.node]
            mine = local >= 0
            picked.append((local[mine], part.bucket[mine], part.values[mine]))
        node, bucket, values = (np.concatenate(column) for column in zip(*picked, strict=True))
        return BucketTable(node, bucket, values)


Sink = Callable[[int, int, pd.DataFrame], None]
"""``sink(group, day, rows)``: one peer group's rows of one day (days in time order)."""


class _DayStream:
    """One pass of the engine: time slices in, each day's rows per peer group out to ``sink``."""

    def __init__(
        self,
        fs: FeatureSet,
        ticks: np.ndarray,
        returns: pd.DataFrame | None,
        per_grid: int,
        peer_groups: Mapping[str, str] | None,
        sink: Sink,
    ):
        self.fs, self.returns, self.peer_groups, self.sink = fs, returns, peer_groups, sink
        self.nodes = _Nodes(fs, per_grid)
        self.ports = Codes()
        self._carry = Carry()
        self._history = _History()
        days, first = np.unique(ticks // DAY_MS, return_index=True)
        bounds = zip(days, first, [*first[1:], len(ticks)], strict=True)
        self._days = [(int(d), ticks[lo:hi]) for d, lo, hi in bounds]
        self.days_done = 0

    @property
    def days(self) -> int:
        return len(self._days)

    def columns(self, frames: Mapping[str, pd.DataFrame]) -> dict[str, Columns]:
        """Telemetry frames as the numeric columns :meth:`feed` takes, coded by this stream."""
        codes = self.nodes.codes
        return {k: to_columns(k, f, self.fs, codes, self.ports) for k, f in frames.items() if len(f)}

    def feed(self, cols: Mapping[str, Columns], cut: float) -> None:
        """Bucketize a slice (every record before ``cut`` not fed yet, as :meth:`columns` codes
        it), then emit the days whose ticks it completes (a tick reads the records before it)."""
        fs = self.fs
        if cols:
            self._history.add(bucketize(fs, cols.get("gpu"), cols.get("xid"), cols.get("link"), self._carry))
            self.nodes.register()
        while self.days_done < len(self._days) and self._days[self.days_done][1][-1] <= cut:
            self._emit(*self._days[self.days_done])
            self.days_done += 1

    def _emit(self, day: int, ticks: np.ndarray) -> None:
        fs = self.fs
        self._history.drop_before(int(ticks[0] // fs.bucket_ms) - _longest(fs))
        names = self.nodes.codes.names
        for group in sorted(self.nodes.grids):
            parts = []
            for grid in self.nodes.grids[group]:
                codes = np.asarray(grid, dtype=np.int64)
                buckets = self._history.of(codes, len(fs.stats))
                parts.append(_rows(buckets, [names[c] for c in grid], ticks, fs, self.returns))
            table = _finish(parts, fs, self.peer_groups)
            if len(table):
                self.sink(group, day, table)


@dataclass(frozen=True)
class _Plan:
    """What every pass shares: the ticks, the number of passes, the nodes per grid group."""

    ticks: np.ndarray
    passes: int
    per_grid: int

    def keeps(self, node: str, fs: FeatureSet, index: int) -> bool:
        """Whether pass ``index`` computes ``node``'s rows."""
        return peer_group(node, fs) % self.passes == index


def _plan(
    fs: FeatureSet,
    extent: tuple[int, int] | None,
    n_nodes: int,
    cadence_ms: int,
    start_ms: int | None,
    end_ms: int | None,
    nodes_per_group: int | None,
    passes: int = 1,
) -> _Plan:
    """The ticks, and as many passes as the bucket history needs (at least ``passes``; at most one
    per peer group, since a peer group's rows are computed together)."""
    if cadence_ms % fs.bucket_ms:
        raise ValueError(f"cadence_ms must be a multiple of {fs.bucket_ms}")
    ticks = (
        tick_range(extent[0], extent[1], cadence_ms, start_ms, end_ms)
        if extent is not None
        else np.empty(0, dtype=np.int64)
    )
    history = DAY_MS // fs.bucket_ms + _longest(fs) + 1
    per_node = history * (len(fs.stats) + 2) * 8
    needed = max(passes, -(-n_nodes * per_node // _PASS_BYTES))
    per_grid = nodes_per_group or max(1, _GRID_BYTES // (len(fs.stats) * history * 8))
    return _Plan(ticks, max(1, min(fs.peer_partitions, needed)), per_grid)


def _frames_extent(frames: Mapping[str, pd.DataFrame]) -> tuple[int, int] | None:
    if not frames:
        return None
    return min(int(f["ts"].min()) for f in frames.values()), max(int(f["ts"].max()) for f in frames.values())


def compute_features(
    data_dir: str | Path | None = None,
    *,
    gpu: pd.DataFrame | None = None,
    xid: pd.DataFrame | None = None,
    link: pd.DataFrame | None = None,
    events: pd.DataFrame | None = None,
    feature_set: FeatureSet = DEFAULT_FEATURE_SET,
    cadence_ms: int = 60_000,
    start_ms: int | None = None,
    end_ms: int | None = None,
    progress: Progress | None = None,
    nodes_per_group: int | None = None,
    peer_groups: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """The feature table in memory: columns ``node``, ``ts``, then ``feature_set.names``; sorted by
    (ts, node). For a table larger than memory, :func:`write_feature_table`.

    Reads ``data_dir`` (dataset layout; in time order, one slice at a time) or the given frames.
    ``cadence_ms`` must be a multiple of ``feature_set.bucket_ms``. All records before
    ``start_ms`` still feed the windows. ``peer_groups`` (node -> group, e.g. its job) narrows
    the peer features within a peer group. ``events`` (the node-event table; read from
    ``data_dir`` when not given) says where windows start afresh (:mod:`foreshock.features.returns`).
    """
    fs = feature_set
    frames = {k: v for k, v in zip(KINDS, (gpu, xid, link), strict=True) if v is not None and len(v)}
    returns = _returns(data_dir, events)
    by_day: dict[int, list[pd.DataFrame]] = {}

    def keep(group: int, day: int, rows: pd.DataFrame) -> None:
        by_day.setdefault(day, []).append(rows)

    if data_dir is None:
        n_nodes = len(set().union(*(f["node"].unique() for f in frames.values()))) if frames else 0
        plan = _plan(fs, _frames_extent(frames), n_nodes, cadence_ms, start_ms, end_ms, nodes_per_group)
        stream = _DayStream(fs, plan.ticks, returns, plan.per_grid, peer_groups, keep)
        stream.feed(stream.columns(frames), np.inf)
        if progress is not None:
            progress("features", stream.days, stream.days)
    else:
        plan = _plan(fs, dataset_extent(data_dir), int(read_manifest(data_dir)["nodes"]), cadence_ms,
                     start_ms, end_ms, nodes_per_group)
        _passes(data_dir, fs, plan, returns, peer_groups, range(plan.passes), keep, progress)
    days = [
        pd.concat(by_day[d], ignore_index=True).sort_values(["ts", "node"], kind="stable", ignore_index=True)
        for d in sorted(by_day)
    ]
    by_day.clear()
    if not days:
        return pd.DataFrame(columns=["node", "ts", *fs.names])
    return pd.concat(days, ignore_index=True)


def _passes(
    data_dir: str | Path,
    fs: FeatureSet,
    plan: _Plan,
    returns: pd.DataFrame | None,
    peer_groups: Mapping[str, str] | None,
    indices: Iterable[int],
    sink: Sink,
    progress: Progress | None,
) -> None:
    """Run passes ``indices`` of ``plan`` over a dataset folder, one after the other; progress
    counts the days emitted."""
    indices = list(indices)
    for n, index in enumerate(indices):
        stream = _DayStream(fs, plan.ticks, returns, plan.per_grid, peer_groups, sink)
        if progress is not None and n == 0:
            progress("features", 0, len(indices) * stream.days)
        keep = None if plan.passes == 1 else (lambda node, i=index: plan.keeps(node, fs, i))
        for cols, cut in time_slices(data_dir, fs, stream.nodes.codes, stream.ports, keep):
            stream.feed(cols, cut)
            if progress is not None:
                progress("features", n * stream.days + stream.days_done, len(indices) * stream.days)


def _write_passes(
    data_dir: str,
    out: str,
    fs: FeatureSet,
    plan: _Plan,
    returns: pd.DataFrame | None,
    peer_groups: Mapping[str, str] | None,
    indices: Sequence[int],
    progress: Progress | None = None,
) -> list[Partition]:
    """Passes ``indices``, each partition written to the table folder ``out`` as it is made (the
    task a Dask worker runs: it returns the partitions' names, never their rows)."""
    writer = TableWriter(out)
    written: list[Partition] = []

    def write(group: int, day: int, rows: pd.DataFrame) -> None:
        written.append(writer.write(group, day, rows, fs.names))

    _passes(data_dir, fs, plan, returns, peer_groups, indices, write, progress)
    return written


def write_feature_table(
    data_dir: str | Path,
    out: str | Path,
    *,
    dataset_fingerprint: str,
    feature_set: FeatureSet = DEFAULT_FEATURE_SET,
    cadence_ms: int = 60_000,
    start_ms: int | None = None,
    end_ms: int | None = None,
    client: Any = None,
    progress: Progress | None = None,
    nodes_per_group: int | None = None,
    peer_groups: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> FeatureTable:
    """Compute the features of a dataset folder into a feature table at ``out``
    (:mod:`foreshock.features.table`), by peer group and day, and return it.

    Nothing is gathered: each pass writes its partitions as it makes them. ``client`` (a
    ``distributed.Client`` or a scheduler address; ``out`` must then be a folder every worker
    writes to) runs the passes as Dask tasks, at least one per worker (each task reads every part
    but computes only its peer groups' nodes); without it they run here, one after the other.
    ``dataset_fingerprint`` is recorded as the table's source
    (:func:`foreshock.models.frame.dataset_fingerprint`); a refused ``out`` (a complete table
    without ``overwrite``, or a folder of other files) raises
    :class:`~foreshock.features.table.FeatureTableError`.
    """
    fs = feature_set
    writer = TableWriter(out)
    writer.prepare(overwrite)
    returns = _returns(data_dir, None)
    n_nodes = int(read_manifest(data_dir)["nodes"])
    extent = dataset_extent(data_dir)
    args = (fs, extent, n_nodes, cadence_ms, start_ms, end_ms, nodes_per_group)
    if client is None:
        plan = _plan(*args)
        indices = range(plan.passes)
        partitions = _write_passes(str(data_dir), str(out), fs, plan, returns, peer_groups, indices, progress)
    else:
        plan, partitions = _write_on_dask(client, str(data_dir), str(out), args, returns, peer_groups,
                                          progress)
    identity = TableIdentity(fs.hash, cadence_ms, dataset_fingerprint)
    return writer.finish(
        identity, fs.names, partitions, source=str(Path(data_dir).resolve()), passes=plan.passes
    )


def _write_on_dask(
    client_or_address: Any,
    data_dir: str,
    out: str,
    plan_args: tuple,
    returns: pd.DataFrame | None,
    peer_groups: Mapping[str, str] | None,
    progress: Progress | None,
) -> tuple[_Plan, list[Partition]]:
    from distributed import Client, as_completed

    client = client_or_address if isinstance(client_or_address, Client) else Client(client_or_address)
    try:
        fs = plan_args[0]
        plan = _plan(*plan_args, passes=max(1, len(client.scheduler_info()["workers"])))
        futures = [
            client.submit(_write_passes, data_dir, out, fs, plan, returns, peer_groups, [i], pure=False)
            for i in range(plan.passes)
        ]
        partitions: list[Partition] = []
        if progress is not None:
            progress("features (dask)", 0, len(futures))
        for done, fut in enumerate(as_completed(futures), start=1):
            partitions += fut.result()
            if progress is not None:
                progress("features (dask)", done, len(futures))
        return plan, partitions
    finally:
        if client is not client_or_address:
            client.close()


def _returns(data_dir: str | Path | None, events: pd.DataFrame | None) -> pd.DataFrame | None:
    """The node events the features read (:func:`foreshock.features.history.lifecycle_events`) of
    ``events``, or of the dataset's node-event table."""
    if events is None and data_dir is not None:
        events = read_events(data_dir)
    return lifecycle_events(events) if events is not None else None
