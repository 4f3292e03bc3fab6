"""Raw records -> per-node buckets of sufficient statistics: the first step of both engines.

:class:`PartialBuckets` is the only place raw telemetry is read. It *folds* records into bucket
statistics, carrying the last counter value of every GPU and port (:class:`Carry`). Folding
more records later gives, bit for bit, the statistics one fold of all of them would give, as
long as every later record is newer than everything already folded of its node and kind
(:meth:`PartialBuckets.follows`). The batch engine folds all records at once
(:func:`bucketize`); the online engine keeps the still-open buckets' statistics current by
folding records in as they arrive, and when buckets close, keeps their statistics and only moves
the counter carry past their records (:func:`carry_past`). Rules, identical in both engines:

- duplicates (same node, gpu, ts for GPU samples; node, ts, gpu, xid for Xids; node, port,
  ts for links) keep the last one received;
- a counter's increase is computed per GPU (per port for links) on ts-sorted samples where the
  field is present: ``v - prev`` if ``v >= prev``, else ``v`` (a reset counts from zero); the
  first sample ever seen of a GPU has no increase. The increase lands in the later sample's bucket;
- within a bucket, samples are ordered by (ts, gpu): ``last`` is the newest present value, and
  float sums (``sum``, ``sumsq``) add the samples one at a time in that order, so a later fold
  continues a sum exactly where the previous one stopped. Integer-valued statistics (counts,
  increases) are exact in any order, extremes are order-free, and the distinct-member counts
  (``above``, ``incgpus``, ``down``) count from a total kept per (bucket, GPU or port).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from foreshock.features.kernels import empty_value
from foreshock.features.spec import FeatureSet, Stat

__all__ = [
    "BucketTable",
    "Carry",
    "PartialBuckets",
    "bucketize",
    "carry_past",
    "counter_increases",
    "gpu_columns",
    "gpu_counters",
    "link_columns",
]

_KEY_SHIFT: Final = np.int64(1 << 32)
_MEMBER_SHIFT: Final = np.int64(1 << 20)
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
        return cls.grouped(order, node[order], member[order])

    @classmethod
    def grouped(cls, order: np.ndarray, gn: np.ndarray, gm: np.ndarray) -> _Runs:
        """Runs of the rows ``order``, an order that already groups them by (node, member);
        ``gn``, ``gm``: the rows' nodes and members in that order."""
        start = np.r_[True, (gn[1:] != gn[:-1]) | (gm[1:] != gm[:-1])]
        group_start = np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))
        return cls(order, gn, gm, start, group_start, np.flatnonzero(np.r_[start[1:], True]))


def counter_increases(
    vals: np.ndarray, node: np.ndarray, member: np.ndarray, carry: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Reset-aware increases (see the module docstring) of counters ``vals`` (counters, rows) of
    samples in ts order, per (``node``, ``member``) (small non-negative ints: node codes, GPU or
    port index). ``carry`` (nodes, members, counters) holds each member's last present value,
    NaN = never seen; returns the increases and the carry, grown to fit and updated."""
    if not len(node):
        return np.zeros(vals.shape), carry
    carry = _grow(carry, int(node.max()) + 1, int(member.max()) + 1, vals.shape[0])
    return _increases(vals, _Runs.of(node, member), carry), carry


def _increases(vals: np.ndarray, runs: _Runs, carry: np.ndarray) -> np.ndarray:
    """Reset-aware increases of counters ``vals`` (counters, rows) per (node, member).

    Rows come in ts order within each (node, member). A sample's previous value is the last
    present one of the same member (or ``carry[node, member]``, NaN = none), which is updated
    in place with the last present values.
    """
    c, n = vals.shape
    if not n or not c:
        return np.zeros((c, n))
    order, gn, gm, start, group_start = runs.order, runs.node, runs.member, runs.start, runs.group_start
    present = ~np.isnan(vals).all(axis=1)
    if not present.all():  # counters no row reports (the GPU lacks them): no increase, carry kept
        out = np.zeros((c, n))
        if present.any():
            sub = carry[:, :, present]  # a copy (boolean index): written back below
            out[present] = _increases(vals[present], runs, sub)
            carry[:, :, present] = sub
        return out
    v = vals[:, order]
    valid = ~np.isnan(v)
    if valid.all():  # fast path: the previous present value is the previous row
        prev = np.empty_like(v)
        prev[:, 1:] = v[:, :-1]
        prev[:, start] = carry[gn[start], gm[start]].T
        _keep_last(vals, runs, carry)
    else:
        last_valid = np.maximum.accumulate(np.where(valid, np.arange(n), -1), axis=1)
        prev_idx = np.empty_like(last_valid)
        prev_idx[:, 0] = -1
        prev_idx[:, 1:] = last_valid[:, :-1]
        inside = prev_idx >= group_start
        prev = np.where(inside, np.take_along_axis(v, np.maximum(prev_idx, 0), axis=1), carry[gn, gm].T)
        _keep_last(vals, runs, carry, last_valid)
    with np.errstate(invalid="ignore"):
        d = np.where(valid & ~np.isnan(prev), np.where(v >= prev, v - prev, v), 0.0)
    out = np.empty_like(d)
    out[:, order] = d
    return out


def _keep_last(
    vals: np.ndarray, runs: _Runs, carry: np.ndarray, last_valid: np.ndarray | None = None
) -> None:
    """Leave in ``carry`` each (node, member)'s last present value of counters ``vals`` (counters,
    rows; ``runs.order`` puts the rows in run order); one with none keeps its carry.
    ``last_valid``: per row in run order, the run-order index of the last present value at or
    before it (-1 for none), when the caller has it."""
    gn, gm, end = runs.node[runs.end], runs.member[runs.end], runs.end
    if last_valid is None:
        if not np.isnan(vals).any():
            carry[gn, gm] = vals[:, runs.order[end]].T
            return
        valid = ~np.isnan(vals[:, runs.order])
        last_valid = np.maximum.accumulate(np.where(valid, np.arange(len(runs.order)), -1), axis=1)
    lv = last_valid[:, end]
    last = np.take_along_axis(vals, runs.order[np.maximum(lv, 0)], axis=1)
    carry[gn, gm] = np.where(lv >= runs.group_start[end], last, carry[gn, gm].T).T


def carry_past(
    fs: FeatureSet, gpu: Sequence[Columns], link: Sequence[Columns], carry: Carry
) -> None:
    """Move ``carry`` past records, as folding them would, without their statistics.

    For records whose statistics are already known: the online engine's open buckets hold those
    of the records it finalises, and only the counters' last values are left to carry on. Records
    come as chunks of columns, of which only the ones read here are joined. Rows are deduplicated
    as a fold does them (the last one received of a sample wins), then each GPU's (port's) last
    present value of each counter, in ts order, becomes its carry.
    """
    sources = (("gpu", gpu, "gpu", gpu_counters(fs)), ("link", link, "port", link_columns(fs)))
    for kind, chunks, member, names in sources:
        if not chunks or not names:
            continue
        cols = {k: np.concatenate([c[k] for c in chunks]) for k in ("node", "ts", member, *names)}
        node, m = cols["node"], cols[member]
        keep = _dedup_last([node, m, cols["ts"]])  # grouped by (node, member), in ts order
        runs = _Runs.grouped(keep, node[keep], m[keep])
        held = _grow(getattr(carry, kind), int(node.max()) + 1, int(m.max()) + 1, len(names))
        for i, name in enumerate(names):
            _keep_last(cols[name][None, :], runs, held[:, :, i : i + 1])
        setattr(carry, kind, held)


def _segments(node: np.ndarray, bucket: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start index, key and id of each run of equal (node, bucket) in sorted rows."""
    key = node * _KEY_SHIFT + bucket
    change = key[1:] != key[:-1]
    return np.flatnonzero(np.r_[True, change]), key[np.r_[True, change]], np.cumsum(np.r_[False, change])


@dataclass
class _Part:
    """One source's records of one fold, reduced as far as they can be without what was folded
    before: per segment (one (node, bucket)) where that combines by a plain rule, per row where
    it cannot (float sums go on row by row; distinct members need their (segment, member) pairs).
    Rows are deduplicated and sorted by (node, ts, member)."""

    keys: np.ndarray  # node * _KEY_SHIFT + bucket of each segment, ascending
    starts: np.ndarray  # first row of each segment
    seg: np.ndarray  # segment of each row
    newest: tuple[np.ndarray, np.ndarray]  # the nodes, and each one's newest ts
    reduced: dict[Stat, np.ndarray] = field(default_factory=dict)  # per segment, see _COMBINE
    terms: dict[Stat, np.ndarray] = field(default_factory=dict)  # per row, float-sum terms
    members: dict[Stat, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # ^ per row that counts: (segment, member, weight), see PartialBuckets._count_members

    @classmethod
    def of(cls, fs: FeatureSet, node: np.ndarray, ts: np.ndarray) -> _Part:
        starts, keys, seg = _segments(node, ts // fs.bucket_ms)
        last = np.flatnonzero(np.r_[node[1:] != node[:-1], True])
        part = cls(keys, starts, seg, (node[last], ts[last]))
        part.reduced[fs.records_stat] = np.diff(np.r_[starts, len(ts)]).astype(np.float64)
        return part

    def count_distinct(self, s: Stat, mask: np.ndarray, member: np.ndarray) -> None:
        """``s`` counts the distinct members of the rows in ``mask``."""
        self.members[s] = (self.seg[mask], member[mask], np.ones(int(mask.sum())))


def _gpu_part(fs: FeatureSet, cols: Columns, carry: Carry, stats: list[Stat]) -> _Part:
    node, ts, gpu = cols["node"], cols["ts"], cols["gpu"]
    keep = _dedup_last([node, ts, gpu])
    node, ts, gpu = node[keep], ts[keep], gpu[keep]
    part = _Part.of(fs, node, ts)
    starts = part.starts
    counters = list(gpu_counters(fs))
    inc = np.zeros((len(counters), len(ts)))
    if counters:
        carry.gpu = _grow(carry.gpu, int(node.max()) + 1, int(gpu.max()) + 1, len(counters))
        runs = _Runs.of(node, gpu)
        for i in range(0, len(counters), _COUNTERS_AT_ONCE):  # bounded temporaries on big batches
            chunk = slice(i, i + _COUNTERS_AT_ONCE)
            inc[chunk] = _increases(
                np.stack([cols[c][keep] for c in counters[chunk]]), runs, carry.gpu[:, :, chunk]
            )
    idx = np.arange(len(ts))
    gathered: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s in stats:
        if s.kind in ("inc", "incgpus"):
            v = inc[counters.index(s.field)]
            if s.kind == "inc":
                part.reduced[s] = np.add.reduceat(v, starts)
            else:
                part.members[s] = (part.seg, gpu, v)
            continue
        if s.field not in gathered:
            gathered[s.field] = (cols[s.field][keep], ~np.isnan(cols[s.field][keep]))
        v, valid = gathered[s.field]
        if s.kind == "n":
            part.reduced[s] = np.add.reduceat(valid.astype(np.float64), starts)
        elif s.kind == "sum":
            part.terms[s] = np.where(valid, v, 0.0)
        elif s.kind == "sumsq":
            part.terms[s] = np.where(valid, v * v, 0.0)
        elif s.kind == "max":
            part.reduced[s] = np.maximum.reduceat(np.where(valid, v, -np.inf), starts)
        elif s.kind == "min":
            part.reduced[s] = np.minimum.reduceat(np.where(valid, v, np.inf), starts)
        elif s.kind == "last":
            m = np.maximum.reduceat(np.where(valid, idx, -1), starts)
            part.reduced[s] = np.where(m >= 0, v[np.maximum(m, 0)], np.nan)
        elif s.kind == "above":
            part.count_distinct(s, valid & (v > s.threshold), gpu)
        else:
            raise ValueError(f"unknown GPU statistic {s.kind!r}")
    return part


def _xid_part(fs: FeatureSet, cols: Columns, stats: list[Stat]) -> _Part:
    node, ts, gpu, xid = cols["node"], cols["ts"], cols["gpu"], cols["xid"]
    keep = _dedup_last([node, ts, gpu, xid])
    node, ts, xid, count = node[keep], ts[keep], xid[keep], cols["count"][keep].astype(np.float64)
    part = _Part.of(fs, node, ts)
    names = fs.xid_class_names
    codes = np.array([c for cs in fs.xid_classes.values() for c in cs], dtype=np.int64)
    classes = np.array([i for i, cs in enumerate(fs.xid_classes.values()) for _ in cs], dtype=np.int64)
    order = np.argsort(codes)
    pos = np.clip(np.searchsorted(codes[order], xid), 0, max(len(codes) - 1, 0))
    found = codes[order][pos] == xid if len(codes) else np.zeros(len(xid), dtype=bool)
    cls = np.where(found, classes[order][pos] if len(codes) else 0, len(names) - 1)
    for s in stats:
        mine = cls == names.index(s.field)
        if s.kind == "count":
            part.reduced[s] = np.add.reduceat(np.where(mine, count, 0.0), part.starts)
        else:
            part.reduced[s] = np.maximum.reduceat(np.where(mine, ts.astype(np.float64), -np.inf), part.starts)
    return part


def _link_part(fs: FeatureSet, cols: Columns, carry: Carry, stats: list[Stat]) -> _Part:
    node, ts, port = cols["node"], cols["ts"], cols["port"]
    keep = _dedup_last([node, ts, port])
    node, ts, port = node[keep], ts[keep], port[keep]
    part = _Part.of(fs, node, ts)
    names = list(link_columns(fs))
    inc = np.zeros((len(names), len(ts)))
    if names:
        carry.link = _grow(carry.link, int(node.max()) + 1, int(port.max()) + 1, len(names))
        inc = _increases(np.stack([cols[c][keep] for c in names]), _Runs.of(node, port), carry.link)
    for s in stats:
        if s.kind == "down":
            part.count_distinct(s, cols["down"][keep] > 0, port)
        else:
            part.reduced[s] = np.add.reduceat(inc[names.index(s.field)], part.starts)
    return part


def _newer_present(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(new), old, new)


_COMBINE: Final = {
    **dict.fromkeys(("records", "n", "inc", "count"), np.add),  # integer-valued: exact in any order
    **dict.fromkeys(("max", "last_ts"), np.maximum),
    "min": np.minimum,
    "last": _newer_present,  # the later fold's rows are the newer ones
}
"""How a statistic reduced over a fold's rows combines with its value from earlier folds."""
_KINDS: Final = ("gpu", "xid", "link")  # foreshock.features.frames.KINDS (that module imports this one)
_NEVER: Final = np.iinfo(np.int64).min


class PartialBuckets:
    """Statistics of the buckets of every record folded in so far; more records fold in exactly.

    Holds, besides the statistics, what a later fold needs to continue them: the counter carry
    (updated in place: the caller's :class:`Carry`), each node's newest ts per kind (for
    :meth:`follows`), and per distinct-member statistic the total of each (bucket, member).
    """

    def __init__(self, fs: FeatureSet, carry: Carry):
        self.fs = fs
        self.carry = carry
        self._empty = np.array([empty_value(s) for s in fs.stats])
        self._keys = np.empty(0, np.int64)  # node * _KEY_SHIFT + bucket, ascending
        self._values = np.empty((len(fs.stats), 0))  # (stats, keys): a statistic's values adjoin
        self._members: dict[Stat, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (key, member, total)
        self._newest = {kind: np.empty(0, np.int64) for kind in _KINDS}

    @property
    def nbytes(self) -> int:
        """Bytes held: the statistics, the member totals and each node's newest ts."""
        members = sum(a.nbytes for arrays in self._members.values() for a in arrays)
        newest = sum(a.nbytes for a in self._newest.values())
        return int(self._keys.nbytes + self._values.nbytes + members + newest)

    @property
    def table(self) -> BucketTable:
        """The statistics, as one :func:`bucketize` of every folded record would return them."""
        return BucketTable(self._keys // _KEY_SHIFT, self._keys % _KEY_SHIFT, self._values.T)

    def follows(self, gpu: Columns | None, xid: Columns | None, link: Columns | None) -> bool:
        """Whether every record is newer than each folded record of its node and kind.

        Only then is folding them in the same as folding everything at once: within a bucket
        they come after the folded rows in (ts, member) order (float sums continue, ``last``
        is theirs), each counter's increase continues from the carry, and no duplicate spans
        two folds. A node's records arrive in order on its log, so this holds on a live stream.
        """
        for kind, cols in zip(_KINDS, (gpu, xid, link), strict=True):
            if cols is None or not len(cols["ts"]):
                continue
            newest, node = self._newest[kind], cols["node"]
            known = node < len(newest)
            if (cols["ts"][known] <= newest[node[known]]).any():
                return False
        return True

    def fold(self, gpu: Columns | None, xid: Columns | None, link: Columns | None) -> None:
        """Fold in records: numeric column dicts with int node codes (see :mod:`foreshock.features.frames`),
        one per kind or None. They must :meth:`follows`; within one fold, order does not matter."""
        by_source = {src: [s for s in self.fs.stats if s.source == src] for src in _KINDS}
        parts = []
        for kind, cols in zip(_KINDS, (gpu, xid, link), strict=True):
            if cols is None or not len(cols["ts"]):
                continue
            if kind == "gpu":
                parts.append((kind, _gpu_part(self.fs, cols, self.carry, by_source[kind])))
            elif kind == "xid":
                parts.append((kind, _xid_part(self.fs, cols, by_source[kind])))
            else:
                parts.append((kind, _link_part(self.fs, cols, self.carry, by_source[kind])))
        if not parts:
            return
        keys = np.unique(np.concatenate([self._keys, *(p.keys for _, p in parts)]))
        values = np.repeat(self._empty[:, None], len(keys), axis=1)
        values[:, np.searchsorted(keys, self._keys)] = self._values
        index = self.fs.stat_index
        for kind, p in parts:
            rows = np.searchsorted(keys, p.keys)
            for s, v in p.reduced.items():
                values[index[s], rows] = _COMBINE[s.kind](values[index[s], rows], v)
            row_of = rows[p.seg]
            for s, t in p.terms.items():  # one at a time, in row order: see the module docstring
                np.add.at(values[index[s]], row_of, t)
            for s, (seg, member, weight) in p.members.items():
                values[index[s]] = self._count_members(s, keys, rows[seg], member, weight)
            nodes, ts = p.newest
            if len(self._newest[kind]) <= nodes.max():
                grown = np.full(int(nodes.max()) + 1, _NEVER)
                grown[: len(self._newest[kind])] = self._newest[kind]
                self._newest[kind] = grown
            self._newest[kind][nodes] = np.maximum(self._newest[kind][nodes], ts)
        self._keys, self._values = keys, values

    def _count_members(
        self, s: Stat, keys: np.ndarray, row: np.ndarray, member: np.ndarray, weight: np.ndarray
    ) -> np.ndarray:
        """Add the rows' weights to the (bucket, member) totals of ``s``; returns its value per key
        of ``keys``: the members whose total exceeds the threshold (``incgpus``), or that have
        any row (``above``, ``down``: found by hashing, cheaper than the sort a total needs)."""
        if s in self._members:
            key0, member0, total0 = self._members[s]
            row = np.r_[np.searchsorted(keys, key0), row]
            member, weight = np.r_[member0, member], np.r_[total0, weight]
        codes = row * _MEMBER_SHIFT + member
        if s.kind == "incgpus":
            pairs, inverse = np.unique(codes, return_inverse=True)
            total = np.bincount(inverse, weights=weight, minlength=len(pairs))
            counted = pairs[total > s.threshold]
        else:
            pairs = counted = np.unique(codes)
            total = np.ones(len(pairs))
        self._members[s] = (keys[pairs // _MEMBER_SHIFT], pairs % _MEMBER_SHIFT, total)
        return np.bincount(counted // _MEMBER_SHIFT, minlength=len(keys)).astype(np.float64)

    def drop_before(self, bucket: int) -> None:
        """Forget the buckets before ``bucket``. The carry and each node's newest ts stay: later
        records continue from everything folded, forgotten or not."""
        keep = self._keys % _KEY_SHIFT >= bucket
        self._keys, self._values = self._keys[keep], self._values[:, keep]
        for s, (key, member, total) in self._members.items():
            kept = key % _KEY_SHIFT >= bucket
            self._members[s] = (key[kept], member[kept], total[kept])


def bucketize(
    fs: FeatureSet, gpu: Columns | None, xid: Columns | None, link: Columns | None, carry: Carry
) -> BucketTable:
    """Bucket statistics of the given records, folded at once; updates ``carry`` in place.

    Inputs are numeric column dicts with int node codes (see :mod:`foreshock.features.frames`). Call it
    once per run of finalised buckets, in time order.
    """
    partial = PartialBuckets(fs, carry)
    partial.fold(gpu, xid, link)
    return partial.table
