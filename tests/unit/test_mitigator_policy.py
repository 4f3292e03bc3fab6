"""Policy, engine and executor: hysteresis, safety rails, dry run, idempotent replay."""

from __future__ import annotations

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import MitigationEvent, NodeEvent, RiskScore, Topic, decode
from foreshock.ingest.stream import publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.channels import FileChannel
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.jobs import StaticJobs
from foreshock.mitigator.lifecycle import IllegalTransition, NodeState, check_transition
from foreshock.mitigator.plan import JobView
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.service import MitigationService, breaker_reset_request, pin_request

T0 = 1_700_000_000_000
MIN = 60_000


def risk(node: str, i: int, p: float) -> RiskScore:
    return RiskScore(node=node, ts=T0 + i * MIN, probability=p, alert=p >= 0.8, threshold=0.8)


def job(name: str, nodes: list[str], last_ckpt_ms: int = T0 - 3600_000) -> JobView:
    return JobView(
        job=name, nodes=tuple(nodes), gpus_per_node=8, last_checkpoint_ms=last_ckpt_ms, checkpoint_s=30
    )


class RecordingScheduler:
    """Counts calls; stands for a scheduler in unit tests (the real ones run in tests/integration)."""

    def __init__(self, fail_first: int = 0):
        self.calls: list[tuple[str, bool]] = []
        self.fail_first = fail_first
        self.drained: set[str] = set()

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise RuntimeError("scheduler busy")
        self.calls.append((node, drained))
        (self.drained.add if drained else self.drained.discard)(node)

    def foreshock_drained(self) -> set[str]:
        return set(self.drained)


class Clock:
    """The mitigator's clock in these tests: each record is received at its own time."""

    def __init__(self, now_ms: int = T0):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return self.now_ms / 1000


def rig(tmp_path, jobs, *, dry_run=False, scheduler=None, fleet=100, **cfg):
    config = PolicyConfig(**{"spare_nodes": ("spare0",), **cfg})
    clock = Clock()
    engine = MitigationEngine(
        ExpectedLossPolicy(config), jobs=StaticJobs(jobs), fleet_size=fleet, clock=clock
    )
    bus = InMemoryBus()
    sched = scheduler or RecordingScheduler()
    executor = Executor(
        AuditLog(tmp_path / "audit.sqlite", bus=bus, clock=clock),
        scheduler=sched,
        channel=FileChannel(tmp_path / "control"),
        dry_run=dry_run,
        clock=clock,
        monotonic=clock.monotonic,
    )
    return MitigationService(bus, engine, executor), bus, sched


def feed(service: MitigationService, records) -> list:
    out = []
    for r in records:
        service.engine.clock.now_ms = max(service.engine.clock.now_ms, r.ts)
        out.extend(service.handle(r))
    return out


def wait_out(service: MitigationService, seconds: float) -> list:
    """Let the mitigator's clock run ``seconds`` on, a second at a time, running what falls due."""
    out = []
    for _ in range(int(seconds)):
        service.engine.clock.now_ms += 1000
        out.extend(service.tick())
    return out


def test_lifecycle_table_rejects_skipping_states():
    assert check_transition("n", NodeState.WATCH, NodeState.MITIGATING) is NodeState.MITIGATING
    with pytest.raises(IllegalTransition):
        check_transition("n", NodeState.HEALTHY, NodeState.DRAINED)
    with pytest.raises(IllegalTransition):
        check_transition("n", NodeState.DRAINED, NodeState.HEALTHY)


def test_config_rejects_an_inverted_hysteresis_band():
    with pytest.raises(ValueError):
        PolicyConfig(watch_at=0.2, clear_below=0.3)


def test_sustained_risk_migrates_onto_the_spare_then_drains(tmp_path):
    service, _, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.1, 0.5, 0.9, 0.95])])
    kinds = [(o.action.kind, o.status) for o in outcomes]
    assert kinds == [("migrate", "succeeded"), ("drain", "succeeded")]
    assert outcomes[0].action.replacement == "spare0"
    assert sched.calls == [("n1", True)]
    assert service.engine.state("n1") is NodeState.DRAINED
    command = tmp_path / "control" / "llm" / "commands" / f"{outcomes[0].action.action_id}.json"
    assert '"kind": "leave"' in command.read_text()


def test_flapping_risk_produces_no_flapping_actions(tmp_path):
    service, _, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    flapping = [0.95 if i % 2 else 0.1 for i in range(60)]  # never two paying records in a row
    assert feed(service, [risk("n1", i, p) for i, p in enumerate(flapping)]) == []
    bursts = [0.1, 0.9, 0.9, 0.1, 0.9, 0.9, 0.1] * 8  # mitigates once, then stays out
    outcomes = feed(service, [risk("n1", 100 + i, p) for i, p in enumerate(bursts)])
    assert [o.action.kind for o in outcomes] == ["migrate", "drain"]
    assert sched.calls == [("n1", True)]


def test_risk_that_clears_returns_a_node_to_healthy_only_after_the_clear_streak(tmp_path):
    service, _, _ = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    feed(service, [risk("n1", 0, 0.5)])
    assert service.engine.state("n1") is NodeState.WATCH
    feed(service, [risk("n1", 1, 0.1), risk("n1", 2, 0.1)])
    assert service.engine.state("n1") is NodeState.WATCH
    feed(service, [risk("n1", 3, 0.1)])
    assert service.engine.state("n1") is NodeState.HEALTHY


def test_acting_only_when_expected_loss_exceeds_cost(tmp_path):
    fresh = job("llm", ["n1", "n2", "n3", "n4"], last_ckpt_ms=T0 + 10 * MIN)  # just checkpointed
    service, _, _ = rig(tmp_path, [fresh], restart_s=0.0, migration_s=3600.0)
    assert feed(service, [risk("n1", 10 + i, 0.35) for i in range(6)]) == []
    assert service.engine.state("n1") is NodeState.WATCH


def test_burst_of_alerts_respects_caps_spares_and_job_share(tmp_path):
    nodes = [f"n{i}" for i in range(16)]
    jobs = [job("big", nodes[:8]), job("small", nodes[8:])]
    service, _, sched = rig(
        tmp_path,
        jobs,
        max_concurrent_drains=3,
        max_job_share=0.25,
        spare_nodes=("spare0", "spare1", "spare2"),
        breaker_share=0.5,
    )
    records = [risk(n, i, p) for i, p in enumerate([0.5, 0.9, 0.95]) for n in nodes]
    outcomes = feed(service, records)
    drained = [o.action.node for o in outcomes if o.action.kind == "drain" and o.succeeded]
    migrations = [o.action for o in outcomes if o.action.kind == "migrate"]
    assert len(drained) == 3  # the concurrent-drain cap
    assert len({m.replacement for m in migrations}) == len(migrations) == 3  # one spare each, none twice
    assert (
        sum(n in nodes[:8] for n in drained) <= 2 and sum(n in nodes[8:] for n in drained) <= 2
    )  # job share
    checkpoints = [o.action for o in outcomes if o.action.kind == "checkpoint"]
    assert len(checkpoints) == len(nodes) - 3  # everyone else: checkpoint only
    assert all("checkpoint only" in c.reason for c in checkpoints)
    assert len(sched.calls) == 3


def test_no_free_spare_means_checkpoint_only(tmp_path):
    service, _, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])], spare_nodes=())
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.5, 0.9, 0.95])])
    assert [o.action.kind for o in outcomes] == ["checkpoint"]
    assert "no free spare" in outcomes[0].action.reason
    assert sched.calls == []


def test_circuit_breaker_latches_open_until_an_operator_resets_it(tmp_path):
    nodes = [f"n{i}" for i in range(10)]
    service, bus, sched = rig(tmp_path, [], max_concurrent_drains=10, breaker_share=0.2, fleet=10)
    outcomes = feed(service, [risk(n, i, p) for i, p in enumerate([0.9, 0.95]) for n in nodes])
    assert len([o for o in outcomes if o.action.kind == "drain"]) == 2  # 20 % of a 10-node fleet
    assert service.engine.state("n9") is NodeState.MITIGATING  # wants out, held back by the breaker
    later = feed(service, [risk("n9", 200, 0.9), risk("n9", 201, 0.95)])  # hours on: the window has passed
    assert later == [] and service.engine.breaker is not None  # latched: no drain without a person
    rows = [(e.action, e.status) for e in service.executor.audit.events()]
    assert rows.count(("breaker", "tripped")) == 1
    blocked = [e for e in service.executor.audit.events() if e.status == "blocked"]
    assert {e.node for e in blocked} == set(nodes[2:])  # every node held back has its row, once
    assert all("circuit breaker open" in e.reason for e in blocked)
    assert service.status()["breaker"]["open"] is True
    publish(bus, [breaker_reset_request("checked the fleet", ts=T0 + 202 * MIN)])
    service.engine.clock.now_ms = T0 + 202 * MIN
    while service.poll_once(0.0):
        pass
    assert service.engine.breaker is None
    assert ("breaker", "reset") in [(e.action, e.status) for e in service.executor.audit.events()]
    after = feed(service, [risk("n9", 203, 0.9)])
    assert [(o.action.kind, o.status) for o in after] == [("drain", "succeeded")]
    assert len(sched.calls) == 3


def test_dry_run_acts_on_nothing_but_records_everything(tmp_path):
    service, bus, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])], dry_run=True)
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.5, 0.9, 0.95])])
    assert [(o.action.kind, o.status) for o in outcomes] == [("migrate", "skipped"), ("drain", "skipped")]
    assert sched.calls == []
    assert not (tmp_path / "control").exists()
    events = [e for m in bus.messages(Topic.MITIGATION) for e in decode(Topic.MITIGATION, m.value)]
    assert {(e.action, e.status) for e in events} == {
        ("migrate", "planned"),
        ("migrate", "skipped"),
        ("drain", "planned"),
        ("drain", "skipped"),
    }
    assert all(e.dry_run for e in events)


def test_replayed_risk_stream_acts_once(tmp_path):
    records = [risk(n, i, p) for i, p in enumerate([0.2, 0.5, 0.9, 0.95, 0.97]) for n in ("n1", "n5")]
    jobs = [job("llm", ["n1", "n2", "n3", "n4"])]
    service, bus, sched = rig(tmp_path, jobs)
    service.engine.clock.now_ms = max(r.ts for r in records)
    publish(bus, records)
    while service.poll_once(0.0):
        pass
    publish(bus, records)  # the same stream again (a producer retry)
    while service.poll_once(0.0):
        pass
    # a restarted mitigator (fresh memory, same audit log) reading the stream from the start
    restarted = MitigationService(
        bus,
        MitigationEngine(service.engine.policy, jobs=StaticJobs(jobs), clock=service.engine.clock),
        service.executor,
        group="after-restart",
    )
    while restarted.poll_once(0.0):
        pass
    done = [e for e in service.executor.audit.events() if e.status == "succeeded"]
    assert sorted(e.action for e in done) == ["drain", "drain", "migrate"]
    assert len({e.action_id for e in done}) == len(done)
    assert sorted(sched.calls) == [("n1", True), ("n5", True)]
    assert len(list((tmp_path / "control" / "llm" / "commands").iterdir())) == 1


def test_failed_drain_is_retried_with_backoff_without_holding_the_loop(tmp_path):
    sched = RecordingScheduler(fail_first=2)
    service, _, _ = rig(tmp_path, [], scheduler=sched)
    assert feed(service, [risk("n1", i, p) for i, p in enumerate([0.9, 0.95])]) == []  # handed back at once
    assert service.engine.state("n1") is NodeState.MITIGATING
    [in_flight] = service.status()["in_flight"]
    assert (in_flight["action"], in_flight["attempts"], in_flight["next_attempt_in_s"]) == ("drain", 1, 0.5)
    outcomes = wait_out(service, 3)
    assert [(o.action.kind, o.status) for o in outcomes] == [("drain", "succeeded")]
    trail = [(e.status, e.attempt) for e in service.executor.audit.events(outcomes[0].action.action_id)]
    assert trail == [
        ("planned", 1),
        ("started", 1),
        ("failed", 1),
        ("started", 2),
        ("failed", 2),
        ("started", 3),
        ("succeeded", 3),
    ]
    trail = service.executor.audit.events(outcomes[0].action.action_id)
    failed = [e.reason for e in trail if e.status == "failed"]
    assert [r.rsplit("retry in ", 1)[1] for r in failed] == ["0.5 s", "1 s"]
    assert service.engine.state("n1") is NodeState.DRAINED


def test_a_drain_is_repeated_until_the_scheduler_takes_it_and_the_job_is_told_once(tmp_path):
    sched = RecordingScheduler(fail_first=12)  # a scheduler down for a few minutes
    service, _, _ = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])], scheduler=sched)
    feed(service, [risk("n1", i, p) for i, p in enumerate([0.5, 0.9, 0.95])])
    feed(service, [risk("n1", 3 + i, 0.95) for i in range(5)])  # more alerts while the drain waits
    assert service.engine.state("n1") is NodeState.MITIGATING
    outcomes = wait_out(service, 900)
    assert [(o.action.kind, o.status) for o in outcomes] == [("drain", "succeeded")]
    assert sched.calls == [("n1", True)]
    assert len(list((tmp_path / "control" / "llm" / "commands").iterdir())) == 1  # one leave, never two
    backoffs = [float(e.reason.rsplit("retry in ", 1)[1][:-2]) for e in service.executor.audit.events()
                if e.action == "drain" and e.status == "failed"]
    assert backoffs[:4] == [0.5, 1.0, 2.0, 4.0] and max(backoffs) == 60.0


def test_repair_undrains_and_returns_to_healthy(tmp_path):
    service, _, sched = rig(tmp_path, [])
    feed(service, [risk("n1", i, p) for i, p in enumerate([0.9, 0.95])])
    outcomes = feed(service, [NodeEvent(node="n1", ts=T0 + 50 * MIN, event="repaired")])
    assert [(o.action.kind, o.status) for o in outcomes] == [("undrain", "succeeded")]
    assert sched.calls == [("n1", True), ("n1", False)]
    assert service.engine.state("n1") is NodeState.HEALTHY


def test_pinned_node_is_never_acted_on_until_unpinned(tmp_path):
    service, bus, sched = rig(tmp_path, [])
    service.engine.clock.now_ms = T0 + 4 * MIN
    publish(bus, [pin_request("n1", True, "hands off", ts=T0 - 1)])
    publish(bus, [risk("n1", i, 0.99) for i in range(5)])
    while service.poll_once(0.0):
        pass
    assert sched.calls == []
    publish(bus, [pin_request("n1", False, ts=T0 + 6 * MIN)])
    publish(bus, [risk("n1", 10 + i, 0.99) for i in range(3)])
    service.engine.clock.now_ms = T0 + 12 * MIN
    while service.poll_once(0.0):
        pass
    assert sched.calls == [("n1", True)]
    pins = [
        e for e in service.executor.audit.events() if e.action in ("pin", "unpin") and e.status == "succeeded"
    ]
    assert [e.action for e in pins] == ["pin", "unpin"]
    assert all(isinstance(e, MitigationEvent) for e in pins)


def test_failed_migration_skips_the_drain_and_frees_the_spare(tmp_path):
    service, _, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    service.executor.channel = None  # the job cannot be reached
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.5, 0.9, 0.95])])
    outcomes += wait_out(service, 5)
    assert [(o.action.kind, o.status) for o in outcomes] == [("migrate", "failed"), ("drain", "skipped")]
    assert sched.calls == []
    assert service.engine.state("n1") is NodeState.WATCH
    service.executor.channel = FileChannel(tmp_path / "control")
    retry = feed(service, [risk("n1", 10 + i, 0.95) for i in range(2)]) + wait_out(service, 1)
    assert [(o.action.kind, o.status) for o in retry] == [("migrate", "succeeded"), ("drain", "succeeded")]
    assert retry[0].action.replacement == "spare0"


class _FailedSnapshotAcks:
    """The hook's answer when its state could not be saved (see TrainingHook's durable failures)."""

    def wait(self, command, timeout_s):
        return "failed: snapshot not saved (rank 0: OSError: [Errno 28] No space left on device)"


def test_a_job_that_could_not_save_its_state_is_not_drained_under(tmp_path):
    service, _, sched = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    service.executor.acks = _FailedSnapshotAcks()
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.5, 0.9, 0.95])])
    assert [(o.action.kind, o.status) for o in outcomes] == [("migrate", "failed"), ("drain", "skipped")]
    assert "No space left" in outcomes[0].detail
    assert sched.calls == []
