"""The Slurm node-state collector against a real slurmctld/slurmd (tests/fixtures/slurm.py)."""

from __future__ import annotations

import subprocess
import time

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.ingest.collectors.node_states import NodeStateCollector
from foreshock.ingest.collectors.slurm import SinfoPoll
from foreshock.ingest.contract import Topic, decode

pytestmark = pytest.mark.integration


def scontrol(cluster, *args: str) -> None:
    subprocess.run(
        ["scontrol", "update", *args], env=cluster.env, check=True, timeout=30, capture_output=True
    )


def wait_until(cluster, node: str, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while cluster.states()[node].rstrip("*") != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} stayed {cluster.states()[node]}, wanted {state}")
        time.sleep(0.3)


def test_drain_and_resume_become_drained_and_repaired(slurm_cluster, tmp_path):
    state = tmp_path / "slurm-state.json"
    collector = NodeStateCollector(SinfoPoll(env=slurm_cluster.env), state, lambda: 1_000, "slurm")
    assert collector.collect() == []  # every node idle: nothing to say, no "up" for everyone
    scontrol(slurm_cluster, "NodeName=node2", "State=DRAIN", "Reason=foreshock test")
    drained = collector.collect()
    assert [(e.node, e.event, e.detail) for e in drained] == [("node2", "drained", "slurm: state drained")]
    scontrol(slurm_cluster, "NodeName=node2", "State=RESUME")
    wait_until(slurm_cluster, "node2", "idle")
    assert [(e.node, e.event) for e in collector.collect()] == [("node2", "repaired")]
    assert collector.collect() == []
    collector.drain()

    # drained and resumed while no collector ran: a new one, on the same state file, still says so
    scontrol(slurm_cluster, "NodeName=node3", "State=DRAIN", "Reason=foreshock test")
    later = NodeStateCollector(SinfoPoll(env=slurm_cluster.env), state, lambda: 2_000, "slurm")
    assert [(e.node, e.event) for e in later.collect()] == [("node3", "drained")]
    later.drain()
    scontrol(slurm_cluster, "NodeName=node3", "State=RESUME")
    wait_until(slurm_cluster, "node3", "idle")
    after_restart = NodeStateCollector(SinfoPoll(env=slurm_cluster.env), state, lambda: 3_000, "slurm")
    assert [(e.node, e.event) for e in after_restart.collect()] == [("node3", "repaired")]


def test_collect_cli_prints_node_events(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    scontrol(slurm_cluster, "NodeName=node1", "State=DRAIN", "Reason=foreshock cli test")
    try:
        result = CliRunner().invoke(
            app,
            [
                "collect",
                "--source",
                "slurm",
                "--stdout",
                "--polls",
                "1",
                "--path",
                str(tmp_path / "state.json"),
            ],
        )
    finally:
        scontrol(slurm_cluster, "NodeName=node1", "State=RESUME")
    assert result.exit_code == 0, result.output
    records = [decode(Topic.NODE_EVENTS, line.encode())[0] for line in result.stdout.splitlines()]
    assert [(r.node, r.event) for r in records] == [("node1", "drained")]
    assert '"node1": "drained"' in (tmp_path / "state.json").read_text()


def test_the_mitigators_drain_is_closed_by_the_collectors_repaired(slurm_cluster, tmp_path):
    """Mitigator drains through Slurm, an operator resumes the repaired node, the collector's
    ``repaired`` event brings the mitigator's view of it back (the loop no simulator closes here)."""
    from foreshock.ingest.bus import InMemoryBus
    from foreshock.ingest.contract import RiskScore
    from foreshock.mitigator.audit import AuditLog
    from foreshock.mitigator.engine import MitigationEngine
    from foreshock.mitigator.executor import Executor
    from foreshock.mitigator.lifecycle import NodeState
    from foreshock.mitigator.schedulers import SlurmAdapter
    from foreshock.mitigator.service import MitigationService

    engine = MitigationEngine(fleet_size=3, clock=lambda: 2_000)  # received when scored
    executor = Executor(AuditLog(tmp_path / "audit.sqlite"), scheduler=SlurmAdapter(env=slurm_cluster.env))
    service = MitigationService(InMemoryBus(), engine, executor)
    poll = SinfoPoll(env=slurm_cluster.env)
    collector = NodeStateCollector(poll, tmp_path / "state.json", lambda: 5_000, "slurm")
    collector.collect()
    for i, p in enumerate([0.9, 0.95]):
        service.handle(RiskScore(node="node3", ts=1_000 + i, probability=p, alert=True, threshold=0.8))
    assert engine.state("node3") is NodeState.DRAINED
    assert [(e.node, e.event) for e in collector.collect()] == [("node3", "drained")]
    scontrol(slurm_cluster, "NodeName=node3", "State=RESUME")  # the operator, after the repair
    wait_until(slurm_cluster, "node3", "idle")
    (repaired,) = collector.collect()
    assert (repaired.node, repaired.event) == ("node3", "repaired")
    outcomes = service.handle(repaired)
    assert [o.action.kind for o in outcomes] == ["undrain"] and all(o.succeeded for o in outcomes)
    assert engine.state("node3") is NodeState.HEALTHY  # undrained, settled: back in the fleet
    assert slurm_cluster.states()["node3"].rstrip("*") == "idle"
