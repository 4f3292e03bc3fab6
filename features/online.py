"""The online engine: per-node state updated by micro-batches, features of any node at any moment.

Records wait in a small reorder buffer until the *frontier* passes them: the frontier is the
bucket boundary at or below ``watermark - tolerance_ms`` (watermark = newest ts seen, over all
nodes). Buckets behind the frontier are final: their statistics go into per-node ring buffers
that hold the last ``max window + history`` buckets of each statistic, so memory per node is
bounded. Those statistics are the open buckets' (see below), kept current record by record, and
only the counter carry moves on past the records (:func:`~foreshock.features.buckets.carry_past`);
an engine that keeps no open buckets bucketizes the records at once (the same
:func:`~foreshock.features.buckets.bucketize` the batch engine runs). A record older than the
frontier is *late*: it is counted (:attr:`late_records`) and dropped.

``features_at(t)`` does not change state: it reads the rings, plus the statistics of the
still-open buckets, which are kept on the side (:class:`~foreshock.features.buckets.PartialBuckets`) and
take in each update's records as they come. When every record with ts < floor(t / bucket) *
bucket has arrived (true once the watermark passes t + tolerance, for streams disordered by at
most the tolerance), its row for a node equals the batch engine's row at that tick.

Node events bring no statistics, only where a node's windows start (its last return to service,
:mod:`foreshock.features.returns`): reads cut the windows, so a return event may arrive late and still
count, and the batch row stays the same as long as the event has arrived by the read. The events
the history features read (:mod:`foreshock.features.history`) are kept as they are, for as long
as the longest history window can reach them, and are part of the saved state.

Any ts the contract accepts (0 to 2^53 ms) works, and so does a stream that jumps ahead by more
than the rings hold: see :class:`_Buckets` and :meth:`OnlineFeatureEngine._advance`.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from foreshock.features.buckets import BucketTable, Carry, PartialBuckets, bucketize, carry_past
from foreshock.features.default_set import DEFAULT_FEATURE_SET
from foreshock.features.frames import EVENTS, KINDS, Codes, records_to_frames, to_columns
from foreshock.features.history import EventLog, history_events
from foreshock.features.kernels import (
    AGGREGATIONS,
    add_peer_features,
    empty_value,
    history_values,
    reduce_direct,
)
from foreshock.features.returns import return_times, window_floors
from foreshock.features.spec import FeatureSet, Stat

__all__ = ["FloatSpace", "OnlineFeatureEngine"]

_FORMAT: Final = "foreshock-online-features/2"
_KEY_BUCKETS: Final = 1 << 32
"""Consecutive bucket numbers one :class:`~foreshock.features.buckets.PartialBuckets` can tell apart: it keys
a bucket by ``node * 2**32 + bucket`` (``foreshock.features.buckets._KEY_SHIFT``)."""


def _joined(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """Column chunks of one kind as one set of columns (None for no chunk)."""
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]} if chunks else None


class _Buckets:
    """A :class:`~foreshock.features.buckets.PartialBuckets` numbering buckets from ``origin``, not the epoch.

    Why: numbered from the epoch, a bucket number reaches 2^32 at 2^32 buckets (with one-minute
    buckets at ts 257,698,037,760,000, below the contract's 2^53) and then runs into the next
    node's keys: ``features_at`` read another node's statistics or indexed past the last node.
    Numbered from an origin at or below each record it is given, it holds 2^32 consecutive
    buckets wherever they lie (:meth:`holds`). Bucket numbers and the statistics that are times
    (``last_ts``) are moved by the origin on the way in and out; every one is an integer below
    2^53, so the statistics are bit for bit those of an epoch-numbered fold. The engine uses
    origin 0 (nothing moved, nothing copied) whenever that holds its records: every timestamp
    before the year 10136 with one-minute buckets.
    """

    def __init__(self, fs: FeatureSet, carry: Carry, origin: int):
        self.origin = origin
        self._b = fs.bucket_ms
        self._origin_ms = origin * fs.bucket_ms
        self._times = [j for j, s in enumerate(fs.stats) if s.kind == "last_ts"]
        self._partial = PartialBuckets(fs, carry)

    def _in(self, cols: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        if cols is None or not self._origin_ms:
            return cols
        return {**cols, "ts": cols["ts"] - self._origin_ms}

    def holds(self, *cols: dict[str, np.ndarray] | None) -> bool:
        """Whether every record of ``cols`` lies in the 2^32 buckets from the origin."""
        return all(
            c is None or not len(c["ts"])
            or (int(c["ts"].min()) >= self._origin_ms and int(c["ts"].max()) // self._b - self.origin
                < _KEY_BUCKETS)
            for c in cols
        )

    def follows(self, *cols: dict[str, np.ndarray] | None) -> bool:
        return self._partial.follows(*(self._in(c) for c in cols))

    def fold(self, *cols: dict[str, np.ndarray] | None) -> None:
        """Fold records in; they must :meth:`holds` (and :meth:`follows` after the first fold)."""
        self._partial.fold(*(self._in(c) for c in cols))

    def drop_before(self, bucket: int) -> None:
        self._partial.drop_before(bucket - self.origin)

    @property
    def table(self) -> BucketTable:
        """The statistics, with epoch bucket numbers and epoch times."""
        t = self._partial.table
        if not self.origin:
            return t
        values = t.values
        if self._times and len(values):
            values = values.copy()
            values[:, self._times] += self._origin_ms  # -inf (no Xid) stays -inf
        return BucketTable(t.node, t.bucket + self.origin, values)

    @property
    def nbytes(self) -> int:
        return self._partial.nbytes


class OnlineFeatureEngine:
    """Streaming feature state for many nodes. Not thread-safe: one consumer owns it.

    >>> engine = OnlineFeatureEngine(tolerance_ms=30_000)
    >>> engine.features_at(0).empty
    True
    """

    def __init__(
        self,
        feature_set: FeatureSet = DEFAULT_FEATURE_SET,
        tolerance_ms: int = 60_000,
        history_ms: int = 600_000,
    ):
        if tolerance_ms < 0 or history_ms < 0:
            raise ValueError("tolerance_ms and history_ms must be >= 0")
        if tolerance_ms // feature_set.bucket_ms + 2 >= _KEY_BUCKETS:  # the open buckets span it
            raise ValueError("tolerance_ms must span fewer than 2^32 - 2 buckets")
        self.feature_set = feature_set
        self.tolerance_ms = tolerance_ms
        self.history_ms = history_ms
        self.late_records = 0
        self._nodes = Codes()
        self._ports = Codes()
        self._carry = Carry()
        self._frontier: int | None = None
        self._watermark = -1
        self._pending: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in KINDS}
        # statistics of the open buckets, from the first read on: see _open_buckets
        self._open: _Buckets | None = None
        stats = feature_set.stats
        hist = -(-history_ms // feature_set.bucket_ms)
        lengths = {s: w + hist for s, w in feature_set.stat_windows().items()}
        self._ring_of: dict[Stat, tuple[int, int]] = {}
        by_len: dict[int, list[Stat]] = {}
        for s in stats:
            by_len.setdefault(lengths[s], []).append(s)
        for r, group in by_len.items():
            for i, s in enumerate(group):
                self._ring_of[s] = (r, i)
        # one (stats, nodes, R) array per ring length R; a bucket b lives in slot b % R
        self._fill = {
            r: np.array([empty_value(s) for s in group])[:, None, None] for r, group in by_len.items()
        }
        self._rings = {r: np.broadcast_to(self._fill[r], (len(g), 0, r)).copy() for r, g in by_len.items()}
        # each node's returns to service (node codes, ts) that a window held here may still reach
        self._returns = (np.empty(0, np.int64), np.empty(0, np.int64))
        # the events the history features read, back as far as the longest of them may look
        self._history = EventLog.empty()

    # -- updates -----------------------------------------------------------------------------
    def update(self, records: Any) -> None:
        """Add contract records (GpuSample, XidEvent, LinkSample, NodeEvent; other types are
        ignored).

        The records form one micro-batch: their order inside it does not matter.
        """
        self.update_frames(records_to_frames(records, self.feature_set))

    def update_frame(self, kind: str, frame: pd.DataFrame) -> None:
        """Add one micro-batch of ``kind`` (``gpu``, ``xid``, ``link``, ``events``) in
        dataset-layout columns."""
        self.update_frames({kind: frame})

    def update_frames(self, frames: Mapping[str, pd.DataFrame]) -> None:
        """Add one micro-batch of several kinds at once (order inside it does not matter)."""
        if EVENTS in frames:
            self._add_returns(frames[EVENTS])
        added = {kind: self._add(kind, frame) for kind, frame in frames.items() if kind != EVENTS}
        if self._open is not None:
            fresh = [added.get(kind) for kind in KINDS]
            if self._open.holds(*fresh) and self._open.follows(*fresh):
                self._open.fold(*fresh)
            else:  # inexact, or too far ahead of the origin: fold every pending record at the next read
                self._open = None
        if self._watermark >= 0:
            self._advance((self._watermark - self.tolerance_ms) // self.feature_set.bucket_ms)

    def _add(self, kind: str, frame: pd.DataFrame) -> dict[str, np.ndarray] | None:
        """Buffer a frame's records that are not late; returns their columns (None if none)."""
        if not len(frame):
            return None
        cols = to_columns(kind, frame, self.feature_set, self._nodes, self._ports)
        self._grow(len(self._nodes))
        if self._frontier is not None:
            fresh = cols["ts"] >= self._frontier * self.feature_set.bucket_ms
            if not fresh.all():
                self.late_records += int((~fresh).sum())
                cols = {k: v[fresh] for k, v in cols.items()}
        if not len(cols["ts"]):
            return None
        for column in cols.values():  # replaced, never written to: a snapshot shares them
            column.flags.writeable = False
        self._pending[kind].append(cols)
        self._watermark = max(self._watermark, int(cols["ts"].max()))
        return cols

    def _add_returns(self, events: pd.DataFrame) -> None:
        """Remember the return events among node events, and the events history features read. A
        late one is not dropped: windows are cut and history is counted at read time, so it still
        applies to every read after it arrived."""
        returns = return_times(events)
        if len(returns) and self.feature_set.reset_on_return:
            node = self._nodes.encode(returns["node"])
            self._grow(len(self._nodes))
            self._returns = (
                np.r_[self._returns[0], node],
                np.r_[self._returns[1], returns["ts"].to_numpy(np.int64)],
            )
        history = history_events(events) if self.feature_set.history_plan else None
        if history is not None and len(history):
            node = self._nodes.encode(history["node"])
            self._grow(len(self._nodes))
            self._history = self._history.add(node, history["field"].to_numpy(), history["ts"].to_numpy())

    def _grow(self, n: int) -> None:
        for r, ring in self._rings.items():
            if ring.shape[1] < n:
                cap = max(n, 2 * ring.shape[1], 16)
                new = np.empty((ring.shape[0], cap, r), ring.dtype)  # each page written once
                new[:, : ring.shape[1]] = ring
                new[:, ring.shape[1] :] = self._fill[r]
                self._rings[r] = new

    def _take_pending(self, before: int) -> dict[str, list[dict[str, np.ndarray]]]:
        """Remove and return the pending column chunks of buckets before ``before``, per kind.
        Chunk by chunk, so the rows that stay are copied only where a chunk straddles the cut."""
        out: dict[str, list[dict[str, np.ndarray]]] = {}
        for kind in KINDS:
            picked, rest = [], []
            for c in self._pending[kind]:
                due = c["ts"] // self.feature_set.bucket_ms < before
                if due.all():
                    picked.append(c)
                elif due.any():
                    picked.append({k: v[due] for k, v in c.items()})
                    rest.append({k: v[~due] for k, v in c.items()})
                else:
                    rest.append(c)
            out[kind] = picked
            self._pending[kind] = rest
        return out

    def _open_buckets(self) -> _Buckets:
        """Statistics of the open buckets (the frontier's and after), current with every pending
        record.

        Every read needs them, and at high rates they hold most records (a tolerance's worth):
        rather than bucketing those again at each read, they are kept from the first read on and
        each update folds its records in, which the fold's rules make exact (see
        :mod:`foreshock.features.buckets`). A node's records normally arrive in order; an update with one
        that does not (older than a record of its node already folded, or a duplicate of one)
        discards them instead, and the next read folds every pending record at once. A consumer
        that never reads does not pay for them. They are numbered from 0 while the newest record
        allows, else from the frontier, at or below every pending record (pending records span the
        tolerance, fewer than 2^32 buckets); see :class:`_Buckets`.
        """
        if self._open is None:
            assert self._frontier is not None
            fits = self._watermark // self.feature_set.bucket_ms < _KEY_BUCKETS
            self._open = _Buckets(self.feature_set, copy.deepcopy(self._carry), 0 if fits else self._frontier)
            self._open.fold(*(_joined(self._pending[kind]) for kind in KINDS))
        return self._open

    def _finalised(self, due: dict[str, dict[str, np.ndarray] | None], target: int) -> Iterator[BucketTable]:
        """Bucket tables of the records ``due`` (buckets from the frontier to ``target``), in time
        order: one table, numbered from 0 when that holds them, else from the frontier, and one per
        2^32 buckets (:class:`_Buckets`) when the stream jumped that far. Each continues the
        counter carry from the one before, as one fold would."""
        assert self._frontier is not None
        b, start = self.feature_set.bucket_ms, self._frontier
        spans: list[tuple[int, dict[str, dict[str, np.ndarray] | None]]]
        if target <= _KEY_BUCKETS:
            spans = [(0, due)]
        elif target - start <= _KEY_BUCKETS:
            spans = [(start, due)]
        else:
            span_of = {k: (c["ts"] // b - start) // _KEY_BUCKETS for k, c in due.items() if c is not None}
            spans = [
                (start + int(n) * _KEY_BUCKETS,
                 {k: None if c is None else {f: v[span_of[k] == n] for f, v in c.items()}
                  for k, c in due.items()})
                for n in np.unique(np.concatenate([np.empty(0, np.int64), *span_of.values()]))
            ]
        for origin, cols in spans:
            part = _Buckets(self.feature_set, self._carry, origin)
            part.fold(cols["gpu"], cols["xid"], cols["link"])
            yield part.table

    def _advance(self, target: int) -> None:
        """Finalise every bucket before ``target``."""
        if self._frontier is None:
            firsts = [min(int(c["ts"].min()) for c in chunks) for chunks in self._pending.values() if chunks]
            self._frontier = min(min(firsts) // self.feature_set.bucket_ms, target)
        if target <= self._frontier:
            return
        due = self._take_pending(target)
        if self._open is not None:  # their statistics are known: only the counters' carry moves on
            table = self._open.table
            closed = table.bucket < target
            tables = [BucketTable(table.node[closed], table.bucket[closed], table.values[closed])]
            self._open.drop_before(target)
            carry_past(self.feature_set, due["gpu"], due["link"], self._carry)
        else:
            tables = list(self._finalised({kind: _joined(chunks) for kind, chunks in due.items()}, target))
        for r, ring in self._rings.items():
            if target - self._frontier >= r:
                ring[:] = self._fill[r]
            else:
                ring[:, :, np.arange(self._frontier, target) % r] = self._fill[r]
        stats = self.feature_set.stats
        jumped = target - self._frontier
        for table in tables:
            # After a jump longer than a ring, only its last r buckets belong in it: an older one
            # would land in the slot of a newer bucket and be read as that one.
            held = {r: table.bucket >= target - r for r in self._rings if jumped > r}
            for j, s in enumerate(stats):
                r, i = self._ring_of[s]
                if r in held:
                    keep = held[r]
                    self._rings[r][i, table.node[keep], table.bucket[keep] % r] = table.values[keep, j]
                else:
                    self._rings[r][i, table.node, table.bucket % r] = table.values[:, j]
        self._frontier = target
        # a return no later than the oldest bucket any ring holds can no longer cut a window
        node, ts = self._returns
        reach = -(-ts // self.feature_set.bucket_ms) > target - max(self._rings)
        self._returns = (node[reach], ts[reach])
        # no read reaches further back than history_ms (and a bucket) before the frontier
        oldest_read = (target - 1) * self.feature_set.bucket_ms - self.history_ms
        self._history = self._history.since(oldest_read - self.feature_set.history_reach_ms)

    # -- queries -----------------------------------------------------------------------------
    @property
    def watermark_ms(self) -> int:
        """Newest record timestamp seen (-1 before any record)."""
        return self._watermark

    def nodes(self) -> list[str]:
        """Every node seen so far."""
        return list(self._nodes.names)

    def state_bytes(self) -> int:
        """Bytes of state: rings, counter carries, returns, the reorder buffer and the open buckets'
        statistics."""
        pending = sum(v.nbytes for chunks in self._pending.values() for c in chunks for v in c.values())
        return int(
            sum(r.nbytes for r in self._rings.values())
            + self._carry.gpu.nbytes
            + self._carry.link.nbytes
            + self._returns[0].nbytes
            + self._returns[1].nbytes
            + self._history.nbytes
            + pending
            + (self._open.nbytes if self._open is not None else 0)
        )

    def _window(
        self, s: Stat, w: int, end: int, rows: np.ndarray, open_table: BucketTable, floor: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Buckets [end - w, end) of ``s`` for node codes ``rows`` -> (len(rows), w), oldest first,
        written into ``out`` when given; those before a row's ``floor``
        (:mod:`foreshock.features.returns`) read as empty."""
        r, i = self._ring_of[s]
        frontier = self._frontier if self._frontier is not None else end
        if end - w < frontier - r:
            raise ValueError(f"window of {s.key} before t is no longer held (history_ms too short)")
        idx = np.arange(end - w, end)
        ring = self._rings[r][i]
        ident = len(rows) == len(self._nodes) and bool((rows == np.arange(len(rows))).all())
        first, split = (end - w) % r, min(w, r - (end - w) % r)  # slots: one run, or two when wrapping
        win = np.empty((len(rows), w)) if out is None else out
        for src, lo, hi in ((first, 0, split), (0, split, w)) if split < w else ((first, 0, w),):
            slots = ring[:, src : src + hi - lo]
            if ident:
                win[:, lo:hi] = slots[: len(rows)]
            else:
                np.take(slots, rows, axis=0, out=win[:, lo:hi])
        newer = idx >= frontier
        if newer.any():
            win[:, newer] = self._fill[r][i, 0, 0]
            pos = np.full(len(self._nodes), -1)
            pos[rows] = np.arange(len(rows))
            hit = (open_table.bucket >= end - w) & (open_table.bucket < end) & (pos[open_table.node] >= 0)
            win[pos[open_table.node[hit]], open_table.bucket[hit] - (end - w)] = open_table.values[
                hit, self.feature_set.stat_index[s]
            ]
        cut = np.flatnonzero(floor > end - w)  # rows whose window begins before their floor
        if len(cut):
            win[cut] = np.where(idx[None, :] < floor[cut, None], self._fill[r][i, 0, 0], win[cut])
        return win

    def features_at(
        self,
        ts: int,
        nodes: list[str] | None = None,
        peer_groups: Mapping[str, str] | None = None,
    ) -> pd.DataFrame:
        """Rows (``node``, ``ts``, features...) of live nodes at ``floor(ts / bucket) * bucket``.

        Peer features compare each node with the live nodes of its peer group (its partition,
        :attr:`~foreshock.features.spec.FeatureSet.peer_partitions`; narrowed to its group in
        ``peer_groups``, e.g. node -> job); ``nodes`` then filters the rows. An engine fed one
        partition's records (the risk service's) therefore answers as one fed every partition.
        """
        fs = self.feature_set
        b = fs.bucket_ms
        end = int(ts) // b
        if self._frontier is None or not len(self._nodes):
            return pd.DataFrame(columns=["node", "ts", *fs.names])
        if end > self._frontier:
            open_table = self._open_buckets().table
        else:
            open_table = bucketize(fs, None, None, None, Carry())
        everyone = np.arange(len(self._nodes))
        floor = window_floors(*self._returns, len(self._nodes), np.array([end * b]), b)[:, 0]
        records = self._window(fs.records_stat, fs.live_ms // b, end, everyone, open_table, floor)
        live = reduce_direct("sum", records) > 0
        names = np.asarray(self._nodes.names, dtype=object)
        rows = everyone[live][np.argsort(names[live], kind="stable")]  # node order, as the batch engine
        cache: dict[tuple[Stat, int], np.ndarray] = {}
        scratch = _scratch(len(rows) * sum(w for _, w in fs.plan_windows))

        def window(s: Stat, w: int) -> np.ndarray:
            if (s, w) not in cache:
                used = sum(x.size for x in cache.values())
                out = scratch[used : used + len(rows) * w].reshape(len(rows), w)
                cache[(s, w)] = self._window(s, w, end, rows, open_table, floor[rows], out)
            return cache[(s, w)]

        t = np.full(len(rows), float(end * b))
        values = np.empty((len(rows), len(fs.features)))
        for j, f, w, reductions in fs.plan:
            reduced = [
                reduce_direct(r.op, window(r.stat, w), None if r.aux is None else window(r.aux, w))
                for r in reductions
            ]
            values[:, j] = AGGREGATIONS[f.agg].finalize(reduced, f, t, b)
        if fs.history_plan:
            values[:, [j for j, _ in fs.history_plan]] = history_values(
                fs, self._history, rows, np.full(len(rows), end * b, dtype=np.int64)
            )
        table = pd.DataFrame(values, columns=[f.name for f in fs.features])
        table.insert(0, "node", names[rows])
        table.insert(1, "ts", np.full(len(rows), end * b, dtype=np.int64))
        table = add_peer_features(table, fs, peer_groups)[["node", "ts", *fs.names]]
        if nodes is not None:
            table = table[table["node"].isin(set(nodes))].reset_index(drop=True)
        return table

    # -- persistence -------------------------------------------------------------------------
    def snapshot(self, space: FloatSpace | None = None) -> OnlineFeatureEngine:
        """A copy to :meth:`save` on another thread while this engine goes on, for the price of
        the state updated in place: the rings, the counter carries and the node and port codes.
        The pending records, returns and history are only ever replaced (pending columns are
        read-only), so the copy shares them; the open buckets' statistics, which :meth:`save`
        leaves out, are not copied.

        ``space``: memory the copy's rings are laid in, kept from one snapshot to the next (see
        :class:`FloatSpace`); the copy is then valid until the next snapshot into it."""
        out = copy.copy(self)
        n = len(self._nodes)
        out._nodes, out._ports = copy.deepcopy(self._nodes), copy.deepcopy(self._ports)
        out._carry = Carry(self._carry.gpu.copy(), self._carry.link.copy())
        sizes = {r: ring.shape[0] * n * r for r, ring in self._rings.items()}
        floats = (space or FloatSpace()).take(sum(sizes.values()))
        out._rings = {}
        for r, ring in self._rings.items():
            out._rings[r], floats = floats[: sizes[r]].reshape(ring.shape[0], n, r), floats[sizes[r] :]
            np.copyto(out._rings[r], ring[:, :n])
        out._pending = {kind: list(chunks) for kind, chunks in self._pending.items()}
        out._open = None
        return out

    def save(self, path: str | Path) -> None:
        """Write the whole state to one file of arrays (:func:`_write_arrays`; no pickle)."""
        meta = {
            "format": _FORMAT,
            "feature_set_hash": self.feature_set.hash,
            "tolerance_ms": self.tolerance_ms,
            "history_ms": self.history_ms,
            "frontier": self._frontier,
            "watermark": self._watermark,
            "late_records": self.late_records,
            "rings": sorted(self._rings),
        }
        arrays: dict[str, np.ndarray] = {
            "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            "nodes": np.asarray(self._nodes.names, dtype=str),
            "ports": np.asarray(self._ports.names, dtype=str),
            "carry_gpu": self._carry.gpu,
            "carry_link": self._carry.link,
            "returns_node": self._returns[0],
            "returns_ts": self._returns[1],
            "history_node": self._history.node,
            "history_field": self._history.field,
            "history_ts": self._history.ts,
        }
        n = len(self._nodes)
        for r, ring in self._rings.items():
            arrays[f"ring_{r}"] = ring[:, :n]
        for kind in KINDS:
            chunks = self._pending[kind]
            if chunks:
                for k in chunks[0]:
                    arrays[f"pending_{kind}_{k}"] = np.concatenate([c[k] for c in chunks])
        _write_arrays(path, arrays)

    @classmethod
    def load(cls, path: str | Path, feature_set: FeatureSet = DEFAULT_FEATURE_SET) -> OnlineFeatureEngine:
        """Restore a saved engine; refuses state written for another feature set."""
        data = _read_arrays(path)
        meta = json.loads(data["meta"].tobytes().decode())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: not an online feature state")
        if meta["feature_set_hash"] != feature_set.hash:
            raise ValueError(
                f"{path}: state is for feature set {meta['feature_set_hash'][:12]}, "
                f"not {feature_set.hash[:12]}"
            )
        engine = cls(feature_set, meta["tolerance_ms"], meta["history_ms"])
        engine._frontier, engine._watermark = meta["frontier"], meta["watermark"]
        engine.late_records = meta["late_records"]
        engine._nodes = Codes(data["nodes"].tolist())
        engine._ports = Codes(data["ports"].tolist())
        engine._carry = Carry(data["carry_gpu"], data["carry_link"])
        engine._returns = (data["returns_node"], data["returns_ts"])
        if "history_ts" in data:  # absent from states saved before history features
            engine._history = EventLog.of(data["history_node"], data["history_field"], data["history_ts"])
        engine._grow(len(engine._nodes))
        for r in meta["rings"]:
            saved = data[f"ring_{r}"]
            engine._rings[r][:, : saved.shape[1]] = saved
        for kind in KINDS:
            prefix = f"pending_{kind}_"
            cols = {k[len(prefix) :]: v for k, v in data.items() if k.startswith(prefix)}
            for column in cols.values():
                column.flags.writeable = False
            engine._pending[kind] = [cols] if cols else []
        return engine


class FloatSpace:
    """float64 memory kept from one use to the next: the windows of a read (:meth:`features_at`,
    one space per thread) and the rings of a :meth:`OnlineFeatureEngine.snapshot`.

    Why: both are tens of MiB at a few hundred nodes (a day of minute buckets for each stat that
    looks back a day), and memory allocated fresh each time pays a page fault for every page
    written, which can cost many times the copy itself (on virtual machines most). A space stays
    at the largest size asked of it, the memory such a use takes in any case. What is laid in it
    is valid until the next use: the risk service takes a snapshot of one partition at a time and
    writes it before it takes the next, so one space serves every partition.
    """

    def __init__(self) -> None:
        self._floats = np.empty(0)

    def take(self, size: int) -> np.ndarray:
        """``size`` float64 of the space, grown (and so reallocated) when it holds fewer."""
        if len(self._floats) < size:
            self._floats = np.empty(size)
        return self._floats[:size]


_THREAD = threading.local()


def _scratch(size: int) -> np.ndarray:
    """``size`` float64 of this thread's :class:`FloatSpace` for the windows of one read."""
    if not hasattr(_THREAD, "space"):
        _THREAD.space = FloatSpace()
    return _THREAD.space.take(size)


_MAGIC: Final = b"\x93FORESHOCK-ARRAYS\n"
_ZIP: Final = b"PK\x03\x04"


def _write_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays`` as one file: a magic line, the names as a ``.npy`` array, then each array as a
    ``.npy`` (:mod:`numpy.lib.format`). Written straight from the arrays' memory: a ``.npz`` copies
    every byte into a zip member and checksums it, which at a partition's hundreds of MiB costs
    about two and a half times the CPU of writing the arrays as they lie. The checkpoint's
    generation swap is what makes the file whole or absent after a crash."""
    with open(path, "wb") as fh:
        fh.write(_MAGIC)
        np.lib.format.write_array(fh, np.array(list(arrays), dtype=str), allow_pickle=False)
        for array in arrays.values():
            np.lib.format.write_array(fh, np.asarray(array), allow_pickle=False)


def _read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """What :func:`_write_arrays` wrote, or a ``.npz``: the earlier container, still read so that
    a service restarted on a new version keeps its checkpoints."""
    with open(path, "rb") as fh:
        head = fh.read(len(_MAGIC))
        if head.startswith(_ZIP):
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        if head != _MAGIC:
            raise ValueError(f"{path}: not an online feature state")
        names = np.lib.format.read_array(fh, allow_pickle=False).tolist()
        return {name: np.lib.format.read_array(fh, allow_pickle=False) for name in names}
