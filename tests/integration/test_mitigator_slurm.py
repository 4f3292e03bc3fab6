"""The Slurm drain adapter against a real slurmctld/slurmd (tests/fixtures/slurm.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import RiskScore
from foreshock.ingest.stream import now_ms
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.schedulers import SchedulerError, SlurmAdapter
from foreshock.mitigator.service import MitigationService

pytestmark = pytest.mark.integration


def wait_state(cluster, node: str, wanted: set[str], timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster.states()[node]
        if state.rstrip("*") in wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.3)


def test_drain_and_undrain_show_in_sinfo(slurm_cluster):
    adapter = SlurmAdapter(env=slurm_cluster.env)
    adapter.set_drained("node2", True, "foreshock: p=0.93 within 60 min")
    assert slurm_cluster.states()["node2"] == "drained"
    assert slurm_cluster.states()["node1"] == "idle"
    adapter.set_drained("node2", True, "again")  # idempotent
    assert slurm_cluster.states()["node2"] == "drained"
    adapter.set_drained("node2", False, "repaired")
    assert wait_state(slurm_cluster, "node2", {"idle"}).rstrip("*") == "idle"
    adapter.set_drained("node2", False, "repaired")  # resuming an idle node is a success too


def test_unknown_node_is_a_permanent_error(slurm_cluster):
    with pytest.raises(SchedulerError) as err:
        SlurmAdapter(env=slurm_cluster.env).set_drained("node99", True, "x")
    assert err.value.permanent


def test_the_drained_nodes_with_foreshocks_mark_are_read_back(slurm_cluster):
    adapter = SlurmAdapter(env=slurm_cluster.env)
    adapter.set_drained("node1", True, "p=0.9")  # marked "foreshock: p=0.9"
    subprocess.run(["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=operator: bad fan"],
                   env=slurm_cluster.env, check=True, timeout=30)
    try:
        assert adapter.foreshock_drained() == {"node1"}
    finally:
        for node in ("node1", "node2"):
            adapter.set_drained(node, False, "cleanup")


def test_policy_drains_through_slurm_and_dry_run_does_not(slurm_cluster, tmp_path):
    def run(dry_run: bool) -> None:
        engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig()), fleet_size=3)
        executor = Executor(
            AuditLog(tmp_path / f"audit-{dry_run}.sqlite"),
            scheduler=SlurmAdapter(env=slurm_cluster.env),
            dry_run=dry_run,
        )
        service = MitigationService(InMemoryBus(), engine, executor)
        t0 = now_ms()
        for i, p in enumerate([0.9, 0.95]):
            service.handle(RiskScore(node="node3", ts=t0 + i, probability=p, alert=True, threshold=0.8))

    run(dry_run=True)
    assert slurm_cluster.states()["node3"] == "idle"
    run(dry_run=False)
    assert slurm_cluster.states()["node3"] == "drained"
    SlurmAdapter(env=slurm_cluster.env).set_drained("node3", False, "cleanup")
