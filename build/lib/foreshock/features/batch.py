"""The batch engine: telemetry tables -> one feature row per (node, tick) at a fixed cadence.

Rows are computed per group of nodes (bounded memory; the unit Dask distributes): bucketize
the group's records (:func:`foreshock.features.buckets.bucketize`), lay the buckets on a dense
(node, bucket) grid per statistic, and evaluate every feature at every tick through the
kernel table. A tick ``t`` (a multiple of ``cadence_ms``) sees the records with ``ts < t``;
a node has a row at ``t`` when it sent a record in ``[t - live_ms, t)``. A node's windows read
nothing from before its last return to service (:mod:`foreshock.features.returns`).

Reductions take exact shortcuts the online engine cannot: prefix sums for integer-valued
statistics, max/min by doubling, a running position for ``last``; float sums (mean, std,
slope) use the same direct summation as the online engine, so both agree to the last bit on
those and exactly on the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.lib.stride_tricks import sliding_window_view

from foreshock.features.buckets import Carry, bucketize
from foreshock.features.default_set import DEFAULT_FEATURE_SET
from foreshock.features.frames import KINDS, Codes, needed_columns, to_columns
from foreshock.features.kernels import (
    AGGREGATIONS,
    EXACT_STAT_KINDS,
    add_peer_features,
    empty_value,
    reduce_direct,
)
from foreshock.features.returns import return_times, window_floors
from foreshock.features.spec import FeatureSet, Reduction
from foreshock.ingest.dataset import part_paths, read_events, read_manifest

__all__ = ["compute_features", "compute_features_dask", "feature_rows", "tick_range", "read_frames"]

_GRID_BYTES = 128 * 2**20
_WINDOW_BYTES = 32 * 2**20


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


def _extent(
    data_dir: str | Path | None, frames: dict[str, pd.DataFrame]
) -> tuple[list[str], int, int] | None:
    """Node ids and first/last timestamp of a dataset folder (read cheaply) or of frames."""
    nodes: set[str] = set()
    lo, hi = [], []
    if data_dir is not None:
        read_manifest(data_dir)
        for kind in KINDS:
            for path in part_paths(data_dir, kind):
                table = pq.read_table(path, columns=["node", "ts"])
                if table.num_rows:
                    nodes.update(pc.unique(table.column("node").cast(pa.string())).to_pylist())
                    bounds = pc.min_max(table.column("ts")).as_py()
                    lo.append(bounds["min"])
                    hi.append(bounds["max"])
    else:
        for f in frames.values():
            nodes.update(f["node"].unique())
            lo.append(int(f["ts"].min()))
            hi.append(int(f["ts"].max()))
    return (sorted(nodes), min(lo), max(hi)) if lo else None


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
    read as empty, and the window goes through the reference kernel, as the online engine's does."""
    nodes, cols = np.nonzero(floor > (ends - w)[None, :])
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


def feature_rows(
    frames: dict[str, pd.DataFrame], ticks: np.ndarray, fs: FeatureSet, returns: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Base features (no peers) of the nodes in ``frames`` at ``ticks``: the per-partition step.

    ``returns`` (``node``, ``ts``: :func:`foreshock.features.returns.return_times`) start windows afresh
    when ``fs.reset_on_return``; returns of other nodes are ignored."""
    nodes = Codes(sorted(set().union(*(f["node"].unique() for f in frames.values()))) if frames else [])
    if not len(nodes) or not len(ticks):
        return pd.DataFrame(columns=["node", "ts", *[f.name for f in fs.features]])
    ports = Codes()
    cols = {k: to_columns(k, frames[k], fs, nodes, ports) if k in frames else None for k in KINDS}
    table = bucketize(fs, cols["gpu"], cols["xid"], cols["link"], Carry())
    b = fs.bucket_ms
    max_w = max([f.window_ms // b for f in fs.features] + [fs.live_ms // b])
    b_lo = int(min(table.bucket.min(), ticks[0] // b)) - max_w
    nb = int(ticks[-1] // b) - b_lo
    keep = table.bucket < b_lo + nb
    rows_node, rows_col = table.node[keep], table.bucket[keep] - b_lo
    grids = {}
    for j, s in enumerate(fs.stats):
        x = np.full((len(nodes), nb), empty_value(s))
        x[rows_node, rows_col] = table.values[keep, j]
        grids[s] = _Grid(x)
    ends = (ticks // b - b_lo).astype(np.int64)
    floor = None
    if fs.reset_on_return and returns is not None:
        mine = returns[returns["node"].isin(set(nodes.names))]
        if len(mine):
            at = nodes.lookup(mine["node"])
            floor = window_floors(at, mine["ts"].to_numpy(np.int64), len(nodes), ticks, b) - b_lo
    t = np.broadcast_to(ticks.astype(np.float64), (len(nodes), len(ticks)))
    live = _reduce(Reduction("sum", fs.records_stat), grids, fs.live_ms // b, ends, floor) > 0
    values = np.empty((int(live.sum()), len(fs.features)))
    for j, (f, w, reductions) in enumerate(fs.plan):
        reduced = [_reduce(r, grids, w, ends, floor) for r in reductions]
        values[:, j] = AGGREGATIONS[f.agg].finalize(reduced, f, t, b)[live]
    node_idx, tick_idx = np.nonzero(live)
    out = pd.DataFrame(values, columns=[f.name for f in fs.features])
    out.insert(0, "node", np.asarray(nodes.names, dtype=object)[node_idx])
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


def _grid_buckets(ticks: np.ndarray, fs: FeatureSet) -> int:
    """Width of a group's grid: the ticks' span plus the longest window before the first one."""
    if not len(ticks):
        return 1
    longest = max([f.window_ms for f in fs.features] + [fs.live_ms]) // fs.bucket_ms
    return int(ticks[-1] - ticks[0]) // fs.bucket_ms + longest + 1


def _node_groups(
    node_names: Sequence[str], n_buckets: int, fs: FeatureSet, size: int | None
) -> list[list[str]]:
    if size is None:
        size = max(1, _GRID_BYTES // max(1, len(fs.stats) * n_buckets * 8))
    names = sorted(node_names)
    return [names[i : i + size] for i in range(0, len(names), size)]


def _progress(enabled: bool, total: int, label: str) -> Callable[[], None]:
    if not enabled:
        return lambda: None
    from rich.progress import Progress

    bar = Progress(transient=False)
    bar.start()
    task = bar.add_task(label, total=total)

    def step() -> None:
        bar.advance(task)
        if bar.tasks[task].completed >= total:
            bar.stop()

    return step


def _plan(
    data_dir: str | Path | None,
    frames: dict[str, pd.DataFrame],
    fs: FeatureSet,
    cadence_ms: int,
    start_ms: int | None,
    end_ms: int | None,
    nodes_per_group: int | None,
) -> tuple[np.ndarray, list[list[str]]]:
    """The ticks and the groups of nodes (each group's grid fits in memory)."""
    if cadence_ms % fs.bucket_ms:
        raise ValueError(f"cadence_ms must be a multiple of {fs.bucket_ms}")
    extent = _extent(data_dir, frames)
    if extent is None:
        return np.empty(0, dtype=np.int64), []
    nodes, first, last = extent
    ticks = tick_range(first, last, cadence_ms, start_ms, end_ms)
    return ticks, _node_groups(nodes, _grid_buckets(ticks, fs), fs, nodes_per_group)


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
    progress: bool = False,
    nodes_per_group: int | None = None,
    peer_groups: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """The feature table: columns ``node``, ``ts``, then ``feature_set.names``; sorted by (ts, node).

    Reads ``data_dir`` (dataset layout; one group of nodes at a time, so memory holds one
    group's telemetry) or the given frames. ``cadence_ms`` must be a multiple of
    ``feature_set.bucket_ms``. All records before ``start_ms`` still feed the windows.
    ``peer_groups`` (node -> group, e.g. its job) scopes the peer features; default: the cluster.
    ``events`` (the node-event table; read from ``data_dir`` when not given) says where windows
    start afresh (:mod:`foreshock.features.returns`).
    """
    frames = {k: v for k, v in zip(KINDS, (gpu, xid, link), strict=True) if v is not None and len(v)}
    returns = _returns(data_dir, events)
    ticks, groups = _plan(data_dir, frames, feature_set, cadence_ms, start_ms, end_ms, nodes_per_group)
    step = _progress(progress, len(groups), "features")
    parts = []
    for group in groups:
        if data_dir is not None:
            sub = read_frames(data_dir, feature_set, group if len(groups) > 1 else None)
        else:
            sub = {k: f[f["node"].isin(set(group))] for k, f in frames.items()} if len(groups) > 1 else frames
        parts.append(feature_rows({k: f for k, f in sub.items() if len(f)}, ticks, feature_set, returns))
        step()
    return _finish(parts, feature_set, peer_groups)


def _returns(data_dir: str | Path | None, events: pd.DataFrame | None) -> pd.DataFrame | None:
    """The return events of ``events``, or of the dataset's node-event table."""
    if events is None and data_dir is not None:
        events = read_events(data_dir)
    return return_times(events) if events is not None else None


def _partition(
    data_dir: str, nodes: list[str], ticks: np.ndarray, fs: FeatureSet, returns: pd.DataFrame | None
) -> pd.DataFrame:
    return feature_rows(read_frames(data_dir, fs, nodes), ticks, fs, returns)


def compute_features_dask(
    data_dir: str | Path,
    client_or_address: Any,
    *,
    feature_set: FeatureSet = DEFAULT_FEATURE_SET,
    cadence_ms: int = 60_000,
    start_ms: int | None = None,
    end_ms: int | None = None,
    progress: bool = False,
    nodes_per_group: int | None = None,
    peer_groups: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """:func:`compute_features` on a ``dask.distributed`` cluster: one task per group of nodes.

    Each worker reads only its nodes' rows from the parquet parts (so the dataset never has to
    fit on one machine); peer features are computed on the gathered table. Same result as the
    pandas engine, row for row. ``client_or_address``: a ``distributed.Client`` or a scheduler
    address (a client is then opened and closed here).
    """
    from distributed import Client, as_completed

    ticks, groups = _plan(data_dir, {}, feature_set, cadence_ms, start_ms, end_ms, nodes_per_group)
    returns = _returns(data_dir, None)
    client = client_or_address if isinstance(client_or_address, Client) else Client(client_or_address)
    try:
        futures = [
            client.submit(_partition, str(data_dir), g, ticks, feature_set, returns, pure=False)
            for g in groups
        ]
        step = _progress(progress, len(futures), "features (dask)")
        parts = []
        for fut in as_completed(futures):
            parts.append(fut.result())
            step()
        return _finish(parts, feature_set, peer_groups)
    finally:
        if client is not client_or_address:
            client.close()
