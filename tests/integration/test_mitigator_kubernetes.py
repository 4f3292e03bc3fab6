"""The Kubernetes adapter through the official ``kubernetes`` client, against a stand-in API server.

No kube-apiserver can run here (no binary in the package sources, no network), so the closest
honest stand-in is a small real HTTP server that implements the four endpoints the adapter uses
— node GET, node PATCH (strategic merge of ``spec.unschedulable``, ``spec.taints``, annotations),
pod list with field/label selectors, and the pod ``eviction`` subresource POST — with the API's
JSON shapes. The official client library does the real work: configuration, URL building,
serialisation, content types, and ``ApiException`` on errors. What the stand-in does not prove:
admission, PodDisruptionBudgets and RBAC of a real cluster.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from mitigator.kube import TAINT_KEY, KubernetesAdapter
from mitigator.schedulers import SchedulerError

pytestmark = pytest.mark.integration


def _node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {},
    }


def _pod(name: str, node: str, job: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "train", "labels": {"foreshock.io/job": job}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {},
    }


class FakeApiServer(ThreadingHTTPServer):
    """State + request log of the stand-in API server."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.nodes = {n: _node(n) for n in ("gpu-1", "gpu-2")}
        self.pods = [
            _pod("llm-0", "gpu-1", "llm"),
            _pod("llm-1", "gpu-2", "llm"),
            _pod("other", "gpu-1", "etl"),
        ]
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, content type


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, what: str) -> None:
        self._send(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "message": f"{what} not found",
                "code": 404,
            },
        )

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def _log(self) -> None:
        self.server.requests.append(
            (self.command, urlparse(self.path).path, self.headers.get("Content-Type"))
        )

    def do_GET(self) -> None:
        self._log()
        url = urlparse(self.path)
        if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", url.path):
            node = self.server.nodes.get(m.group(1))
            return self._send(200, node) if node else self._not_found(f"nodes {m.group(1)!r}")
        if url.path == "/api/v1/pods":
            q = parse_qs(url.query)
            pods = self.server.pods
            for sel in q.get("fieldSelector", []):
                key, value = sel.split("=", 1)
                assert key == "spec.nodeName"
                pods = [p for p in pods if p["spec"]["nodeName"] == value]
            for sel in q.get("labelSelector", []):
                for term in sel.split(","):
                    k, v = term.split("=", 1)
                    pods = [p for p in pods if p["metadata"]["labels"].get(k) == v]
            return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods})
        self._not_found(url.path)

    def do_PATCH(self) -> None:
        self._log()
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", urlparse(self.path).path)
        if not m or m.group(1) not in self.server.nodes:
            return self._not_found(self.path)
        patch, node = self._body(), self.server.nodes[m.group(1)]
        for key, value in patch.get("spec", {}).items():  # strategic merge: these fields replace
            node["spec"][key] = copy.deepcopy(value)
        node["metadata"].setdefault("annotations", {}).update(
            patch.get("metadata", {}).get("annotations", {})
        )
        self._send(200, node)

    def do_POST(self) -> None:
        self._log()
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", urlparse(self.path).path)
        body = self._body()
        if not m or body.get("kind") != "Eviction":
            return self._not_found(self.path)
        ns, name = m.groups()
        before = len(self.server.pods)
        self.server.pods = [
            p
            for p in self.server.pods
            if not (p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name)
        ]
        if len(self.server.pods) == before:
            return self._not_found(f"pods {name!r}")
        self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})


@pytest.fixture
def api_server():
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def core_api(api_server):
    config = client.Configuration(host=f"http://127.0.0.1:{api_server.server_address[1]}")
    with client.ApiClient(config) as api_client:
        yield client.CoreV1Api(api_client)


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
