"""The Kubernetes node-state collector through the official client, against the stand-in API
server of tests/fixtures/kube.py (no kube-apiserver can run here; see there what it proves)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kubernetes import client

from foreshock.ingest.collectors.kube_nodes import KubeNodePoll, node_class
from foreshock.ingest.collectors.node_states import NodeStateCollector
from foreshock.ingest.contract import KUBE_DRAIN_TAINT, Topic, decode
from foreshock.mitigator.kube import KubernetesAdapter

pytestmark = pytest.mark.integration


def _v1node(
    ready: str | None, unschedulable: bool | None = None, taints: tuple[str, ...] = ()
) -> client.V1Node:
    conditions = None if ready is None else [client.V1NodeCondition(type="Ready", status=ready, reason="x")]
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="gpu-9"),
        spec=client.V1NodeSpec(
            unschedulable=unschedulable, taints=[client.V1Taint(key=k, effect="NoSchedule") for k in taints]
        ),
        status=client.V1NodeStatus(conditions=conditions),
    )


@pytest.mark.parametrize(
    ("node", "cls"),
    [
        (_v1node("True"), "up"),
        (_v1node("True", taints=("nvidia.com/gpu",)), "up"),
        (_v1node("True", unschedulable=True), "drained"),
        (_v1node("True", taints=(KUBE_DRAIN_TAINT,)), "drained"),  # uncordoned by hand, still out
        (_v1node("False", unschedulable=True), "down"),
        (_v1node("Unknown"), "down"),
        (_v1node(None), None),
    ],
)
def test_node_class(node, cls):
    assert (node_class(node) or (None,))[0] == cls


def test_mitigator_drain_undrain_and_a_lost_node_become_events(api_server, core_api, tmp_path):
    collector = NodeStateCollector(
        KubeNodePoll(core_api), tmp_path / "state.json", lambda: 1_000, "kubernetes"
    )
    assert collector.collect() == []  # both nodes ready: no "up" for everyone
    adapter = KubernetesAdapter(core_api, pod_selector="foreshock.io/job=llm")
    adapter.set_drained("gpu-1", True, "p=0.93")
    (drained,) = collector.collect()
    assert (drained.node, drained.event, drained.detail) == ("gpu-1", "drained", "kubernetes: cordoned")
    adapter.set_drained("gpu-1", False, "repaired")
    assert [(e.node, e.event) for e in collector.collect()] == [("gpu-1", "repaired")]
    api_server.nodes["gpu-2"]["status"]["conditions"][0].update(status="Unknown", reason="NodeStatusUnknown")
    (down,) = collector.collect()
    assert (down.node, down.event, down.detail) == (
        "gpu-2",
        "down",
        "kubernetes: Ready=Unknown (NodeStatusUnknown)",
    )
    api_server.nodes["gpu-2"]["status"]["conditions"][0].update(status="True", reason="KubeletReady")
    assert [(e.node, e.event) for e in collector.collect()] == [("gpu-2", "up")]
    assert ("GET", "/api/v1/nodes", None) in api_server.requests


def test_an_unreachable_api_server_is_a_failed_poll(tmp_path):
    config = client.Configuration(host="http://127.0.0.1:9")  # discard port: refused
    config.retries = 0
    with client.ApiClient(config) as api_client:
        collector = NodeStateCollector(
            KubeNodePoll(client.CoreV1Api(api_client), timeout_s=2), None, lambda: 0, "k8s"
        )
        assert collector.collect() == [] and collector.failures == 1


def test_collect_cli_reads_the_kubeconfig(api_server, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: stand-in, cluster: {{server: "http://127.0.0.1:{api_server.server_address[1]}"}}}}]
users: [{{name: foreshock, user: {{token: test}}}}]
contexts: [{{name: stand-in, context: {{cluster: stand-in, user: foreshock}}}}]
current-context: stand-in
"""
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    api_server.nodes["gpu-2"]["spec"]["unschedulable"] = True
    result = subprocess.run(  # its own process: the client reads KUBECONFIG when it is imported
        [sys.executable, "-m", "foreshock", "collect", "--source", "kubernetes", "--stdout", "--polls", "1"],
        env={**env, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    records = [decode(Topic.NODE_EVENTS, line.encode())[0] for line in result.stdout.splitlines()]
    assert [(r.node, r.event) for r in records] == [("gpu-2", "drained")]
