"""The mitigator against a Kubernetes API server that fails: the stand-in of tests/fixtures/kube.py
with fault injection, driven through the official client (what the stand-in proves: see there).

The service runs with a worker pool, as ``foreshock mitigate`` does, and a 1 s request timeout.
"""

from __future__ import annotations

import time

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import RiskScore
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.kube import TAINT_KEY, KubernetesAdapter
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.service import MitigationService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def service_on(core_api, tmp_path) -> tuple[MitigationService, InMemoryBus]:
    bus = InMemoryBus()
    engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig(max_concurrent_drains=2, breaker_share=0.2)),
                              fleet_size=10)  # two drains an hour at most
    adapter = KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm", timeout_s=1.0)
    executor = Executor(AuditLog(tmp_path / "audit.sqlite"), workers=2, backoff_s=0.2, max_backoff_s=1.0,
                        scheduler=adapter)
    return MitigationService(bus, engine, executor), bus


def alert(bus: InMemoryBus, *nodes: str) -> None:
    t = now_ms()
    publish(bus, [RiskScore(node=n, ts=t + i, probability=0.95, alert=True, threshold=0.8)
                  for n in nodes for i in range(2)])


def run_until(service: MitigationService, done, timeout_s: float) -> float:
    """Poll until ``done()``; returns the longest single pass of the loop."""
    longest, deadline = 0.0, time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, service.status()
        t = time.monotonic()
        service.poll_once(0.05)
        longest = max(longest, time.monotonic() - t)
    return longest


def statuses(service: MitigationService, node: str) -> list[str]:
    return [e.status for e in service.executor.audit.events() if e.node == node and e.action == "drain"]


def test_an_eviction_refused_after_the_cordon_is_audited_as_partial_and_completed_later(
        api_server, core_api, tmp_path):
    api_server.fail[("POST", "/eviction")] = 500
    service, bus = service_on(core_api, tmp_path)
    alert(bus, "gpu-1")
    run_until(service, lambda: "partial" in statuses(service, "gpu-1"), 30)
    [partial] = [e for e in service.executor.audit.events() if e.status == "partial"]
    assert partial.reason.startswith("done: cordon, taint; not done: kubernetes evict gpu-1: 500")
    node = api_server.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True and TAINT_KEY in {t["key"] for t in node["spec"]["taints"]}
    assert "llm-0" in {p["metadata"]["name"] for p in api_server.pods}  # the job's pod still runs there
    assert service.engine.state("gpu-1") is NodeState.MITIGATING  # not "failed": it is still in effect
    del api_server.fail[("POST", "/eviction")]
    run_until(service, lambda: service.engine.state("gpu-1") is NodeState.DRAINED, 30)
    assert statuses(service, "gpu-1")[-1] == "succeeded"
    assert "llm-0" not in {p["metadata"]["name"] for p in api_server.pods}
    service.close()


def test_an_api_server_that_holds_requests_blocks_neither_the_loop_nor_the_other_nodes(
        api_server, core_api, tmp_path):
    api_server.hang["/nodes/gpu-1"] = 5.0  # every request about gpu-1 is held for 5 s
    service, bus = service_on(core_api, tmp_path)
    alert(bus, "gpu-1", "gpu-2")
    longest = run_until(service, lambda: service.engine.state("gpu-2") is NodeState.DRAINED
                        and "failed" in statuses(service, "gpu-1"), 30)
    assert longest < 1.0  # the loop kept polling while gpu-1's requests timed out on a worker
    assert service.engine.state("gpu-1") is NodeState.MITIGATING
    assert any("will retry" in e.reason for e in service.executor.audit.events()
               if e.node == "gpu-1" and e.status == "failed")
    del api_server.hang["/nodes/gpu-1"]
    run_until(service, lambda: service.engine.state("gpu-1") is NodeState.DRAINED, 30)
    drained = [n for n, v in api_server.nodes.items() if v["spec"].get("unschedulable")]
    assert sorted(drained) == ["gpu-1", "gpu-2"]  # the breaker's two, not more
    service.close()
