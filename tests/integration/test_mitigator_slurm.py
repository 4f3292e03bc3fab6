"""The Slurm drain adapter against a real slurmctld/slurmd (tests/fixtures/slurm.py)."""

from __future__ import annotations

import time

import pytest

from ingest.contract import RiskScore
from mitigator.audit import AuditLog
from mitigator.engine import MitigationEngine
from mitigator.executor import Executor
from mitigator.policy import ExpectedLossPolicy, PolicyConfig
from mitigator.schedulers import SchedulerError, SlurmAdapter

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


def test_unknown_node_is_an_error(slurm_cluster):
    with pytest.raises(SchedulerError):
        SlurmAdapter(env=slurm_cluster.env).set_drained("node99", True, "x")


def test_policy_drains_through_slurm_and_dry_run_does_not(slurm_cluster, tmp_path):
    def run(dry_run: bool) -> None:
        engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig()), fleet_size=3)
        executor = Executor(
            AuditLog(tmp_path / f"audit-{dry_run}.sqlite"),
            scheduler=SlurmAdapter(env=slurm_cluster.env),
            dry_run=dry_run,
        )
        for i, p in enumerate([0.9, 0.95]):
            for o in executor.apply(
                engine.observe(RiskScore(node="node3", ts=1000 + i, probability=p, alert=True, threshold=0.8))
            ):
                engine.settle(o.action, o.succeeded)

    run(dry_run=True)
    assert slurm_cluster.states()["node3"] == "idle"
    run(dry_run=False)
    assert slurm_cluster.states()["node3"] == "drained"
    SlurmAdapter(env=slurm_cluster.env).set_drained("node3", False, "cleanup")
