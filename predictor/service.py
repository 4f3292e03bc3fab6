"""The online risk service: consume telemetry, keep features current, score, publish, checkpoint.

One loop, one thread (:meth:`RiskService.run`); the HTTP API only reads what it publishes.

    poll a micro-batch ─► hold its records, as columns a log at a time, in their partition's state
           (dead letters go out: what does not decode, and what is dated implausibly, see
           foreshock.predictor.partition.time_anomaly)
        ─► in each partition, close every event-time boundary that is due by that partition's own
           logs: apply the held records <= T to its feature engine, read the features at T, peers
           included (a node's peers share its partition)   (see foreshock.predictor.partition)
        ─► journal the partitions' cuts (where a log read to its end stood when T closed)
        ─► score every (node, T) row of the cycle in one batched model call
        ─► publish RiskScore records to risk.scores, update the board and the metrics
        ─► checkpoints, spread over the period: every period / (partitions owned), snapshot the
           changed partition saved longest ago (a copy of its engine, offsets, held records) and
           seal its journal; a writer thread flushes the bus (scores and dead letters durable)
           and writes the snapshot while the loop goes on; the loop then commits its offsets.

State is per partition number, and partitions share nothing: each closes its boundaries as its
own logs allow (a partition far behind in a catch-up holds none of the others back, and is
never skipped for them), and a boundary's scores depend on its partition's records alone. After
a rebalance (another process joined or died) or a restart, each newly owned partition is
restored from its checkpoint, takes its journal's cuts, and its logs are sought to the
checkpointed offsets before any record is read, so replay reproduces the same scores.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from foreshock.ingest.bus import Bus, Message
from foreshock.ingest.columns import record_columns
from foreshock.ingest.contract import RECORD_TYPES, TELEMETRY_TOPICS, RiskScore
from foreshock.ingest.stream import RecordStream, now_ms, publish
from foreshock.models.artifact import RiskModel
from foreshock.predictor.checkpoint import BackgroundWriter, CheckpointStore, Snapshot
from foreshock.predictor.held import KIND_OF, HeldRecords, apply_by_tick
from foreshock.predictor.metrics import BoardMetrics, ServiceMetrics
from foreshock.predictor.model_source import ModelSource, check_model
from foreshock.predictor.partition import OnlineEngine, PartitionState, receipt_of, time_anomalies, watermark
from foreshock.predictor.scoring import RiskBoard, score_frame

__all__ = ["ServiceConfig", "EngineFactory", "RiskService", "NotReady"]

log = logging.getLogger(__name__)


class NotReady(RuntimeError):
    """The service cannot answer yet (no model loaded); the message says why."""


class EngineFactory(Protocol):
    """Makes and restores online feature engines of one feature set.

    ``tick_ms``: features change only at multiples of it (the engine's bucket).
    ``tolerance_ms``: the engines' allowance for records out of order; a record further behind
    its log than lateness plus this cannot be placed and is dead-lettered.
    ``columns``: per topic, the record fields the engines read
    (:func:`foreshock.predictor.held.engine_columns`).
    """

    feature_set_hash: str
    tick_ms: int
    tolerance_ms: int
    columns: dict[str, tuple[str, ...]]

    def new(self) -> OnlineEngine: ...

    def load(self, path: Path) -> OnlineEngine: ...

    def snapshot_space(self) -> Any:
        """Memory an engine's :meth:`~OnlineEngine.snapshot` lays its copy in, reused from one
        snapshot to the next (the service writes each before it takes the next)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Knobs of the loop, every span in milliseconds: event time (scoring, lateness) or wall time
    (checkpoint, reload, poll)."""

    group: str = "foreshock-predictor"
    topics: tuple[str, ...] = TELEMETRY_TOPICS
    score_every_ms: int = 10_000
    lateness_ms: int = 0
    checkpoint_every_ms: float = 30_000  # per partition; a crash replays at most this much of the logs
    reload_every_ms: float = 30_000
    poll_timeout_ms: int = 100
    max_records: int = 5_000
    max_rows_per_cycle: int = 100_000
    apply_batch: int = 8_192  # held records of a partition that make it worth an engine update early
    top_k: int = 5
    history: int = 60
    ready_lag: int = 0  # messages behind the topics at most, once, before the first "ready"
    max_lag: int = 10_000  # messages behind the topics beyond which a ready service is no longer ready
    future_tolerance_ms: int = 300_000  # how far after its receipt (log time, clock-capped) it may be dated

    def __post_init__(self) -> None:
        if self.score_every_ms <= 0 or self.lateness_ms < 0 or self.checkpoint_every_ms <= 0:
            raise ValueError("score_every must be > 0, lateness >= 0 and checkpoint_every > 0")
        if self.future_tolerance_ms < 0 or self.max_lag < 0:
            raise ValueError("future_tolerance and max_lag must be >= 0")


class RiskService:
    """Scores every node of the partitions it owns; see the module docstring for the loop.

    ``checkpoints=None`` keeps state in memory only (the embedded demo on the in-memory bus).
    """

    def __init__(self, bus: Bus, engines: EngineFactory, models: ModelSource, *,
                 config: ServiceConfig = ServiceConfig(), checkpoints: CheckpointStore | None = None,
                 metrics: ServiceMetrics | None = None, clock: Callable[[], int] = now_ms,
                 wall: Callable[[], float] = time.monotonic):
        self.bus = bus
        self.engines = engines
        self.models = models
        self.config = config
        self.checkpoints = checkpoints
        self.metrics = metrics or ServiceMetrics()
        self.clock = clock
        self.wall = wall
        self.board = RiskBoard(config.history)
        self.board_metrics = BoardMetrics(self.board, lambda: self.model)  # read at scrape time
        self.model: RiskModel | None = None
        self.error: BaseException | None = None
        self._states: dict[int, PartitionState] = {}
        self._dirty: set[int] = set()
        self._saved_at: dict[int, float] = {}  # wall time of each partition's last checkpoint
        self._writer = BackgroundWriter(self._write)
        self._snapshot_space = engines.snapshot_space()
        self._stream: RecordStream | None = None
        self._assigned: set[tuple[str, int]] | None = None
        self._caught_up = False
        self.lag_records: int | None = None
        self._last_checkpoint = self._last_reload = 0.0

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> RiskService:
        """Load and check the model (raises ``ModelMismatchError``), then join the group."""
        self._install(self.models.load())
        consumer = self.bus.consumer(self.config.group, list(self.config.topics), on_assign=self._on_assign)
        self._stream = RecordStream(self.bus, consumer, clock=self.clock)
        self._last_checkpoint = self._last_reload = self.wall()
        return self

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set; then checkpoint, commit and leave the group."""
        if self._stream is None:
            self.start()
        try:
            while not stop.is_set():
                self.run_once()
        except BaseException as exc:
            self.error = exc
            log.exception("risk service loop stopped")
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Checkpoint what is owned and leave the group (partitions move to other members)."""
        if self._stream is None:
            return
        if self.error is None:
            self.checkpoint()
        self._writer.close()
        self._stream.close()
        self._stream = None

    # ---- one cycle -----------------------------------------------------------------------
    def run_once(self) -> list[RiskScore]:
        """Poll, hold, close due boundaries, score, publish; checkpoint and reload when due."""
        assert self._stream is not None, "start() first"
        dead_before = self._stream.dead_letters
        taken: dict[str, int] = {}
        polled = self._stream.poll_batches(self.engines.columns, self.config.poll_timeout_ms / 1000,
                                           self.config.max_records)
        clock = self.clock()
        future_ms = self.config.future_tolerance_ms
        past_ms = self.config.lateness_ms + self.engines.tolerance_ms
        for batch in polled:
            state = self._states.get(batch.partition)
            if state is None:
                continue
            receipts = np.array([receipt_of(m.timestamp, clock) for m in batch.messages])
            refused = time_anomalies(state, batch.topic, batch.columns.get("ts", np.empty(0, np.int64)),
                                     batch.counts, receipts, future_ms=future_ms, past_ms=past_ms)
            for i, why in refused.items():
                self._stream.dead_letter(batch.messages[i], why)
            if refused:  # their offsets are still taken: the commit passes them
                batch = batch.without(refused)
            if batch.columns:
                state.take(batch.topic, batch.offsets, batch.counts, batch.columns)
            self._dirty.add(batch.partition)
            taken[batch.topic] = taken.get(batch.topic, 0) + int(batch.counts.sum())
        for topic, n in taken.items():  # one metric update per topic and poll, not per message
            self.metrics.records.labels(topic=topic).inc(n)
        self.metrics.dead_letters.inc(self._stream.dead_letters - dead_before)
        lag = self._lag()
        scores = self._score_due(lag)
        now = self.wall()
        written = self._writer.done()
        if written is not None:
            self._written(written)
        every = self.config.checkpoint_every_ms / 1000 / max(1, len(self._states))
        if not self._writer.busy and now - self._last_checkpoint >= every:
            self._last_checkpoint = now
            changed = self._dirty & set(self._states)
            if changed:  # the one saved longest ago
                started = time.perf_counter()
                self._writer.submit(self._snapshot(min(changed, key=lambda p: self._saved_at.get(p, 0.0)),
                                                   copy_engine=True))
                self.metrics.checkpoint_stall.observe(time.perf_counter() - started)
        if now - self._last_reload >= self.config.reload_every_ms / 1000:
            self.reload_model()
        return scores

    def _lag(self) -> dict[tuple[str, int], int | None]:
        lag_of = getattr(self._stream.consumer, "lag", None) if self._stream else None
        lag: dict[tuple[str, int], int | None] = lag_of() if lag_of else {}
        known = [v for v in lag.values() if v is not None]
        self.lag_records = sum(known) if len(known) == len(lag) else None
        self.metrics.lag.set(sum(known))
        self.metrics.held.set(sum(s.held for s in self._states.values()))
        if (not self._caught_up and self._assigned is not None and len(known) == len(lag)
                and sum(known) <= self.config.ready_lag):
            self._caught_up = True
        self.metrics.ready.set(1 if self.readiness()[0] else 0)
        return lag

    def _score_due(self, lag: dict[tuple[str, int], int | None]) -> list[RiskScore]:
        started = time.perf_counter()
        limits: dict[int, int] = {}  # per partition: every record up to here has been read
        for p, state in self._states.items():
            mark = watermark(state, self.config.topics, lag)
            if mark is not None:
                limits[p] = mark - self.config.lateness_ms
        # the partitions' due boundaries in time order, so that a cycle's row budget is shared
        # fairly: a partition far behind does not wait for the others' backlog, nor they for its
        due = [(s.next_boundary, p) for p, s in self._states.items()
               if p in limits and s.next_boundary is not None and s.next_boundary < limits[p]]
        heapq.heapify(due)
        frames: list[pd.DataFrame] = []
        rows = 0
        while due and rows < self.config.max_rows_per_cycle:
            boundary, p = heapq.heappop(due)
            frame = self._close(p, boundary, limits[p])
            if len(frame):
                frames.append(frame)
                rows += len(frame)
            following = self._states[p].next_boundary
            if following is not None and following < limits[p]:
                heapq.heappush(due, (following, p))
        closing = {p for _, p in due}
        for p, limit in limits.items():  # spread the engine work between boundaries (whole ticks only)
            state = self._states[p]
            early = limit // self.engines.tick_ms * self.engines.tick_ms - 1
            done = -1 if state.applied_until is None else state.applied_until
            if p not in closing and state.held >= self.config.apply_batch and early > done:
                state.apply(early)
        self._journal(limits, lag)
        if not frames:
            return []
        assert self.model is not None
        scores = score_frame(self.model, pd.concat(frames, ignore_index=True), self.config.top_k)
        publish(self.bus, scores)
        self.board.record(scores)
        self.metrics.scoring.observe(time.perf_counter() - started)
        self.metrics.scores.inc(len(scores))
        self.metrics.delay.observe(max(0.0, (self.clock() - max(s.ts for s in scores)) / 1000))
        scored, alerts = self.board.counts()
        self.metrics.nodes.set(scored)
        self.metrics.alerts.set(alerts)
        return scores

    def _close(self, p: int, boundary: int, limit: int) -> pd.DataFrame:
        """Close ``boundary`` in partition ``p``: its rows at ``boundary``, nodes out of service left out."""
        state = self._states[p]
        # the engine answers at ticks from the buckets before them: asking at the tick after the
        # boundary reads the current, partial bucket too, which holds exactly the records <= boundary
        as_of = -(-boundary // self.engines.tick_ms) * self.engines.tick_ms
        horizon = -(-limit // self.config.score_every_ms) * self.config.score_every_ms
        state.close(boundary)
        self._dirty.add(p)
        frame = state.engine.features_at(as_of)  # peers: the partition's own nodes
        if not len(frame):
            state.skip_idle(as_of, horizon)
            return frame
        away = state.away_at(boundary)
        if away:
            frame = frame[~frame["node"].isin(away)].reset_index(drop=True)
        frame["ts"] = boundary
        return frame

    def _journal(self, partitions: Iterable[int], lag: dict[tuple[str, int], int | None]) -> None:
        """Cut the passed-over logs of ``partitions`` where this cycle applied records to
        (:meth:`PartitionState.cut`) and journal the cuts, before any score they shaped is published."""
        for p in partitions:
            entry = self._states[p].cut(self.config.topics, lag)
            if entry is not None:
                self._dirty.add(p)
                if self.checkpoints is not None:
                    self.checkpoints.journal(p, entry)

    # ---- durability ----------------------------------------------------------------------
    def checkpoint(self, partitions: Sequence[int] | None = None) -> None:
        """Make published scores and dead letters durable, then the state of the changed partitions
        among ``partitions`` (default: all), then commit their offsets (a crash between two steps
        replays, it never loses); returns once all of it is done, a write in progress included.

        The loop itself checkpoints one partition at a time and writes it on another thread (see
        the module docstring): an engine's state is large (its 24 h windows at one-minute
        resolution), and writing it on the loop stalled scoring.
        """
        written = self._writer.done(wait=True)
        if written is not None:
            self._written(written)
        self.bus.flush()
        chosen = self._dirty if partitions is None else self._dirty & set(partitions)
        for p in sorted(p for p in chosen if p in self._states):
            snapshot = self._snapshot(p, copy_engine=False)
            self._write(snapshot)
            self._written(snapshot)

    def _snapshot(self, p: int, copy_engine: bool) -> Snapshot:
        """Partition ``p`` as it stands, for :meth:`_write`; the engine copied unless it is written
        before the loop moves on. Its journal is sealed here: later cuts go to a new one."""
        state = self._states[p]
        self._dirty.discard(p)
        if self.checkpoints is None:
            return Snapshot(p, None, {}, dict(state.positions))
        meta = state.meta()
        meta["board"] = self.board.export(state.engine.nodes())
        engine = state.engine
        if copy_engine:  # only when the writer is idle: the last snapshot in the space is written
            engine = engine.snapshot(self._snapshot_space)
        return Snapshot(p, engine, meta, dict(state.positions), self.checkpoints.seal(p))

    def _write(self, snapshot: Snapshot) -> None:
        """Flush the bus, then write ``snapshot`` (any thread: the producer is thread-safe)."""
        started = time.perf_counter()
        self.bus.flush()
        if self.checkpoints is not None:
            self.checkpoints.save(snapshot.partition, snapshot.engine, snapshot.meta, snapshot.sealed)
        snapshot.write_s = time.perf_counter() - started

    def _written(self, snapshot: Snapshot) -> None:
        """On the loop: ``snapshot`` is durable; commit the offsets it holds."""
        self._saved_at[snapshot.partition] = self.wall()
        self.metrics.checkpoint.observe(snapshot.write_s)
        done = [Message(t, p, off - 1, None, b"") for (t, p), off in snapshot.positions.items() if off > 0]
        if done and self._stream is not None:
            try:
                self._stream.consumer.commit(done)
            except Exception as exc:  # a rebalance in flight: the checkpoint holds the offsets
                log.warning("offset commit failed (%s); the checkpoint keeps the positions", exc)

    def _on_assign(self, assigned: set[tuple[str, int]]) -> None:
        """Rebalance: drop lost partitions, restore gained ones, seek every log to its position."""
        topics = set(self.config.topics)
        owned = {p for t, p in assigned if t in topics}
        written = self._writer.done(wait=True)  # no write of a partition given up goes on after this
        if written is not None:
            self._written(written)
        for p in sorted(set(self._states) - owned):
            self.board.forget(self._states.pop(p).engine.nodes())
            self._dirty.discard(p)
            self._saved_at.pop(p, None)
        for p in sorted(owned - set(self._states)):
            self._states[p] = self._restore(p)
        positions = {tp: off for p in owned for tp, off in self._states[p].positions.items()
                     if tp in assigned}
        seek = getattr(self._stream.consumer if self._stream else None, "seek", None)
        if positions and seek is not None:
            seek(positions)
        self._assigned = set(assigned)
        self.metrics.partitions.set(len(owned))
        log.info("assigned partitions %s", sorted(owned))

    def _restore(self, p: int) -> PartitionState:
        """Partition ``p`` as its checkpoint left it (fresh without one), with the cuts journaled since."""
        cfg, tick, columns = self.config, self.engines.tick_ms, self.engines.columns
        if self.checkpoints is None:
            return PartitionState(p, self.engines.new(), cfg.score_every_ms, cfg.lateness_ms, tick, columns)
        saved = self.checkpoints.load(p)
        if saved is None:
            state = PartitionState(p, self.engines.new(), cfg.score_every_ms, cfg.lateness_ms, tick, columns)
        else:
            engine, meta = saved
            self.board.restore(meta.get("board", []))
            state = PartitionState.restore(engine, meta, cfg.score_every_ms, cfg.lateness_ms, tick, columns)
        state.replay(self.checkpoints.journaled(p))
        self.checkpoints.seal(p)  # this run journals into a journal of its own
        return state

    # ---- model ---------------------------------------------------------------------------
    def _install(self, model: RiskModel) -> None:
        self.model = check_model(model, self.engines.feature_set_hash)
        self.metrics.set_model(model.version, model.feature_set_hash)
        self.metrics.reloads.labels(result="loaded").inc()
        log.info("serving model %s (feature set %s)", model.version, model.feature_set_hash)

    def reload_model(self) -> bool:
        """Load the source's model if its version moved; keep the old one if the new one is refused."""
        self._last_reload = self.wall()
        try:
            version = self.models.version()
            if version is None or (self.model is not None and version == self.model.version):
                return False
            self._install(self.models.load())
            return True
        except Exception as exc:
            result = "refused" if isinstance(exc, ValueError) else "failed"
            self.metrics.reloads.labels(result=result).inc()
            log.error("model reload %s; still serving %s: %s", result,
                      self.model.version if self.model else None, exc)
            return False

    # ---- what the API asks ---------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): ready while a model is loaded, the consumer has caught up once (lag at
        most ``ready_lag``), a broker is reachable and the consumer is at most ``max_lag`` messages
        behind its topics.

        Why the last two: scores go stale both while no broker answers and while the service is far
        behind (it scores event time, so it then publishes old boundaries): a load balancer or an
        operator must not take either for a working service. Called from the API's thread; every
        check reads state the loop keeps current, or asks the consumer without blocking.
        """
        if self.model is None:
            return False, "no model loaded"
        if self.error is not None:
            return False, f"service loop stopped: {self.error!r}"
        if self._assigned is None:
            return False, "waiting for a partition assignment from the consumer group"
        if not self._caught_up:
            return False, "consumer has not caught up with the telemetry topics yet"
        stream = self._stream
        reachable = getattr(stream.consumer, "reachable", None) if stream is not None else None
        if reachable is not None and not reachable():
            return False, "broker unreachable: the consumer has no connection to any Kafka broker"
        lag = self.lag_records
        if lag is not None and lag > self.config.max_lag:
            bound = self.config.max_lag
            return False, f"consumer is {lag:,} messages behind its topics (ready at {bound:,} or fewer)"
        return True, "ready"

    def failure(self) -> str | None:
        """Why the loop stopped, or None while it runs."""
        return None if self.error is None else repr(self.error)

    def metrics_text(self, per_node: bool = True) -> bytes:
        """The Prometheus exposition (the board's per-node series too, unless ``per_node`` is
        False: the API process renders them from its mirror), readiness current at the call: the
        loop sets it each cycle, but a cycle can wait on the broker (a flush during an outage), and
        the gauge must say so."""
        self.metrics.ready.set(1 if self.readiness()[0] else 0)
        return self.metrics.render() + (self.board_metrics.render() if per_node else b"")

    def score_rows(self, frame: pd.DataFrame) -> list[RiskScore]:
        """Score feature rows given by a caller (columns: the model's features; node, ts optional)."""
        model = self._model_or_raise()
        frame = frame.copy()
        if "node" not in frame:
            frame["node"] = [f"row{i}" for i in range(len(frame))]
        if "ts" not in frame:
            frame["ts"] = self.clock()
        return score_frame(model, frame, self.config.top_k)

    def score_telemetry(self, records: Sequence[Any], at: int | None = None) -> list[RiskScore]:
        """Score every live node of a window of raw telemetry at time ``at`` (default: the tick
        after its last record), as a fresh engine fed only this window sees it."""
        model = self._model_or_raise()
        if not records:
            return []
        engine = self.engines.new()
        held = HeldRecords()
        for topic in KIND_OF:
            mine = [r for r in records if isinstance(r, RECORD_TYPES[topic])]
            cols = record_columns(topic, mine, self.engines.columns[topic])
            held.add(topic, cols["ts"], cols)
        apply_by_tick(engine, held.take(max(r.ts for r in records)), self.engines.tick_ms)
        if at is None:  # just after the tick that completes the last record's bucket
            tick = self.engines.tick_ms
            at = (max(r.ts for r in records) // tick + 1) * tick
        return score_frame(model, engine.features_at(at), self.config.top_k)

    def _model_or_raise(self) -> RiskModel:
        if self.model is None:
            raise NotReady("no model loaded")
        return self.model

    def owned_partitions(self) -> list[int]:
        """Partition numbers whose nodes this process scores."""
        return sorted(self._states)
