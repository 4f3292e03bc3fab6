"""Reconciliation while running: each node's desired state against the scheduler's, on a period.

The scheduler here is the recording stand-in of the unit suite; tests/integration/test_mitigator_reconcile.py
runs the same rules against a real Slurm and the Kubernetes stand-in.
"""

from __future__ import annotations

import threading
import time

import pytest

from foreshock.ingest.contract import NodeEvent
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.plan import NodeView
from foreshock.mitigator.reconcile import OBSERVED, compare, desired
from foreshock.mitigator.schedulers import SchedulerError
from foreshock.mitigator.service import MitigationService
from tests.unit.test_mitigator_policy import MIN, T0, RecordingScheduler, feed, wait_out
from tests.unit.test_mitigator_state import build, storm

PERIOD_S = 30  # the service's default reconcile_every_s


@pytest.mark.parametrize("view, shown, busy, gap", [
    (NodeView(state=NodeState.DRAINED, draining=True), False, False, "returned_by_hand"),
    (NodeView(state=NodeState.DRAINED, draining=True), True, False, None),
    (NodeView(state=NodeState.DRAINED, draining=True), False, True, None),  # an action of its own runs
    (NodeView(), True, False, "drained_by_scheduler"),
    (NodeView(state=NodeState.WATCH, hot=1), True, False, "drained_by_scheduler"),
    (NodeView(state=NodeState.MITIGATING), True, False, "drained_by_scheduler"),  # checkpoint only
    (NodeView(state=NodeState.MITIGATING, draining=True), False, False, None),  # migrating: the executor's
    (NodeView(state=NodeState.MITIGATING, draining=True), True, True, None),
    (NodeView(state=NodeState.REPAIRED), True, False, None),  # its undrain is queued or ended for good
    (NodeView(), False, False, None),
])
def test_the_gap_table(view, shown, busy, gap):
    gaps = compare({"n1": view}, {"n1"} if shown else set(), {"n1"} if busy else set())
    assert [g.kind for g in gaps] == ([gap] if gap else [])
    if gap:
        assert gaps[0].view.state is (NodeState.HEALTHY if gap == "returned_by_hand" else NodeState.DRAINED)
        assert desired(gaps[0].view) == ("in_service" if gap == "returned_by_hand" else "drained")


def test_a_node_unknown_to_the_mitigator_and_drained_with_its_mark_is_a_gap():
    assert [(g.node, g.kind) for g in compare({}, {"n7"}, set())] == [("n7", "drained_by_scheduler")]


def reconciled_rows(service: MitigationService) -> list[tuple[str, str, str]]:
    rows = service.executor.audit.events()
    return [(e.node, e.action, e.status) for e in rows if e.reason.startswith(OBSERVED)]


def test_a_drained_node_resumed_by_hand_is_respected_recorded_and_survives_a_restart(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched)
    feed(service, storm(["n1"]))
    assert service.engine.state("n1") is NodeState.DRAINED
    sched.drained.discard("n1")  # an operator resumes it (scontrol update State=RESUME)
    wait_out(service, PERIOD_S + 1)
    assert service.engine.state("n1") is NodeState.HEALTHY and not service.engine.views["n1"].draining
    assert reconciled_rows(service) == [("n1", "undrain", "succeeded")]
    assert sched.calls == [("n1", True)]  # not drained again behind the operator's back
    assert service.metrics.reconciled.labels("returned_by_hand")._value.get() == 1
    status = service.status()
    assert status["reconcile"]["recent"][0]["node"] == "n1" and status["reconcile"]["error"] is None
    assert len(service.engine.drains_in_window()) == 1  # the drain happened: the breaker still counts it
    wait_out(service, 2 * PERIOD_S)
    assert len(reconciled_rows(service)) == 1  # recorded once

    service.executor.audit.close()
    again = build(tmp_path, scheduler=sched, clock=service.engine.clock)
    assert again.engine.state("n1") is NodeState.HEALTHY and again.cold_start.returned_by_hand == []
    outcomes = feed(again, storm(["n1"], start=40))  # a new episode drains it again
    assert [(o.action.kind, o.status) for o in outcomes] == [("drain", "succeeded")]
    assert sched.calls == [("n1", True), ("n1", True)]


def test_a_node_drained_with_foreshocks_mark_elsewhere_is_taken_as_drained_and_repair_returns_it(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, max_concurrent_drains=1)
    sched.drained.add("n5")  # another mitigator instance, or a log lost and replaced
    wait_out(service, PERIOD_S + 1)
    assert service.engine.state("n5") is NodeState.DRAINED
    assert reconciled_rows(service) == [("n5", "drain", "succeeded")]
    feed(service, storm(["n1"], start=5))
    assert service.engine.state("n1") is NodeState.MITIGATING  # n5 holds the only drain slot
    assert [e.reason for e in service.executor.audit.events() if e.status == "blocked"][0].endswith("(cap 1)")
    outcomes = feed(service, [NodeEvent(node="n5", ts=T0 + 10 * MIN, event="repaired")])
    assert [(o.action.kind, o.status) for o in outcomes] == [("undrain", "succeeded")]
    assert sched.calls == [("n5", False)] and service.engine.state("n5") is NodeState.HEALTHY


class UnreadableScheduler(RecordingScheduler):
    """A scheduler whose state cannot be read while ``down`` (slurmctld stopped), drains included."""

    down = False

    def foreshock_drained(self) -> set[str]:
        if self.down:
            raise SchedulerError("sinfo did not answer within 15 s")
        return super().foreshock_drained()


def test_an_unreadable_scheduler_changes_nothing_and_says_so(tmp_path):
    sched = UnreadableScheduler()
    service = build(tmp_path, scheduler=sched)
    feed(service, storm(["n1"]))
    sched.down = True
    wait_out(service, 3 * PERIOD_S)
    assert service.engine.state("n1") is NodeState.DRAINED and reconciled_rows(service) == []
    assert "did not answer" in service.status()["reconcile"]["error"]
    sched.down = False
    wait_out(service, PERIOD_S + 1)
    assert service.status()["reconcile"]["error"] is None and reconciled_rows(service) == []


def test_a_dry_run_never_compares(tmp_path):
    sched = RecordingScheduler()
    service = build(tmp_path, scheduler=sched, dry_run=True)
    feed(service, storm(["n1"]))
    sched.drained.add("n2")
    wait_out(service, 3 * PERIOD_S)
    assert service.engine.state("n1") is NodeState.DRAINED and service.engine.state("n2") is NodeState.HEALTHY
    assert reconciled_rows(service) == [] and service.status()["reconcile"]["every_s"] is None


class SlowReading(RecordingScheduler):
    """Hands back the drained set as it was when a reading began, once ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.reading = threading.Event()

    def foreshock_drained(self) -> set[str]:
        seen = set(self.drained)
        self.reading.set()
        assert self.release.wait(10)
        return seen


def test_a_reading_taken_before_a_drain_ended_does_not_undo_it(tmp_path):
    sched = SlowReading()
    sched.release.set()  # the cold start's reading
    service = build(tmp_path, scheduler=sched, workers=2)
    sched.release.clear()
    service.engine.clock.now_ms += (PERIOD_S + 1) * 1000
    service.tick()  # the reading starts on a worker: n1 is not drained yet
    assert sched.reading.wait(10)
    feed(service, storm(["n1"]))
    deadline = time.monotonic() + 10
    while service.engine.state("n1") is not NodeState.DRAINED:
        assert time.monotonic() < deadline
        service.tick()
    sched.release.set()  # the stale reading arrives: n1 "in service"
    while service.status()["reconcile"]["read_ms"] is None:
        assert time.monotonic() < deadline
        service.tick()
    assert service.engine.state("n1") is NodeState.DRAINED and reconciled_rows(service) == []
    service.close()
