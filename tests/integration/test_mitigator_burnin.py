"""The burn-in on a real Slurm (``foreshock mitigate`` as its own process, on a real broker) and on the
Kubernetes stand-in (tests/fixtures/kube.py, through the official client).

A node that fails twice and comes back stays drained, with Foreshock's burn-in reason, across a
SIGKILL and a restart, until its burn-in passes; another is returned at once by an operator's
``foreshock mitigate --clear-burn-in``. On Kubernetes the node stays cordoned and tainted until it
passes.
"""

from __future__ import annotations

import subprocess
import sys
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
from foreshock.mitigator.service import MitigationService
from foreshock.models.reliability import BurnIn
from tests.integration.test_mitigator_faults import (  # noqa: F401  (cluster, group: fixtures)
    Mitigator,
    cluster,
    group,
    rows,
    wait_for,
)
from tests.integration.test_mitigator_kube_faults import run_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BURN_IN_S = 40  # long enough to kill and restart the mitigator inside it, on a busy machine


def lemon_events(node: str) -> list[NodeEvent]:
    """Two failures, each followed by the node's return: the second return calls for a burn-in."""
    t = now_ms()
    return [NodeEvent(node=node, ts=t, event="failed"), NodeEvent(node=node, ts=t + 1, event="repaired"),
            NodeEvent(node=node, ts=t + 2, event="failed"), NodeEvent(node=node, ts=t + 3, event="repaired")]


def send(bootstrap: str, records: list) -> None:
    bus = KafkaBus(bootstrap)
    publish(bus, records)
    bus.flush()
    bus.close()


def slurm_reasons(slurm) -> dict[str, tuple[str, str]]:
    out = subprocess.run(["sinfo", "-N", "-h", "-o", "%N|%T|%E"], capture_output=True, text=True,
                         env=slurm.env, check=True, timeout=30).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


def test_slurm_keeps_a_burning_in_node_drained_across_a_restart_until_it_passes_or_is_cleared(
        kafka_bootstrap, group, cluster, tmp_path):  # noqa: F811
    audit = tmp_path / "audit.sqlite"
    args = ("--burn-in", f"{BURN_IN_S}s", "--burn-in-failures", "2", "--burn-in-window", "30d")
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster, *args).start()
    send(kafka_bootstrap, lemon_events("node2"))
    wait_for(lambda: mitigator.status()["nodes"].get("burn_in") == ["node2"], 60, "node2 in burn-in",
             mitigator)
    wait_for(lambda: "drain" in slurm_reasons(cluster)["node2"][0], 30, "node2 drained", mitigator)
    state, reason = slurm_reasons(cluster)["node2"]
    assert reason == "foreshock: burn-in: 2 failures within 30 d; back after 40 s without a fault"
    [entry] = mitigator.status()["burn_in"]["nodes"]
    assert entry["node"] == "node2" and entry["until_ms"] - entry["since_ms"] == BURN_IN_S * 1000
    assert [r[:2] for r in rows(audit, "node='node2' AND action='fault'")] == [("fault", "observed")] * 2

    mitigator.kill()  # SIGKILL inside the burn-in; the restart reads it back from the audit log
    mitigator.start()
    assert mitigator.status()["burn_in"]["nodes"] == [entry]
    assert mitigator.status()["cold_start"]["nodes"] == {"burn_in": 1}
    assert "drain" in slurm_reasons(cluster)["node2"][0]

    send(kafka_bootstrap, lemon_events("node3"))  # a second lemon, cleared by an operator
    wait_for(lambda: "drain" in slurm_reasons(cluster)["node3"][0], 60, "node3 drained", mitigator)
    clear = subprocess.run([sys.executable, "-m", "foreshock", "mitigate", "--kafka", kafka_bootstrap,
                            "--clear-burn-in", "node3"], capture_output=True, text=True, timeout=120,
                           env=cluster.env)
    assert clear.returncode == 0 and "burn-in clear request for node3 published" in clear.stdout
    wait_for(lambda: slurm_reasons(cluster)["node3"][0] == "idle", 60, "node3 back in service", mitigator)
    [cleared] = rows(audit, "node='node3' AND action='undrain' AND status='planned'")
    assert cleared[4] == "operator: cli: burn-in cleared"
    assert "drain" in slurm_reasons(cluster)["node2"][0]  # the operator cleared node3, not node2

    deadline = entry["until_ms"] / 1000 - time.time()
    assert deadline > 0, "the restart took longer than the burn-in: raise BURN_IN_S"
    wait_for(lambda: slurm_reasons(cluster)["node2"][0] == "idle", deadline + 60, "node2 to pass", mitigator)
    assert now_ms() >= entry["until_ms"]
    [passed] = rows(audit, "node='node2' AND action='undrain' AND status='planned'")
    assert passed[4].startswith("foreshock: burn-in passed: ")
    status = mitigator.status()
    assert status["burn_in"]["nodes"] == [] and {"node2", "node3"} <= set(status["nodes"]["healthy"])
    assert status["breaker"]["drains_in_window"] == 0  # burn-ins are not predicted drains
    mitigator.stop()


def kube_service(core_api, tmp_path, length_s: float) -> tuple[MitigationService, InMemoryBus]:
    bus = InMemoryBus()
    rule = BurnIn(failures=2, window_s=30 * 86400, length_s=length_s)
    engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig(burn_in=rule)), fleet_size=2)
    adapter = KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm", timeout_s=1.0)
    executor = Executor(AuditLog(tmp_path / "audit.sqlite"), workers=2, backoff_s=0.2, max_backoff_s=1.0,
                        scheduler=adapter)
    return MitigationService(bus, engine, executor, reconcile_every_s=0.2), bus


def out_of_service(api_server, node: str) -> bool:
    spec = api_server.nodes[node]["spec"]
    return bool(spec.get("unschedulable")) and any(t["key"] == TAINT_KEY for t in spec.get("taints") or [])


def test_kubernetes_keeps_a_burning_in_node_cordoned_and_tainted_until_it_passes(api_server, core_api,
                                                                                  tmp_path):
    service, bus = kube_service(core_api, tmp_path, length_s=3.0)
    publish(bus, lemon_events("gpu-1"))
    run_until(service, lambda: service.engine.state("gpu-1") is NodeState.BURN_IN
              and not service.executor.busy(), 30)
    assert out_of_service(api_server, "gpu-1") and not out_of_service(api_server, "gpu-2")
    started = time.monotonic()
    run_until(service, lambda: service.engine.state("gpu-1") is NodeState.HEALTHY, 30)
    assert time.monotonic() - started > 2.0  # it waited out its burn-in (reconciliation left it alone)
    assert not out_of_service(api_server, "gpu-1")
    kinds = [(e.action, e.status) for e in service.executor.audit.events() if e.node == "gpu-1"
             and e.action in ("drain", "undrain")]
    assert kinds == [("drain", "planned"), ("drain", "started"), ("drain", "succeeded"),
                     ("undrain", "planned"), ("undrain", "started"), ("undrain", "succeeded")]
    service.close()
