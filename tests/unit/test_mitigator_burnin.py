"""The mitigator's burn-in: a node back from a repeat failure stays drained, out of the spare pool and
off every job, until it passes or an operator clears it; its history and its burn-in survive a
restart (the real Slurm and Kubernetes cases run in tests/integration/test_mitigator_burnin.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.ingest.contract import NodeEvent
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.policy import PolicyConfig
from foreshock.mitigator.service import MitigationService, burn_in_clear_request
from foreshock.models.reliability import SECONDS_PER_DAY, BurnIn
from tests.unit.test_mitigator_policy import MIN, T0, RecordingScheduler, feed, job
from tests.unit.test_mitigator_state import build, storm

H = 60 * MIN
RULE = BurnIn(failures=2, window_s=30 * SECONDS_PER_DAY, length_s=24 * 3600)


def event(node: str, at: int, kind: str = "failed", detail: str | None = None) -> NodeEvent:
    return NodeEvent(node=node, ts=at, event=kind, detail=detail)


def lemon(node: str = "n1", start: int = T0, back: str = "repaired") -> list[NodeEvent]:
    """Two failures five hours apart, each repaired an hour later."""
    return [event(node, start), event(node, start + H, back), event(node, start + 5 * H),
            event(node, start + 6 * H, back)]


def rows(service: MitigationService, node: str = "n1") -> list[tuple[str, str, str]]:
    return [(e.action, e.status, e.reason) for e in service.executor.audit.events() if e.node == node]


def advance(service: MitigationService, ms: int) -> None:
    service.engine.clock.now_ms += ms
    service.tick()


@pytest.mark.parametrize("back", ["repaired", "up"])
def test_a_node_back_from_its_second_failure_burns_in_then_returns(tmp_path, back):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(service, lemon(back=back)[:2])
    assert service.engine.state("n1") is NodeState.HEALTHY and sched.calls == []  # one failure: no burn-in
    feed(service, lemon(back=back)[2:])
    assert service.engine.state("n1") is NodeState.BURN_IN and sched.calls == [("n1", True)]
    trail = rows(service)
    assert [r[:2] for r in trail] == [("fault", "observed"), ("fault", "observed"), ("drain", "planned"),
                                      ("drain", "started"), ("drain", "succeeded")]
    assert trail[0][2] == "node event failed"
    assert trail[2][2] == "foreshock: burn-in: 2 failures within 30 d; back after 24 h without a fault"
    advance(service, 24 * H - 1000)
    assert service.engine.state("n1") is NodeState.BURN_IN and len(sched.calls) == 1
    advance(service, 1000)
    assert service.engine.state("n1") is NodeState.HEALTHY and sched.calls[-1] == ("n1", False)
    undrain = [r for r in rows(service) if r[0] == "undrain"]
    assert [r[1] for r in undrain] == ["planned", "started", "succeeded"]
    assert undrain[0][2] == "foreshock: burn-in passed: 24 h back without a fault"
    assert service.engine.drains_in_window() == []  # a burn-in is no predicted drain: the breaker ignores it


def test_a_node_in_burn_in_is_no_spare_and_never_takes_a_migration(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, burn_in=RULE, spare_nodes=("s1",),
                    jobs=[job("llm", ["n1", "n2", "n3", "n4"])])
    assert service.engine.free_spares() == ["s1"]
    feed(service, lemon("s1"))
    assert service.engine.state("s1") is NodeState.BURN_IN and service.engine.free_spares() == []
    feed(service, storm(["n1"], start=7 * 60))
    planned = [(e.action, e.reason) for e in service.executor.audit.events() if e.node == "n1"
               and e.status in ("planned", "blocked")]
    assert [p[0] for p in planned] == ["drain", "checkpoint"]  # the drain blocked, a checkpoint instead
    assert planned[0][1] == "no free spare" and planned[1][1].endswith("checkpoint only: no free spare")
    assert ("s1", False) not in sched.calls
    advance(service, 24 * H)
    assert service.engine.state("s1") is NodeState.HEALTHY and service.engine.free_spares() == ["s1"]


def test_a_fault_during_the_burn_in_sends_the_node_to_repair_and_its_return_starts_another(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(service, lemon())
    first = service.engine.views["n1"].burn_in_since
    feed(service, [event("n1", T0 + 8 * H, "down", detail="Ready=False")])
    assert service.engine.state("n1") is NodeState.DRAINED and len(sched.calls) == 1  # still drained
    assert rows(service)[-1][:3] == ("fault", "observed", "node event down: Ready=False")
    feed(service, [event("n1", T0 + 8 * H + MIN, "failed")])  # the same failure seen twice: counted once
    assert len([r for r in rows(service) if r[0] == "fault"]) == 3
    service.engine.clock.now_ms = T0 + 10 * H
    feed(service, [event("n1", T0 + 10 * H, "up")])
    assert service.engine.state("n1") is NodeState.BURN_IN
    assert service.engine.views["n1"].burn_in_since > first and sched.calls == [("n1", True), ("n1", True)]
    assert rows(service)[-3][2].startswith("foreshock: burn-in: 3 failures within 30 d")
    advance(service, 24 * H - 2 * H)  # the first burn-in would have ended by now; this one has not
    assert service.engine.state("n1") is NodeState.BURN_IN
    assert service.metrics.burn_ins.labels("failed")._value.get() == 1


def test_an_operator_clears_a_burn_in_and_that_failure_never_starts_another(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(service, lemon())
    ts = service.engine.clock.now_ms + MIN
    feed(service, [burn_in_clear_request("n1", reason="cli", ts=ts)])
    assert service.engine.state("n1") is NodeState.HEALTHY and sched.calls == [("n1", True), ("n1", False)]
    undrain = [r for r in rows(service) if r[0] == "undrain"]
    assert undrain[0][1:] == ("planned", "operator: cli: burn-in cleared")
    feed(service, [event("n1", ts + MIN, "repaired")])  # the node-state collector saw it come back
    assert service.engine.state("n1") is NodeState.HEALTHY and len(sched.calls) == 2
    before = len(service.executor.audit.events())
    feed(service, [burn_in_clear_request("n2", reason="cli", ts=ts + 2 * MIN)])  # in no burn-in: ignored
    assert len(service.executor.audit.events()) == before and service.engine.state("n2") is NodeState.HEALTHY
    assert service.metrics.burn_ins.labels("cleared")._value.get() == 1


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_burn_in_and_the_failures_before_it_survive_restarts(tmp_path, dry_run):
    sched = RecordingScheduler()
    first = build(tmp_path, scheduler=sched, burn_in=RULE, dry_run=dry_run)
    feed(first, lemon()[:2])  # one failure, then a restart
    first.executor.audit.close()
    second = build(tmp_path, scheduler=sched, burn_in=RULE, dry_run=dry_run, clock=first.engine.clock)
    assert second.engine.views["n1"].faults == (T0,)
    feed(second, lemon()[2:])  # the second failure: the history read back calls for a burn-in
    view = second.engine.views["n1"]
    assert view.state is NodeState.BURN_IN
    second.executor.audit.close()
    third = build(tmp_path, scheduler=sched, burn_in=RULE, dry_run=dry_run, clock=first.engine.clock)
    assert third.engine.views["n1"] == view  # since when, after which failure, which failures
    since = view.burn_in_since
    assert third.status()["burn_in"]["nodes"] == [
        {"node": "n1", "since_ms": since, "until_ms": since + 24 * H, "failures": 2}]
    feed(third, [event("n1", T0 + 6 * H + MIN, "repaired")])  # a repeated return: no second burn-in
    advance(third, 24 * H)
    assert third.engine.state("n1") is NodeState.HEALTHY
    assert sched.calls == ([] if dry_run else [("n1", True), ("n1", False)])


def test_drains_on_risk_count_as_failures_across_a_restart(tmp_path):
    sched = RecordingScheduler()
    first = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(first, storm(["n1"]))
    feed(first, [event("n1", T0 + 10 * MIN, "failed")])  # it failed while drained: the same failure
    feed(first, [event("n1", T0 + H, "repaired")])
    assert first.engine.state("n1") is NodeState.HEALTHY  # one failure: an ordinary return
    assert first.engine.views["n1"].faults == (T0 + MIN,)  # dated by the record that triggered the drain
    first.executor.audit.close()
    second = build(tmp_path, scheduler=sched, burn_in=RULE, clock=first.engine.clock)
    assert second.engine.views["n1"].faults == (T0 + MIN,)  # read back from the log
    feed(second, storm(["n1"], start=2 * 60))
    feed(second, [event("n1", T0 + 3 * H, "repaired")])
    assert second.engine.state("n1") is NodeState.BURN_IN
    assert sched.calls == [("n1", True), ("n1", False), ("n1", True), ("n1", True)]


def test_a_node_returned_by_hand_during_its_burn_in_is_respected(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(service, lemon())
    sched.drained.discard("n1")  # the operator resumed it in the scheduler
    advance(service, 31_000)  # a reconciliation period: the reading is taken and compared
    assert service.engine.state("n1") is NodeState.HEALTHY
    assert rows(service)[-1][:2] == ("undrain", "succeeded") and rows(service)[-1][2].startswith("observed: ")
    feed(service, [event("n1", service.engine.clock.now_ms, "repaired")])
    assert service.engine.state("n1") is NodeState.HEALTHY and len(sched.calls) == 1


def test_without_a_rule_nodes_return_as_before_and_a_restart_ends_old_burn_ins(tmp_path):
    sched = RecordingScheduler()
    first = build(tmp_path, scheduler=sched, burn_in=RULE)
    feed(first, lemon())
    first.executor.audit.close()
    second = build(tmp_path, scheduler=sched, burn_in=None, clock=first.engine.clock)
    assert second.engine.state("n1") is NodeState.BURN_IN
    second.tick()  # started without a burn-in: every burn-in is over
    assert second.engine.state("n1") is NodeState.HEALTHY and sched.calls == [("n1", True), ("n1", False)]
    feed(second, lemon("n2", start=T0 + 7 * H))
    assert second.engine.state("n2") is NodeState.HEALTHY and second.status()["burn_in"]["rule"] is None


def test_status_and_metrics_show_the_burn_in(tmp_path):
    service = build(tmp_path, scheduler=RecordingScheduler(), burn_in=RULE)
    feed(service, lemon())
    status = service.status()
    assert status["nodes"]["burn_in"] == ["n1"]
    assert status["burn_in"]["rule"] == {"failures": 2, "window_s": 30 * SECONDS_PER_DAY, "length_s": 86400}
    metrics = service.render_metrics().decode()
    assert 'foreshock_mitigator_burn_ins_total{outcome="started"} 1.0' in metrics
    assert 'foreshock_mitigator_nodes{state="burn_in"} 1.0' in metrics
    assert "foreshock_mitigator_faults_total 2.0" in metrics
    assert "foreshock_mitigator_spares_free 0.0" in metrics


def test_a_rule_counting_more_failures_than_a_view_keeps_is_refused():
    with pytest.raises(ValueError, match="at most 16 failures"):
        PolicyConfig(burn_in=BurnIn(failures=17, window_s=86400, length_s=3600))


def test_cli_refuses_a_bad_burn_in_before_connecting():
    result = CliRunner().invoke(app, ["mitigate", "--kafka", "127.0.0.1:1", "--burn-in-failures", "0"])
    assert result.exit_code == 2 and "burn-in needs failures >= 1" in result.output
    result = CliRunner().invoke(app, ["mitigate", "--kafka", "127.0.0.1:1", "--burn-in-window", "soon"])
    assert result.exit_code == 2 and "not a duration" in result.output
