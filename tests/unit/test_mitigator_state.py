"""The mitigator keeps its promises through restarts and faults (the real-cluster suite: tests/integration).

Each test builds the service twice on one audit log where a restart matters; the schedulers here are
stand-ins that record calls and fail on demand.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import NodeEvent, RiskScore, Topic, decode
from foreshock.ingest.stream import publish
from foreshock.mitigator.audit import AuditLog, AuditUnavailable
from foreshock.mitigator.endpoint import StatusServer
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.jobs import StaticJobs
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.schedulers import SchedulerError
from foreshock.mitigator.service import MitigationService
from tests.unit.test_mitigator_policy import MIN, T0, Clock, RecordingScheduler, feed, job, risk, wait_out


class FaultyScheduler(RecordingScheduler):
    """Fails each drain with ``error`` while ``failing`` (the parts in ``error.done`` take effect)."""

    def __init__(self, error: SchedulerError):
        super().__init__()
        self.error = error
        self.failing = True
        self.attempts = 0

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        self.attempts += 1
        if self.failing:
            raise self.error
        super().set_drained(node, drained, reason)


class BreakableAudit(AuditLog):
    """A real SQLite audit log whose writes fail while ``broken`` (the integration suite fills a disk)."""

    broken = False

    def record(self, event) -> None:
        if self.broken:
            raise AuditUnavailable(f"cannot write the audit log {self.path}: database or disk is full")
        super().record(event)

    def probe(self) -> None:
        if self.broken:
            raise AuditUnavailable("still full")
        super().probe()


def build(tmp_path, *, bus=None, scheduler=None, dry_run=False, clock=None, jobs=(), fleet=10,
          audit_cls=AuditLog, workers=0, **cfg):
    clock = clock or Clock()
    config = PolicyConfig(**{"max_concurrent_drains": 10, "breaker_share": 0.3, **cfg})
    engine = MitigationEngine(ExpectedLossPolicy(config), jobs=StaticJobs(jobs), fleet_size=fleet,
                              clock=clock)
    bus = bus or InMemoryBus()
    executor = Executor(audit_cls(tmp_path / "audit.sqlite", bus=bus, clock=clock), scheduler=scheduler,
                        dry_run=dry_run, clock=clock, monotonic=clock.monotonic, attempts=3, workers=workers)
    return MitigationService(bus, engine, executor, audit_retry_s=0.0)


def storm(nodes, start: int = 0):
    return [risk(n, start + i, p) for i, p in enumerate([0.9, 0.95]) for n in nodes]


def snapshot(service: MitigationService) -> tuple:
    e = service.engine
    views = {n: (v.state, v.draining, v.pinned) for n, v in e.views.items()
             if v.state is not NodeState.HEALTHY}
    return views, len(e.drains_in_window()), e.breaker is not None


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_restart_rebuilds_the_same_state_and_the_breaker_holds_across_it(tmp_path, dry_run):
    nodes = [f"n{i}" for i in range(10)]
    sched = RecordingScheduler()
    first = build(tmp_path, scheduler=sched, dry_run=dry_run)
    feed(first, storm(nodes[:5]))
    before = snapshot(first)
    assert before[1] == 3 and before[2]  # 30 % of 10 drained, the fourth wanted drain tripped the breaker
    first.executor.audit.close()
    second = build(tmp_path, scheduler=sched, dry_run=dry_run, clock=first.engine.clock)
    assert snapshot(second) == before
    feed(second, storm(nodes[5:], start=10))  # the alert storm goes on after the restart
    drained = [n for n, v in second.engine.views.items() if v.state is NodeState.DRAINED]
    assert len(drained) == 3  # never past the breaker's limit, restart or not
    assert sched.calls == ([] if dry_run else [(n, True) for n in drained[:3]])


def test_repaired_returns_a_node_drained_before_the_restart(tmp_path):
    sched = RecordingScheduler()
    first = build(tmp_path, scheduler=sched)
    feed(first, storm(["n1"]))
    second = build(tmp_path, scheduler=sched, clock=first.engine.clock)
    outcomes = feed(second, [NodeEvent(node="n1", ts=T0 + 30 * MIN, event="repaired")])
    assert [(o.action.kind, o.status) for o in outcomes] == [("undrain", "succeeded")]
    assert sched.calls == [("n1", True), ("n1", False)]


def test_an_action_cut_off_by_a_crash_is_closed_as_abandoned_and_resumed(tmp_path):
    down = FaultyScheduler(SchedulerError("slurmctld not responding"))
    first = build(tmp_path, scheduler=down)
    feed(first, storm(["n1"]))
    [drain_id] = {e.action_id for e in first.executor.audit.events() if e.action == "drain"}
    # the process dies here (nothing closes it); the scheduler comes back before the restart
    up = RecordingScheduler()
    second = build(tmp_path, scheduler=up, clock=first.engine.clock)
    assert [a.action_id for a in second.cold_start.resumed] == [drain_id]
    outcomes = wait_out(second, 1)
    assert [(o.action.action_id, o.status) for o in outcomes] == [(drain_id, "succeeded")]
    trail = [e.status for e in second.executor.audit.events(drain_id)]
    assert trail[-3:] == ["abandoned", "started", "succeeded"]
    assert up.calls == [("n1", True)] and second.engine.state("n1") is NodeState.DRAINED


def test_two_crashes_in_a_row_still_resume_the_action_and_strand_no_node(tmp_path):
    down = FaultyScheduler(SchedulerError("slurmctld not responding"))
    first = build(tmp_path, scheduler=down)
    feed(first, storm(["n1"]))
    [drain_id] = {e.action_id for e in first.executor.audit.events() if e.action == "drain"}
    first.executor.audit.close()  # crash 1: the drain is open (failed, will retry)
    second = build(tmp_path, scheduler=down, clock=first.engine.clock)
    assert [a.action_id for a in second.cold_start.resumed] == [drain_id]
    assert [e.status for e in second.executor.audit.events(drain_id)][-1] == "abandoned"
    second.executor.audit.close()  # crash 2: after the abandoned row, before the resumed attempt's first row
    up = RecordingScheduler()
    third = build(tmp_path, scheduler=up, clock=first.engine.clock)
    assert [a.action_id for a in third.cold_start.resumed] == [drain_id]
    assert [(o.action.action_id, o.status) for o in wait_out(third, 1)] == [(drain_id, "succeeded")]
    trail = [e.status for e in third.executor.audit.events(drain_id)]
    assert trail[-4:] == ["abandoned", "abandoned", "started", "succeeded"]
    assert up.calls == [("n1", True)] and third.engine.state("n1") is NodeState.DRAINED
    outcomes = feed(third, [NodeEvent(node="n1", ts=T0 + 30 * MIN, event="repaired")])
    assert [(o.action.kind, o.status) for o in outcomes] == [("undrain", "succeeded")]
    assert third.engine.state("n1") is NodeState.HEALTHY and not third.engine.views["n1"].draining


def test_a_log_that_cannot_be_written_at_start_starts_paused_and_redoes_the_cold_start(tmp_path):
    down = FaultyScheduler(SchedulerError("slurmctld not responding"))
    first = build(tmp_path, scheduler=down)
    feed(first, storm(["n1"]))  # a drain left open by the crash that follows
    [drain_id] = {e.action_id for e in first.executor.audit.events() if e.action == "drain"}
    first.executor.audit.close()

    class ReadOnlyAtStart(BreakableAudit):
        broken = True  # read-only storage: the cold start cannot write its abandoned row

    up = RecordingScheduler()
    second = build(tmp_path, bus=InMemoryBus(), scheduler=up, clock=first.engine.clock,
                   audit_cls=ReadOnlyAtStart)
    assert not second.ready and "full" in second.paused and second.status()["cold_start"] is None
    assert second.poll_once(0.0) == 0 and up.calls == []  # acts on nothing, and does not crash
    second.executor.audit.broken = False
    second.poll_once(0.0)
    wait_out(second, 1)
    assert second.ready and second.status()["cold_start"]["resumed"] == [drain_id]
    assert up.calls == [("n1", True)] and second.engine.state("n1") is NodeState.DRAINED


def test_the_scheduler_state_wins_over_a_lost_audit_log(tmp_path):
    sched = RecordingScheduler()
    sched.drained = {"n4"}  # drained with Foreshock's mark by an earlier mitigator whose log is gone
    service = build(tmp_path, scheduler=sched)
    assert service.engine.state("n4") is NodeState.DRAINED
    assert service.cold_start.drained_by_scheduler == ["n4"]
    assert feed(service, storm(["n4"])) == []  # not drained twice


@pytest.mark.parametrize("ts, why", [(T0 + 10 * 365 * 24 * 60 * MIN, "after its receipt"),
                                     (T0 - 5 * 60 * MIN, "old at receipt")])
def test_a_record_dated_far_from_its_receipt_is_rejected_and_moves_nothing(tmp_path, ts, why):
    bus = InMemoryBus()
    service = build(tmp_path, bus=bus, scheduler=RecordingScheduler(), breaker_share=0.1)
    service.engine.clock.now_ms = T0
    publish(bus, [RiskScore(node="n9", ts=ts, probability=0.99, alert=True, threshold=0.8)])
    while service.poll_once(0.0):
        pass
    [row] = [e for e in service.executor.audit.events() if e.status == "rejected"]
    assert row.node == "n9" and why in row.reason
    [letter] = [decode(Topic.DEADLETTER, m.value)[0] for m in bus.messages(Topic.DEADLETTER)]
    assert why in letter.reason and letter.topic == Topic.RISK
    assert service.status()["rejections"][0]["node"] == "n9"
    # nothing moved: the breaker's window is empty, and n9's own later records still count
    outcomes = feed(service, storm(["n9", "n1"]))
    assert sorted(o.action.node for o in outcomes if o.action.kind == "drain") == ["n9"]
    assert service.metrics.rejected.labels("future" if "after" in why else "stale")._value.get() == 1


def test_a_partial_drain_is_recorded_with_its_parts_and_driven_to_the_end(tmp_path):
    sched = FaultyScheduler(SchedulerError("kubernetes evict n1: 500 Internal", done=("cordon", "taint")))
    service = build(tmp_path, scheduler=sched)
    feed(service, storm(["n1"]))
    rows = service.executor.audit.events()
    [partial] = [e for e in rows if e.status == "partial"]
    assert partial.reason.startswith("done: cordon, taint; not done: kubernetes evict n1: 500")
    assert not [e for e in rows if e.status == "failed"]
    sched.failing = False
    outcomes = wait_out(service, 2)
    assert [(o.action.kind, o.status) for o in outcomes] == [("drain", "succeeded")]
    assert service.engine.state("n1") is NodeState.DRAINED


def test_an_unknown_node_is_a_permanent_error_recorded_once(tmp_path):
    unknown = SchedulerError("scontrol failed (1): Invalid node name specified", permanent=True)
    sched = FaultyScheduler(unknown)
    first = build(tmp_path, scheduler=sched)
    feed(first, storm(["ghost"]))
    feed(first, storm(["ghost"], start=5))
    wait_out(first, 120)
    assert sched.attempts == 1
    failed = [e for e in first.executor.audit.events() if e.status == "failed"]
    assert len(failed) == 1 and failed[0].reason.startswith("permanent: ")
    second = build(tmp_path, scheduler=sched, clock=first.engine.clock)  # and stays known across a restart
    feed(second, storm(["ghost"], start=10))
    assert sched.attempts == 1 and second.status()["unmanageable"] == ["ghost"]


def test_an_audit_log_that_cannot_be_written_pauses_the_service_and_loses_nothing(tmp_path):
    bus = InMemoryBus()
    sched = RecordingScheduler()
    service = build(tmp_path, bus=bus, scheduler=sched, audit_cls=BreakableAudit)
    service.engine.clock.now_ms = T0 + MIN
    service.executor.audit.broken = True
    publish(bus, storm(["n1"]))
    service.poll_once(0.0)
    assert not service.ready and "disk is full" in service.paused
    assert sched.calls == []  # no action without its record
    assert service.poll_once(0.0) == 0  # still paused: acts on nothing
    service.executor.audit.broken = False
    while service.poll_once(0.0):
        pass
    assert service.ready and sched.calls == [("n1", True)]
    drains = [e for e in service.executor.audit.events() if e.action == "drain"]
    assert [e.status for e in drains] == ["planned", "started", "succeeded"]


def test_an_audit_write_failing_after_the_action_pauses_then_repeats_it_once_recorded(tmp_path):
    bus = InMemoryBus()
    sched = RecordingScheduler()
    service = build(tmp_path, bus=bus, scheduler=sched, audit_cls=BreakableAudit)
    service.engine.clock.now_ms = T0 + MIN
    audit = service.executor.audit
    real_set = sched.set_drained

    def drain_then_break(node, drained, reason):
        real_set(node, drained, reason)
        audit.broken = True  # the disk fills between the drain and its outcome

    sched.set_drained = drain_then_break
    publish(bus, storm(["n1"]))
    service.poll_once(0.0)
    assert not service.ready and sched.calls == [("n1", True)]
    audit.broken = False
    sched.set_drained = real_set
    while service.poll_once(0.0):
        pass
    assert service.ready and service.engine.state("n1") is NodeState.DRAINED
    assert [e.status for e in audit.events() if e.action == "drain"][-2:] == ["started", "succeeded"]


def test_the_status_endpoint_shows_every_block(tmp_path):
    service = build(tmp_path, scheduler=RecordingScheduler(), audit_cls=BreakableAudit, breaker_share=0.1,
                    jobs=[job("llm", ["n7", "n8"])])
    feed(service, storm(["n1", "n2", "n7"]))
    server = StatusServer(service).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        status = json.load(urllib.request.urlopen(f"{base}/status", timeout=5))
        assert status["breaker"]["open"] and status["breaker"]["limit"] == 1
        assert status["nodes"]["drained"] == ["n1"] and set(status["nodes"]["mitigating"]) == {"n2", "n7"}
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "foreshock_mitigator_breaker_open 1.0" in metrics
        assert 'foreshock_mitigator_drains_blocked_total{rail="breaker"} 2.0' in metrics
        assert urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200
        service.executor.audit.broken = True
        service.handle(risk("n3", 5, 0.9))
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert err.value.code == 503 and "disk is full" in json.load(err.value)["reason"]
    finally:
        server.stop()
