"""Raw records -> per-node buckets of sufficient statistics: the first step of both engines.

:func:`bucketize` is the only place raw telemetry is read. The batch engine calls it once on
all records; the online engine calls it on each run of buckets it finalises, carrying the last
counter value of every GPU and port (:class:`Carry`) from one call to the next, so both see
the same bucket values. Rules, identical in both engines:

- duplicates (same node, gpu, ts for GPU samples; node, ts, gpu, xid for Xids; node, port,
  ts for links) keep the last one received;
- a counter's increase is computed per GPU (per port for links) on ts-sorted samples where the
  field is present: ``v - prev`` if ``v >= prev``, else ``v`` (a reset counts from zero); the
  first sample ever seen of a GPU has no increase. The increase lands in the later sample's bucket;
- within a bucket, samples are ordered by (ts, gpu): ``last`` is the newest present value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from features.kernels import empty_value
from features.spec import FeatureSet, Stat

__all__ = ["BucketTable", "Carry", "bucketize", "gpu_columns", "gpu_counters", "link_columns"]

_KEY_SHIFT: Final = np.int64(1 << 32)
_COUNTERS_AT_ONCE: Final = 4
Columns = Mapping[str, np.ndarray]


@dataclass
class BucketTable:
    """Buckets with data, sorted by (node, bucket); ``values[:, j]`` is ``feature_set.stats[j]``."""

    node: np.ndarray
    bucket: np.ndarray
    values: np.ndarray


@dataclass
class Carry:
    """Last seen value of each counter per (node, gpu) and (node, port); NaN = never seen."""

    gpu: np.ndarray = field(default_factory=lambda: np.empty((0, 0, 0)))
    link: np.ndarray = field(default_factory=lambda: np.empty((0, 0, 0)))


def gpu_counters(fs: FeatureSet) -> tuple[str, ...]:
    """GPU counters whose increases the set reads: the columns of ``Carry.gpu``."""
    return tuple(
        dict.fromkeys(s.field for s in fs.stats if s.source == "gpu" and s.kind in ("inc", "incgpus"))
    )


def gpu_columns(fs: FeatureSet) -> tuple[str, ...]:
    """GPU fields the set reads, in stat order."""
    return tuple(dict.fromkeys(s.field for s in fs.stats if s.source == "gpu"))


def link_columns(fs: FeatureSet) -> tuple[str, ...]:
    """Link counters the set reads (``state`` excluded)."""
    return tuple(dict.fromkeys(s.field for s in fs.stats if s.source == "link" and s.field != "state"))


def _grow(a: np.ndarray, n0: int, n1: int, n2: int) -> np.ndarray:
    if a.shape[0] >= n0 and a.shape[1] >= n1 and a.shape[2] == n2:
        return a
    out = np.full((max(n0, a.shape[0]), max(n1, a.shape[1]), n2), np.nan)
    if a.size:
        out[: a.shape[0], : a.shape[1]] = a
    return out


def _dedup_last(keys: list[np.ndarray]) -> np.ndarray:
    """Order sorting rows by ``keys`` (first = primary), keeping the last of equal rows."""
    order = np.lexsort(keys[::-1])  # stable: equal rows keep their arrival order
    same = np.ones(len(order), dtype=bool)
    for k in keys:
        ks = k[order]
        same[:-1] &= ks[1:] == ks[:-1]
    same[-1] = False
    return order[~same]


@dataclass
class _Runs:
    """Rows regrouped by (node, member), ts order kept: the sequences counters difference along."""

    order: np.ndarray
    node: np.ndarray
    member: np.ndarray
    start: np.ndarray  # bool: first row of its (node, member)
    group_start: np.ndarray  # index of that first row, per row
    end: np.ndarray  # indices of each group's last row

    @classmethod
    def of(cls, node: np.ndarray, member: np.ndarray) -> _Runs:
        order = np.argsort(node * np.int64(1 << 20) + member, kind="stable")
        gn, gm = node[order], member[order]
        start = np.r_[True, (gn[1:] != gn[:-1]) | (gm[1:] != gm[:-1])]
        group_start = np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))
        return cls(order, gn, gm, start, group_start, np.flatnonzero(np.r_[start[1:], True]))


def _increases(vals: np.ndarray, runs: _Runs, carry: np.ndarray) -> np.ndarray:
    """Reset-aware increases of counters ``vals`` (counters, rows) per (node, member).

    Rows come in ts order within each (node, member). A sample's previous value is the last
    present one of the same member (or ``carry[node, member]``, NaN = none), which is updated
    in place with the last present values.
    """
    c, n = vals.shape
    if not n or not c:
        return np.zeros((c, n))
    order, gn, gm, start, group_start, end = (
        runs.order,
        runs.node,
        runs.member,
        runs.start,
        runs.group_start,
        runs.end,
    )
    present = ~np.isnan(vals).all(axis=1)
    if not present.all():  # counters no row reports (the GPU lacks them): no increase, carry kept
        out = np.zeros((c, n))
        if present.any():
            sub = carry[:, :, present]  # a copy (boolean index): written back below
            out[present] = _increases(vals[present], runs, sub)
            carry[:, :, present] = sub
        return out
    v = vals[:, order]
    rows = np.arange(n)
    valid = ~np.isnan(v)
    if valid.all():  # fast path: the previous present value is the previous row
        prev = np.empty_like(v)
        prev[:, 1:] = v[:, :-1]
        prev[:, start] = carry[gn[start], gm[start]].T
        carry[gn[end], gm[end]] = v[:, end].T
    else:
        last_valid = np.maximum.accumulate(np.where(valid, rows, -1), axis=1)
        prev_idx = np.empty_like(last_valid)
        prev_idx[:, 0] = -1
        prev_idx[:, 1:] = last_valid[:, :-1]
        inside = prev_idx >= group_start
        prev = np.where(inside, np.take_along_axis(v, np.maximum(prev_idx, 0), axis=1), carry[gn, gm].T)
        lv = last_valid[:, end]
        last = np.take_along_axis(v, np.maximum(lv, 0), axis=1)
        carry[gn[end], gm[end]] = np.where(lv >= group_start[end], last, carry[gn[end], gm[end]].T).T
    with np.errstate(invalid="ignore"):
        d = np.where(valid & ~np.isnan(prev), np.where(v >= prev, v - prev, v), 0.0)
    out = np.empty_like(d)
    out[:, order] = d
    return out


def _distinct_per_segment(seg: np.ndarray, member: np.ndarray, mask: np.ndarray, nseg: int) -> np.ndarray:
    """Number of distinct ``member`` values per segment among rows where ``mask``."""
    pairs = np.unique(seg[mask] * np.int64(1 << 20) + member[mask])
    return np.bincount(pairs // (1 << 20), minlength=nseg).astype(np.float64)


def _segments(node: np.ndarray, bucket: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start index, key and id of each run of equal (node, bucket) in sorted rows."""
    key = node * _KEY_SHIFT + bucket
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.empty(0, np.int64)
    seg = np.cumsum(np.r_[False, key[1:] != key[:-1]]) if len(key) else np.empty(0, np.int64)
    return starts, key[starts], seg


def _gpu_part(fs: FeatureSet, cols: Columns, carry: Carry, stats: list[Stat]) -> tuple[np.ndarray, dict]:
    node, ts, gpu = cols["node"], cols["ts"], cols["gpu"]
    keep = _dedup_last([node, ts, gpu])
    node, ts, gpu = node[keep], ts[keep], gpu[keep]
    bucket = ts // fs.bucket_ms
    starts, keys, seg = _segments(node, bucket)
    out: dict[Stat, np.ndarray] = {Stat("any", "records", "records"): np.diff(np.r_[starts, len(ts)])}
    counters = list(gpu_counters(fs))
    inc = np.zeros((len(counters), len(ts)))
    if counters and len(ts):
        carry.gpu = _grow(carry.gpu, int(node.max()) + 1, int(gpu.max()) + 1, len(counters))
        runs = _Runs.of(node, gpu)
        for i in range(0, len(counters), _COUNTERS_AT_ONCE):  # bounded temporaries on big batches
            part = slice(i, i + _COUNTERS_AT_ONCE)
            inc[part] = _increases(
                np.stack([cols[c][keep] for c in counters[part]]), runs, carry.gpu[:, :, part]
            )
    idx = np.arange(len(ts))
    per_gpu = None
    gathered: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s in stats:
        if s.kind in ("inc", "incgpus"):
            v = inc[counters.index(s.field)]
            if s.kind == "inc":
                out[s] = np.add.reduceat(v, starts) if len(ts) else v
                continue
            if per_gpu is None:  # (bucket, gpu) pairs present
                per_gpu = np.unique(seg * np.int64(1 << 20) + gpu, return_inverse=True)
            tot = np.bincount(per_gpu[1], weights=v, minlength=len(per_gpu[0]))
            hit = per_gpu[0][tot > s.threshold] // (1 << 20)
            out[s] = np.bincount(hit, minlength=len(starts)).astype(np.float64)
            continue
        if s.field not in gathered:
            gathered[s.field] = (cols[s.field][keep], ~np.isnan(cols[s.field][keep]))
        v, valid = gathered[s.field]
        if not len(ts):
            out[s] = v
        elif s.kind == "n":
            out[s] = np.add.reduceat(valid.astype(np.float64), starts)
        elif s.kind == "sum":
            out[s] = np.add.reduceat(np.where(valid, v, 0.0), starts)
        elif s.kind == "sumsq":
            out[s] = np.add.reduceat(np.where(valid, v * v, 0.0), starts)
        elif s.kind == "max":
            out[s] = np.maximum.reduceat(np.where(valid, v, -np.inf), starts)
        elif s.kind == "min":
            out[s] = np.minimum.reduceat(np.where(valid, v, np.inf), starts)
        elif s.kind == "last":
            m = np.maximum.reduceat(np.where(valid, idx, -1), starts)
            out[s] = np.where(m >= 0, v[np.maximum(m, 0)], np.nan)
        elif s.kind == "above":
            out[s] = _distinct_per_segment(seg, gpu, valid & (v > s.threshold), len(starts))
        else:
            raise ValueError(f"unknown GPU statistic {s.kind!r}")
    return keys, out


def _xid_part(fs: FeatureSet, cols: Columns, stats: list[Stat]) -> tuple[np.ndarray, dict]:
    node, ts, gpu, xid = cols["node"], cols["ts"], cols["gpu"], cols["xid"]
    keep = _dedup_last([node, ts, gpu, xid])
    node, ts, xid, count = node[keep], ts[keep], xid[keep], cols["count"][keep].astype(np.float64)
    starts, keys, _ = _segments(node, ts // fs.bucket_ms)
    out: dict[Stat, np.ndarray] = {Stat("any", "records", "records"): np.diff(np.r_[starts, len(ts)])}
    names = fs.xid_class_names
    codes = np.array([c for cs in fs.xid_classes.values() for c in cs], dtype=np.int64)
    classes = np.array([i for i, cs in enumerate(fs.xid_classes.values()) for _ in cs], dtype=np.int64)
    order = np.argsort(codes)
    pos = np.clip(np.searchsorted(codes[order], xid), 0, max(len(codes) - 1, 0))
    found = codes[order][pos] == xid if len(codes) else np.zeros(len(xid), dtype=bool)
    cls = np.where(found, classes[order][pos] if len(codes) else 0, len(names) - 1)
    for s in stats:
        mine = cls == names.index(s.field)
        if not len(ts):
            out[s] = np.zeros(0)
        elif s.kind == "count":
            out[s] = np.add.reduceat(np.where(mine, count, 0.0), starts)
        else:
            out[s] = np.maximum.reduceat(np.where(mine, ts.astype(np.float64), -np.inf), starts)
    return keys, out


def _link_part(fs: FeatureSet, cols: Columns, carry: Carry, stats: list[Stat]) -> tuple[np.ndarray, dict]:
    node, ts, port = cols["node"], cols["ts"], cols["port"]
    keep = _dedup_last([node, ts, port])
    node, ts, port = node[keep], ts[keep], port[keep]
    starts, keys, seg = _segments(node, ts // fs.bucket_ms)
    out: dict[Stat, np.ndarray] = {Stat("any", "records", "records"): np.diff(np.r_[starts, len(ts)])}
    names = list(link_columns(fs))
    inc = np.zeros((len(names), len(ts)))
    if names and len(ts):
        carry.link = _grow(carry.link, int(node.max()) + 1, int(port.max()) + 1, len(names))
        inc = _increases(np.stack([cols[c][keep] for c in names]), _Runs.of(node, port), carry.link)
    for s in stats:
        if not len(ts):
            out[s] = np.zeros(0)
        elif s.kind == "down":
            out[s] = _distinct_per_segment(seg, port, cols["down"][keep] > 0, len(starts))
        else:
            out[s] = np.add.reduceat(inc[names.index(s.field)], starts)
    return keys, out


def bucketize(
    fs: FeatureSet, gpu: Columns | None, xid: Columns | None, link: Columns | None, carry: Carry
) -> BucketTable:
    """Bucket statistics of the given records; updates ``carry`` in place.

    Inputs are numeric column dicts with int node codes (see :mod:`features.frames`). Records
    are processed as one set: call it once per run of finalised buckets, in time order.
    """
    stats = fs.stats
    parts = []
    by_source = {src: [s for s in stats if s.source == src] for src in ("gpu", "xid", "link")}
    if gpu is not None:
        parts.append(_gpu_part(fs, gpu, carry, by_source["gpu"]))
    if xid is not None:
        parts.append(_xid_part(fs, xid, by_source["xid"]))
    if link is not None:
        parts.append(_link_part(fs, link, carry, by_source["link"]))
    all_keys = np.unique(np.concatenate([k for k, _ in parts])) if parts else np.empty(0, np.int64)
    values = np.empty((len(all_keys), len(stats)))
    for j, s in enumerate(stats):
        values[:, j] = empty_value(s)
    rec = fs.stat_index[fs.records_stat]
    values[:, rec] = 0.0
    for keys, out in parts:
        rows = np.searchsorted(all_keys, keys)
        for s, v in out.items():
            j = fs.stat_index[s]
            if s == fs.records_stat:
                values[rows, j] += v
            else:
                values[rows, j] = v
    return BucketTable(all_keys // _KEY_SHIFT, all_keys % _KEY_SHIFT, values)
