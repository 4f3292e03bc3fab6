"""One partition's online state and its event-time scoring clock.

Scoring runs on **event time**: a partition is scored at every boundary ``T`` (a multiple of
the scoring period, epoch-aligned) with exactly the records whose time is ``<= T`` applied to
its feature engine, and its peer features compare its own nodes only
(:attr:`foreshock.features.spec.FeatureSet.peer_partitions`). A partition's scores are therefore
a function of its own logs, whatever the other partitions' progress or owner: a process restored
from a checkpoint and replaying from the checkpointed offsets publishes the same scores as one
that never stopped, and an accelerated stream (the demo, a replay) is scored at its own pace.

Records are held back until their boundary closes. Each partition closes its own boundaries:
``T`` closes when every log of the partition (one per telemetry topic) has either moved past
``T + lateness`` or has been read to its end (lag 0; a sparse topic such as Xid events must not
stall scoring). A record that arrives behind its own log's progress by more than ``lateness``
is treated as arriving at ``progress - lateness``: that keeps the decision a function of each
log's own order, never of how fetches from different logs interleaved.

A log read to its end when ``T`` closed ("passed over") may later receive a record dated before
``T``: it arrived too late for ``T`` and counts from the next boundary. On a replay that record
is already in the log, and would count at ``T``. So every time records are applied through some
``A`` (closing a boundary, an early update, a skip), the passed-over logs get a **cut**: their
records from the current offset on take effect after ``A`` (:meth:`PartitionState.cut`). The
service writes each cut to the partition's journal before it publishes the scores it shaped, and
a restored partition applies the journal's cuts at the same offsets (:meth:`PartitionState.replay`):
the replay then makes the very decisions the first run made, late arrivals included. Records are
applied in the order of their effective times, with engine updates split only at ticks and
boundaries, so the engine sees the same updates whenever and however often they are made.

A record's time must be plausible before it may move any of this (:func:`time_anomaly`): one
dated after its receipt, or too far behind its own log for the feature engine to place, is
dead-lettered instead, so a single bad stamp (a clock 6 h ahead, ts = 2^53) can neither hold
back every later record of its log nor be saved into a checkpoint. A stretch of boundaries at
which a partition has no live node is skipped in one step (:meth:`PartitionState.skip_idle`),
so an early stamp that slipped in as a log's first record costs one boundary, not a walk from 1970.

A node out of service (its last node event at or before ``T`` a ``down``, ``drained`` or
``failed``, not yet followed by ``repaired`` or ``up``) is not scored at ``T``: training never saw
such rows (the labels leave them out), and an alert for a node that runs no work only adds noise.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from foreshock.features.spec import FeatureSet
from foreshock.ingest.columns import record_columns
from foreshock.ingest.contract import RETURN_EVENTS, UNAVAILABLE_EVENTS, Topic
from foreshock.predictor.held import HeldRecords, apply_by_tick, engine_columns

__all__ = ["OnlineEngine", "PartitionState", "watermark", "time_anomaly", "time_anomalies", "receipt_of"]

_SERVICE_EVENTS = UNAVAILABLE_EVENTS | RETURN_EVENTS


class OnlineEngine(Protocol):
    """What the service needs of ``foreshock.features.online.OnlineFeatureEngine``."""

    feature_set: FeatureSet

    def update_frames(self, frames: Mapping[str, Any]) -> Any: ...

    def features_at(self, ts: int, nodes: Sequence[str] | None = None) -> Any: ...

    def nodes(self) -> Any: ...

    def save(self, path: Any) -> Any: ...

    def snapshot(self, space: Any = None) -> Any: ...


def _at_end(state: PartitionState, topic: str, lag: Mapping[tuple[str, int], int | None]) -> bool:
    """Whether the log of ``topic`` in ``state``'s partition has no unread record (lag 0, or not ours)."""
    tp = (topic, state.partition)
    return tp not in lag or lag[tp] == 0


def watermark(state: PartitionState, topics: Sequence[str],
              lag: Mapping[tuple[str, int], int | None]) -> int | None:
    """Time up to which every log of ``state``'s partition has been read (None: unknown yet).

    A log read to its end (lag 0) holds nothing older and does not hold the others back; a log
    with unread records that we have never read from may hold anything, so the answer is None.
    Other partitions do not count: each partition moves at its own pace.
    """
    bounded: list[int] = []
    for topic in topics:
        if _at_end(state, topic, lag):
            continue
        progress = state.progress.get(topic)
        if progress is None:
            return None
        bounded.append(progress)
    if bounded:
        return min(bounded)
    return max(state.progress.values(), default=None)


def time_anomaly(state: PartitionState, topic: str, records: Sequence[Any], receipt_ms: int, *,
                 future_ms: int, past_ms: int) -> str | None:
    """Why one consumed message's records may not enter ``state`` (None: they may), for its dead letter.

    Checked before :meth:`PartitionState.add`, so a refused message moves neither the log's progress,
    nor the first boundary, nor the engine's watermark, and is never saved into a checkpoint.

    - **Future:** a record dated more than ``future_ms`` after ``receipt_ms``: the earlier of the
      message's log time (:attr:`foreshock.ingest.bus.Message.timestamp`, Kafka's CreateTime or
      LogAppendTime) and the service's clock when the poll returned (see :func:`receipt_of`).
      The log time is the reference because it is in the log: a replay after a crash meets the
      same message with the same log time and decides the same, where the service's clock would
      have moved on and let in a record refused the first time. The service's clock caps it, for
      a producer whose clock runs ahead (its CreateTime with it). The partition's event time cannot
      be the reference: a record after a real gap (the only node of a partition rebooting, a
      collector outage) is exactly as far ahead of it as a wrong one, and refusing it would refuse
      every record after the gap, for good. Telemetry cannot come from the future, so this also
      covers the very first record of a partition, which has no event time to compare with. What
      it does not catch is a jump *within* the past (a replay of last year's data with one record
      6 h ahead of the others): such a record is taken as data. Clocks must agree within
      ``future_ms`` (NTP).
    - **Past:** a record older than its own log's newest record (``progress``; per (topic,
      partition), because the logs of one partition are read at different paces and a sparse
      log's next record is legitimately far behind a dense one) by more than ``past_ms`` —
      lateness plus the feature engine's tolerance: the engine keeps every record at least that
      recent and may drop (silently) one that is older. Node events are never refused for
      being late: the engine does not bucket them and the service places them at any time. The
      first record of a log has nothing to trail, so it passes: see :meth:`PartitionState.skip_idle`.

    A message whose records disagree is refused whole, as :func:`foreshock.ingest.contract.decode` refuses
    a message with one invalid record: its dead letter holds the original bytes.
    """
    ts = np.fromiter((r.ts for r in records), np.int64, len(records))
    found = time_anomalies(state, topic, ts, np.array([len(records)]), np.array([receipt_ms]),
                           future_ms=future_ms, past_ms=past_ms)
    return found.get(0)


_UNSET = np.iinfo(np.int64).min // 2  # no progress yet: nothing to trail


def time_anomalies(state: PartitionState, topic: str, ts: np.ndarray, counts: np.ndarray,
                   receipts: np.ndarray, *, future_ms: int, past_ms: int) -> dict[int, str]:
    """:func:`time_anomaly` for consecutive messages of one log at once: message ``i`` holds the next
    ``counts[i]`` times of ``ts`` and was received at ``receipts[i]``. Returns the refused messages'
    reasons by index; as if each were judged, and if taken added, in turn."""
    counts = np.asarray(counts, dtype=np.int64)
    if not len(ts):
        return {}
    msg = np.repeat(np.arange(len(counts)), counts)
    limit = np.asarray(receipts, dtype=np.int64) + future_ms
    trails = topic != Topic.NODE_EVENTS
    before = np.full(len(counts), _UNSET)
    if trails:  # the log's progress before each message, were every message before it taken
        starts, has = np.cumsum(counts) - counts, counts > 0
        newest = np.full(len(counts), _UNSET)
        newest[has] = np.maximum.reduceat(ts, starts[has])
        before = np.maximum.accumulate(np.r_[state.progress.get(topic, _UNSET), newest[:-1]])
    if not ((ts > limit[msg]).any() or (trails and (ts < before[msg] - past_ms).any())):
        return {}
    out: dict[int, str] = {}  # some are refused: judge them in turn, a refused one moves nothing
    progress = state.progress.get(topic) if trails else None
    for i, rows in enumerate(np.split(ts, np.cumsum(counts)[:-1])):
        why = _anomaly(state, topic, rows.tolist(), int(limit[i]) - future_ms, progress, future_ms, past_ms)
        if why is not None:
            out[i] = why
        elif trails and len(rows):
            progress = max(progress if progress is not None else _UNSET, int(rows.max()))
    return out


def _anomaly(state: PartitionState, topic: str, times: list[int], receipt_ms: int, progress: int | None,
             future_ms: int, past_ms: int) -> str | None:
    for t in times:
        if t > receipt_ms + future_ms:
            return (f"time anomaly: ts {t} is dated {(t - receipt_ms) / 1000:,.0f} s after its receipt "
                    f"(future tolerance {future_ms / 1000:g} s): it would move the partition's event time")
        if progress is not None and t < progress - past_ms:
            return (f"time anomaly: ts {t} is {(progress - t) / 1000:,.0f} s behind the newest record "
                    f"of {topic} partition {state.partition} (ts {progress}), more than lateness + "
                    f"tolerance ({past_ms / 1000:g} s): the feature engine can no longer place it")
    return None


def receipt_of(log_ms: int | None, clock_ms: int) -> int:
    """The receipt time a message's records are judged against (:func:`time_anomaly`): its log time,
    capped by the service's clock; the clock alone where the bus keeps no log time."""
    return clock_ms if log_ms is None else min(log_ms, clock_ms)


class PartitionState:
    """Engine, held records, log progress and next boundary of one partition number.

    ``positions`` holds the next offset to read per ``(topic, partition)``; ``progress`` the
    highest record time read per topic; ``floors`` the least effective time of a record read from
    now on per topic (set by cuts); ``applied_until`` the effective time through which held records
    have gone into the engine. All travel in the checkpoint with the held records, which wait as the
    columns the engine reads (``columns``, per topic; default: :func:`engine_columns` of the engine).
    """

    def __init__(self, partition: int, engine: OnlineEngine, period_ms: int, lateness_ms: int = 0,
                 tick_ms: int = 60_000, columns: Mapping[str, Sequence[str]] | None = None):
        if period_ms <= 0 or tick_ms <= 0:
            raise ValueError("scoring period and tick must be positive")
        self.partition = partition
        self.engine = engine
        self.period_ms = period_ms
        self.lateness_ms = lateness_ms
        self.tick_ms = tick_ms
        self.columns = columns if columns is not None else engine_columns(engine.feature_set)
        self.positions: dict[tuple[str, int], int] = {}
        self.progress: dict[str, int] = {}
        self.next_boundary: int | None = None
        self.floors: dict[str, int] = {}
        self.applied_until: int | None = None
        # per topic, the (offset, floor) cuts an earlier run made that this one has not read up to yet
        self._replay: dict[str, list[tuple[int, int]]] = {}
        self._closed_any = False  # until the first close, an earlier record moves the first boundary
        # per node, its changes of service (effective time, out of service?) read so far, in time
        # order; read as of a boundary, so it does not matter that they arrive ahead of it
        self._service: dict[str, list[tuple[int, bool]]] = {}
        self._held = HeldRecords()

    # ---- intake --------------------------------------------------------------------------
    def add(self, topic: str, offset: int, records: Sequence[Any]) -> None:
        """Take one consumed message's records (already decoded and validated)."""
        self.take(topic, np.array([offset]), np.array([len(records)]),
                  record_columns(topic, records, self.columns[topic]))

    def take(self, topic: str, offsets: np.ndarray, counts: np.ndarray,
             columns: Mapping[str, np.ndarray]) -> None:
        """Take consecutive messages of ``topic``'s log at ``offsets``: message ``i`` holds the next
        ``counts[i]`` rows of ``columns`` (:attr:`columns`, decoded and validated; 0 rows for a
        message refused). The same as :meth:`add` of each message in turn.

        A record's effective time is its own, or later where its log has moved on (more than
        ``lateness`` past it, before its message) or a cut says so: see the module docstring.
        """
        if not len(offsets):
            return
        cut = self._reach(topic, offsets)
        self.positions[(topic, self.partition)] = int(offsets[-1]) + 1
        ts = columns["ts"]
        if not len(ts):
            return
        counts = np.asarray(counts, dtype=np.int64)
        starts, has = np.cumsum(counts) - counts, counts > 0
        newest = np.full(len(counts), -1, dtype=np.int64)
        newest[has] = np.maximum.reduceat(ts, starts[has])
        before = np.maximum.accumulate(np.r_[self.progress.get(topic, -1), newest[:-1]])
        floor = np.maximum(before - self.lateness_ms, cut)
        eff = np.maximum(ts, np.repeat(floor, counts))
        if newest.max() > self.progress.get(topic, -1):
            self.progress[topic] = int(newest.max())
        if topic == Topic.NODE_EVENTS:
            for node, t, event in zip(columns["node"], eff.tolist(), columns["event"], strict=True):
                if event in _SERVICE_EVENTS:
                    changes = self._service.setdefault(node, [])
                    bisect.insort(changes, (t, event in UNAVAILABLE_EVENTS), key=lambda c: c[0])
        if not self._closed_any:
            # the first boundary follows the earliest record read before it closes, whichever log
            # was read first (a sparse log's later record must not make the partition skip one)
            boundary = -(-int(eff.min()) // self.period_ms) * self.period_ms
            self.next_boundary = boundary if self.next_boundary is None else min(self.next_boundary, boundary)
        self._held.add(topic, eff, columns)

    @property
    def held(self) -> int:
        """Records read but not yet applied to the engine (their boundary is still open)."""
        return len(self._held)

    def held_times(self, topic: str) -> list[int]:
        """The effective times of ``topic``'s held records, in the order they were read."""
        return self._held.times(topic)

    # ---- the clock -----------------------------------------------------------------------
    def apply(self, until: int) -> None:
        """Apply every held record whose (effective) time is ``<= until`` to the engine.

        Records go in time order, one engine update per tick, so a long stretch never makes the
        engine drop a batch's own early records. The engine answers ``features_at(T)`` from the
        complete ticks before ``T`` only, so records applied beyond ``T`` (but before the next
        boundary) do not change it: applying eagerly spreads the work without changing a score.
        """
        # per log in (time, log order): never dependent on how fetches of two logs interleaved
        apply_by_tick(self.engine, self._held.take(until), self.tick_ms)
        self._passed(until)

    def _passed(self, until: int) -> None:
        if self.applied_until is None or until > self.applied_until:
            self.applied_until = until

    # ---- cuts ----------------------------------------------------------------------------
    def cut(self, topics: Sequence[str], lag: Mapping[tuple[str, int], int | None]) -> dict[str, Any] | None:
        """After records were applied through :attr:`applied_until` with the logs' lags ``lag``:
        make the records that the logs read to their end ("passed over") bring from now on take
        effect after it. Returns the journal entry that lets a replay do the same, or None.

        A log that had unread records held the watermark back, so its next records are dated past
        the point applied (see :func:`watermark`); so is a log whose newest record is more than
        ``lateness`` past it. Any other log could still bring a record dated before that point,
        which the engine did not see in time: it counts from here on, and the journal keeps where
        (the log's next offset) so that a replay, which finds that record already in the log,
        counts it at the same place rather than before.
        """
        until = self.applied_until
        if until is None:
            return None
        cuts: dict[str, int] = {}
        for topic in topics:
            if not _at_end(self, topic, lag):
                continue
            progress = self.progress.get(topic)
            if progress is not None and progress - self.lateness_ms > until:
                continue
            if self.floors.get(topic, -1) <= until:
                self.floors[topic] = until + 1
                cuts[topic] = self.positions.get((topic, self.partition), 0)
        return {"until": until, "cuts": cuts} if cuts else None

    def replay(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Take the journal's cuts (of :meth:`cut`, written by a run this one continues): each takes
        effect when this state reads its log at or past the offset it names."""
        for entry in entries:
            floor = int(entry["until"]) + 1
            for topic, offset in entry["cuts"].items():
                bisect.insort(self._replay.setdefault(topic, []), (int(offset), floor))

    def pending_cuts(self) -> list[dict[str, Any]]:
        """The replayed cuts not reached yet, as journal entries (a checkpoint keeps them)."""
        return [{"until": floor - 1, "cuts": {topic: offset}}
                for topic, pending in sorted(self._replay.items()) for offset, floor in pending]

    def _reach(self, topic: str, offsets: np.ndarray) -> np.ndarray:
        """Read up to ``offsets`` (increasing): the replayed cuts they pass take effect. Returns the
        floor in force at each one."""
        floors = np.full(len(offsets), self.floors.get(topic, -1), dtype=np.int64)
        pending = self._replay.get(topic)
        reached = 0
        while pending and reached < len(pending) and pending[reached][0] <= offsets[-1]:
            offset, floor = pending[reached]
            floors[offsets >= offset] = np.maximum(floors[offsets >= offset], floor)
            reached += 1
        if reached:
            del pending[:reached]
            self.floors[topic] = max(self.floors.get(topic, -1), int(floors[-1]))
        return floors

    def away_at(self, t: int) -> set[str]:
        """Nodes out of service at ``t``: their last change of service at or before ``t`` took them
        out. Boundaries only grow, so the changes before that last one are dropped here."""
        away = set()
        for node, changes in self._service.items():
            last = bisect.bisect_right(changes, t, key=lambda c: c[0]) - 1
            if last >= 0:
                del changes[:last]
                if changes[0][1]:
                    away.add(node)
        return away

    def skip_idle(self, seen_until: int, horizon: int) -> None:
        """Called after a boundary at which the engine had no live node: move the next boundary
        past the boundaries that would be empty too, to the first that applies a held record (or
        ``horizon``, the first boundary at or after the scoring limit, if earlier).

        Exact: when every record the engine holds lies before ``seen_until`` (the time features were
        read at), a later boundary's windows hold a subset of what this one's held, so no node is
        live there either, until a held record is applied. The scores are therefore those of
        closing each boundary in turn, which could take ~10^11 steps after a first record stamped
        in 1970 (nothing precedes a log's first record to show that it is late).
        """
        if self.next_boundary is None or getattr(self.engine, "watermark_ms", seen_until) >= seen_until:
            return
        first = self._held.earliest()
        target = horizon if first is None else min(horizon, -(-first // self.period_ms) * self.period_ms)
        if target > self.next_boundary:
            self.next_boundary = target
            self._passed(target - self.period_ms)  # nothing held is due there: as if applied

    def close(self, boundary: int) -> None:
        """Make the engine hold every record ``<= boundary``; the caller reads its features at
        ``boundary`` right after. The next boundary follows one period later."""
        self.apply(boundary)
        self.next_boundary = boundary + self.period_ms
        self._closed_any = True

    # ---- checkpoint form -----------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Everything but the engine, as msgpack-ready data."""
        return {
            "partition": self.partition,
            "period_ms": self.period_ms,
            "positions": [[t, p, off] for (t, p), off in sorted(self.positions.items())],
            "progress": dict(self.progress),
            "next_boundary": self.next_boundary,
            "closed_any": self._closed_any,
            "floors": dict(self.floors),
            "applied_until": self.applied_until,
            "replay": self.pending_cuts(),
            "service": [[node, [list(c) for c in changes]] for node, changes in self._service.items()],
            "held": self._held.export(),
        }

    @classmethod
    def restore(cls, engine: OnlineEngine, meta: Mapping[str, Any], period_ms: int,
                lateness_ms: int = 0, tick_ms: int = 60_000,
                columns: Mapping[str, Sequence[str]] | None = None) -> PartitionState:
        """Rebuild from a checkpoint's engine and :meth:`meta` (the period must not have changed)."""
        if meta["period_ms"] != period_ms:
            raise ValueError(f"checkpoint was scored every {meta['period_ms']} ms, not {period_ms} ms")
        state = cls(int(meta["partition"]), engine, period_ms, lateness_ms, tick_ms, columns)
        state.positions = {(t, int(p)): int(off) for t, p, off in meta["positions"]}
        state.progress = {t: int(v) for t, v in meta["progress"].items()}
        state.next_boundary = meta["next_boundary"]
        state._closed_any = bool(meta.get("closed_any", True))  # older checkpoints: the boundary stays
        state.floors = {t: int(v) for t, v in meta.get("floors", {}).items()}
        state.applied_until = meta.get("applied_until")
        state.replay(meta.get("replay", ()))
        # checkpoints written before nodes' service was kept hold none: every node in service
        state._service = {node: [(int(ts), bool(out)) for ts, out in changes]
                          for node, changes in meta.get("service", ())}
        state._held = HeldRecords.restore(meta["held"], state.columns)
        return state
