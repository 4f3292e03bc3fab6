"""Reconciliation while running, against a real Slurm (through ``foreshock mitigate`` on a real broker) and
the Kubernetes stand-in (tests/fixtures/kube.py, through the official client).

Operators change nodes by hand at runtime: a node Foreshock drained is resumed, a node is drained with
Foreshock's mark by something other than this mitigator. Each case checks what the scheduler shows
afterwards, what the audit log says, and that the nodes drained never exceed the breaker's limit.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import NodeEvent
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.kube import TAINT_KEY, KubernetesAdapter
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.reconcile import OBSERVED
from foreshock.mitigator.service import MitigationService
from tests.integration.test_mitigator_faults import (  # noqa: F401  (cluster, group: fixtures)
    BREAKER_LIMIT,
    Mitigator,
    alert,
    cluster,
    drained,
    group,
    rows,
    wait_for,
)
from tests.integration.test_mitigator_kube_faults import alert as kube_alert
from tests.integration.test_mitigator_kube_faults import run_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OBSERVED_ROWS = f"reason LIKE '{OBSERVED}%'"


def scontrol(slurm, *args: str) -> None:
    subprocess.run(["scontrol", "update", *args], env=slurm.env, check=True, capture_output=True, timeout=30)


def test_slurm_nodes_changed_by_hand_at_runtime_are_reconciled(kafka_bootstrap, group, cluster, tmp_path):  # noqa: F811
    audit = tmp_path / "audit.sqlite"
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster, "--reconcile-every", "1s").start()
    alert(kafka_bootstrap, "node1")
    wait_for(lambda: drained(cluster) == ["node1"], 60, "node1 drained", mitigator)

    scontrol(cluster, "NodeName=node1", "State=RESUME")  # the operator returns it
    wait_for(lambda: rows(audit, f"node='node1' AND {OBSERVED_ROWS}"), 30, "node1 reconciled", mitigator)
    assert [r[:2] for r in rows(audit, OBSERVED_ROWS)] == [("undrain", "succeeded")]
    assert "node1" in mitigator.status()["nodes"]["healthy"]
    time.sleep(3)  # three more periods: the operator's resume holds, nothing drains it again
    assert drained(cluster) == [] and len(rows(audit, "action='drain' AND status='succeeded'")) == 1

    scontrol(cluster, "NodeName=node2", "State=DRAIN", "Reason=foreshock: drained by another instance")
    wait_for(lambda: rows(audit, f"node='node2' AND {OBSERVED_ROWS}"), 30, "node2 taken in", mitigator)
    status = mitigator.status()
    assert status["nodes"]["drained"] == ["node2"]
    assert [r["kind"] for r in status["reconcile"]["recent"]] == ["returned_by_hand", "drained_by_scheduler"]
    assert status["breaker"]["drains_in_window"] == BREAKER_LIMIT  # node1's drain; node2's was not ours

    cluster.stop_controller()  # an unreadable scheduler is not "every node in service"
    wait_for(lambda: mitigator.status()["reconcile"]["error"], 30, "the reading to fail", mitigator)
    assert mitigator.status()["nodes"]["drained"] == ["node2"] and len(rows(audit, OBSERVED_ROWS)) == 2
    cluster.start_controller()
    wait_for(lambda: mitigator.status()["reconcile"]["error"] is None, 60, "the reading back", mitigator)

    bus = KafkaBus(kafka_bootstrap)
    publish(bus, [NodeEvent(node="node2", ts=now_ms(), event="repaired")])
    bus.flush()
    bus.close()
    wait_for(lambda: drained(cluster) == [], 30, "node2 back in service on repair", mitigator)
    # Slurm shows the node back before the mitigator has written that the undrain succeeded
    wait_for(lambda: rows(audit, "node='node2' AND action='undrain' AND status='succeeded'"), 30,
             "the undrain's outcome", mitigator)
    [undrain] = rows(audit, "node='node2' AND action='undrain' AND status='succeeded'")
    assert undrain[4] == "foreshock: node repaired"
    assert len(rows(audit, OBSERVED_ROWS)) == 2
    mitigator.stop()


def kube_service(core_api, tmp_path) -> tuple[MitigationService, InMemoryBus]:
    bus = InMemoryBus()
    engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig(max_concurrent_drains=1, breaker_share=0.5)),
                              fleet_size=2)  # one drain an hour at most
    adapter = KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm", timeout_s=1.0)
    executor = Executor(AuditLog(tmp_path / "audit.sqlite"), workers=2, backoff_s=0.2, max_backoff_s=1.0,
                        scheduler=adapter)
    return MitigationService(bus, engine, executor, reconcile_every_s=0.2), bus


def observed_rows(service: MitigationService) -> list[tuple[str, str]]:
    return [(e.node, e.action) for e in service.executor.audit.events() if e.reason.startswith(OBSERVED)]


def cordoned(api_server) -> list[str]:
    return sorted(n for n, v in api_server.nodes.items() if v["spec"].get("unschedulable"))


def test_kubernetes_nodes_changed_by_hand_at_runtime_are_reconciled(api_server, core_api, tmp_path):
    service, bus = kube_service(core_api, tmp_path)
    kube_alert(bus, "gpu-1")
    run_until(service, lambda: service.engine.state("gpu-1") is NodeState.DRAINED, 30)
    assert cordoned(api_server) == ["gpu-1"]

    # the operator returns gpu-1: the taint removed and the node uncordoned
    taints = [t for t in api_server.nodes["gpu-1"]["spec"]["taints"] if t["key"] != TAINT_KEY]
    core_api.patch_node("gpu-1", {"spec": {"unschedulable": False, "taints": taints}})
    run_until(service, lambda: observed_rows(service), 30)
    assert observed_rows(service) == [("gpu-1", "undrain")]
    assert service.engine.state("gpu-1") is NodeState.HEALTHY

    api_server.fail[("GET", "/api/v1/nodes")] = 500  # readings fail: nothing changes
    run_until(service, lambda: service.status()["reconcile"]["error"], 30)
    del api_server.fail[("GET", "/api/v1/nodes")]

    # gpu-2 is tainted with Foreshock's taint by something other than this mitigator
    ours = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    core_api.patch_node("gpu-2", {"spec": {"taints": [*api_server.nodes["gpu-2"]["spec"]["taints"], ours]}})
    run_until(service, lambda: len(observed_rows(service)) == 2, 30)
    assert observed_rows(service)[1] == ("gpu-2", "drain")
    assert service.engine.state("gpu-2") is NodeState.DRAINED
    kube_alert(bus, "gpu-1")  # a new episode on gpu-1: the breaker's one drain an hour is spent
    run_until(service, lambda: any(e.status == "blocked" for e in service.executor.audit.events()), 30)
    assert cordoned(api_server) == [] and service.engine.state("gpu-1") is NodeState.MITIGATING
    planned = [e for e in service.executor.audit.events() if e.action == "drain" and e.status == "planned"]
    assert len(planned) == 1  # never past the breaker's limit
    service.close()
