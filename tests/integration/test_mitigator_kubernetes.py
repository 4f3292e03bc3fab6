"""The Kubernetes adapter through the official ``kubernetes`` client, against the stand-in API
server of tests/fixtures/kube.py (what it proves and what it does not: see there)."""

from __future__ import annotations

import pytest

from foreshock.mitigator.kube import TAINT_KEY, KubernetesAdapter
from foreshock.mitigator.schedulers import SchedulerError

pytestmark = pytest.mark.integration


def test_drain_cordons_taints_and_evicts_only_the_jobs_pods(api_server, core_api):
    KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm").set_drained("gpu-1", True, "p=0.93")
    node = api_server.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is True
    assert {t["key"] for t in node["spec"]["taints"]} == {"nvidia.com/gpu", TAINT_KEY}
    assert node["metadata"]["annotations"][f"{TAINT_KEY}-reason"] == "p=0.93"
    assert sorted(p["metadata"]["name"] for p in api_server.pods) == ["llm-1", "other"]
    assert api_server.nodes["gpu-2"]["spec"].get("unschedulable") is None
    patch = next(r for r in api_server.requests if r[0] == "PATCH")
    assert patch[2] == "application/strategic-merge-patch+json"  # chosen by the real client


def test_drain_twice_is_harmless_and_undrain_restores_the_node(api_server, core_api):
    adapter = KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm")
    adapter.set_drained("gpu-1", True, "risk")
    adapter.set_drained("gpu-1", True, "risk")
    assert [t["key"] for t in api_server.nodes["gpu-1"]["spec"]["taints"]].count(TAINT_KEY) == 1
    adapter.set_drained("gpu-1", False, "repaired")
    node = api_server.nodes["gpu-1"]
    assert node["spec"]["unschedulable"] is False
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu"]


def test_unknown_node_raises_a_scheduler_error(core_api):
    with pytest.raises(SchedulerError, match="404"):
        KubernetesAdapter(core_api).set_drained("gpu-404", True, "risk")
