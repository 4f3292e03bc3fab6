"""The replayed day: recorded telemetry onto an in-memory bus, through the predictor and the mitigator.

Everything runs in this process on simulated time. Telemetry comes from the dataset folder
instant by instant (all of an instant's records in one publish, node lifecycle events at their
time); after every scoring period the predictor service drains the bus and publishes its risk
scores, and the mitigation service turns them into dry-run actions on a job that checkpoints
periodically. A warm-up before the day fills the feature windows; its scores never reach the
mitigator (its consumer skips them), so every action belongs to the replayed day.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import GpuSample, LinkSample, NodeEvent, RiskScore, XidEvent
from foreshock.ingest.dataset import read_events, read_table
from foreshock.ingest.stream import publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor, Outcome
from foreshock.mitigator.plan import JobView
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.schedulers import NoScheduler
from foreshock.mitigator.service import MitigationService
from foreshock.models.registry import CHAMPION_URI
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import RegistryModelSource
from foreshock.predictor.service import RiskService, ServiceConfig

__all__ = ["ReplayConfig", "ReplayState", "PeriodicJob", "telemetry_steps", "replay"]

_HOUR_MS = 3_600_000
_RECORDS = {"gpu": GpuSample, "xid": XidEvent, "link": LinkSample}


@dataclass(frozen=True)
class ReplayConfig:
    """What is replayed and how the job and the policy are set up."""

    data_dir: Path
    tracking_uri: str
    start_ms: int  # first instant of the replayed day
    end_ms: int
    warmup_ms: int
    nodes: int
    gpus_per_node: int
    spares: int
    checkpoint_every_ms: int
    checkpoint_s: float
    restart_s: float
    migration_s: float
    score_every_ms: int
    audit_path: Path
    watch_at: float  # risk that puts a node on watch; two records at or above it may trigger an action


@dataclass
class ReplayState:
    """What the live view and the report read; updated after every scoring period."""

    now_ms: int = 0
    scores: list[RiskScore] = field(default_factory=list)  # replayed day only
    latest: dict[str, RiskScore] = field(default_factory=dict)
    outcomes: list[tuple[int, Outcome]] = field(default_factory=list)  # (sim time, outcome)
    failures: list[NodeEvent] = field(default_factory=list)
    records: int = 0
    warming_up: bool = True
    engine: MitigationEngine | None = None
    job: PeriodicJob | None = None


class PeriodicJob:
    """One training job on every non-spare node that checkpoints every ``every_ms`` of simulated time."""

    def __init__(self, job: JobView, every_ms: int, clock: Callable[[], int]):
        self.job, self.every_ms, self.clock = job, every_ms, clock

    def last_checkpoint_ms(self, at_ms: int) -> int:
        return max(self.job.last_checkpoint_ms, at_ms // self.every_ms * self.every_ms)

    def jobs(self) -> Sequence[JobView]:
        now = self.clock()
        return [
            JobView(
                self.job.job,
                self.job.nodes,
                self.job.gpus_per_node,
                self.last_checkpoint_ms(now),
                self.job.checkpoint_s,
            )
        ]


def telemetry_steps(data_dir: Path, start_ms: int, end_ms: int) -> Iterator[tuple[int, list[Any]]]:
    """(instant, records at that instant) in time order, read an hour at a time from the dataset.

    Xids and lifecycle events are folded into the next sampling instant at or after them.
    """
    events = read_events(data_dir)
    events = events[(events["ts"] >= start_ms) & (events["ts"] < end_ms)]
    pending = [_record(NodeEvent, r) for r in pa.Table.from_pandas(events, preserve_index=False).to_pylist()]
    for hour in range(start_ms, end_ms, _HOUR_MS):
        stop = min(hour + _HOUR_MS, end_ms)
        by_ts: dict[int, list[Any]] = {}
        for table, cls in _RECORDS.items():
            frame = read_table(data_dir, table, start_ms=hour, end_ms=stop)
            for row in pa.Table.from_pandas(frame, preserve_index=False).to_pylist():
                by_ts.setdefault(row["ts"], []).append(_record(cls, row))
        instants = sorted(t for t in by_ts if any(not isinstance(r, XidEvent) for r in by_ts[t]))
        for ts in sorted(by_ts):
            if ts not in instants:  # an Xid between samples joins the next sample
                later = next((t for t in instants if t > ts), None)
                if later is not None:
                    by_ts[later] = by_ts.pop(ts) + by_ts[later]
        for ts in sorted(by_ts):
            batch = by_ts[ts]
            while pending and pending[0].ts <= ts:
                batch.append(pending.pop(0))
            yield ts, batch
    if pending:
        yield end_ms, pending


def _record(cls: type, row: dict[str, Any]) -> Any:
    return cls(**{k: v for k, v in row.items() if v is not None})


def replay(cfg: ReplayConfig, on_period: Callable[[ReplayState], None] | None = None) -> ReplayState:
    """Run the day; ``on_period`` sees the state after every scoring period (the live view)."""
    state = ReplayState(now_ms=cfg.start_ms - cfg.warmup_ms)
    clock = lambda: state.now_ms  # noqa: E731 - simulated time for the job, the executor and the audit log
    bus = InMemoryBus(partitions=1)  # one partition: one feature engine sees every node (fastest here)
    predictor = RiskService(
        bus,
        OnlineEngines(DEFAULT_FEATURE_SET),
        RegistryModelSource(CHAMPION_URI, cfg.tracking_uri),
        config=ServiceConfig(
            score_every_ms=cfg.score_every_ms, checkpoint_every_ms=math.inf, reload_every_ms=math.inf,
            max_records=100_000,
        ),
        clock=clock,
    ).start()
    names = [f"node{i:04d}" for i in range(cfg.nodes)]
    spares, workers = tuple(names[len(names) - cfg.spares :]), tuple(names[: len(names) - cfg.spares])
    job = PeriodicJob(
        JobView("llm-pretrain", workers, cfg.gpus_per_node, cfg.start_ms - cfg.warmup_ms, cfg.checkpoint_s),
        cfg.checkpoint_every_ms,
        clock,
    )
    state.job = job
    # one confirming record: at a 5-minute scoring period, two records above watch already span 5 minutes
    policy = PolicyConfig(
        watch_at=cfg.watch_at,
        clear_below=cfg.watch_at / 2,
        confirm=1,
        spare_nodes=spares,
        restart_s=cfg.restart_s,
        migration_s=cfg.migration_s,
        max_concurrent_drains=cfg.spares,
    )
    state.engine = MitigationEngine(ExpectedLossPolicy(policy), jobs=job, fleet_size=cfg.nodes, clock=clock)
    for stale in ("", "-wal", "-shm"):  # a fresh audit log per run
        Path(f"{cfg.audit_path}{stale}").unlink(missing_ok=True)
    audit = AuditLog(cfg.audit_path, bus=bus, clock=clock)
    mitigation = MitigationService(
        bus, state.engine, Executor(audit, scheduler=NoScheduler(), dry_run=True, clock=clock)
    )
    next_period = cfg.start_ms - cfg.warmup_ms + cfg.score_every_ms
    try:
        for ts, records in telemetry_steps(cfg.data_dir, cfg.start_ms - cfg.warmup_ms, cfg.end_ms):
            state.now_ms = ts
            state.failures += [
                r
                for r in records
                if isinstance(r, NodeEvent) and r.event == "failed" and r.ts >= cfg.start_ms
            ]
            state.records += len(records)
            publish(bus, records)
            if ts >= next_period or ts >= cfg.end_ms:
                _period(cfg, state, predictor, mitigation)
                next_period = (ts // cfg.score_every_ms + 1) * cfg.score_every_ms
                if on_period is not None:
                    on_period(state)
        _period(cfg, state, predictor, mitigation)
    finally:
        predictor.close()
        audit.close()
    return state


def _period(
    cfg: ReplayConfig, state: ReplayState, predictor: RiskService, mitigation: MitigationService
) -> None:
    """Let the predictor read everything published, then the mitigator act on the new scores."""
    while True:
        for s in predictor.run_once():
            state.latest[s.node] = s
            if s.ts >= cfg.start_ms:
                state.scores.append(s)
        if predictor.lag_records == 0:
            break
    if state.now_ms < cfg.start_ms:  # warm-up: the mitigator skips these scores
        decoded = mitigation.stream.poll(0.0, 1_000_000)
        if decoded:
            mitigation.stream.commit(decoded)
        return
    state.warming_up = False
    before = len(mitigation.outcomes)
    while mitigation.poll_once(0.0):
        pass
    state.outcomes += [(state.now_ms, o) for o in mitigation.outcomes[before:]]
