"""deploy/kubernetes/'s RBAC grants exactly what the Kubernetes adapters call, so the two cannot drift.

The adapter tests (the mitigator's KubernetesAdapter, its fault suite, and the node-state
collector) run in a child pytest against the Kubernetes stand-in server (tests/fixtures/kube.py),
which writes down every request it receives. Each request becomes the RBAC rule it needs (API
group, resource or subresource, verb); the ClusterRoles must allow every one of them and grant
nothing that none of them uses. The node-state collector's own role is checked against one poll
of it alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ADAPTER_TESTS = ["tests/integration/test_mitigator_kubernetes.py",
                 "tests/integration/test_mitigator_kube_faults.py",
                 "tests/integration/test_collectors_kubernetes.py"]
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def needs(method: str, path: str) -> tuple[str, str, str]:
    """The (API group, resource[/subresource], verb) an API request is authorised against."""
    m = re.fullmatch(r"/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/[^/]+)?/([^/]+)"
                     r"(?:/([^/]+)(?:/([^/]+))?)?", path)
    assert m, f"not a resource path: {path}"
    group, resource, name, sub = m.groups()
    verb = ("get" if name else "list") if method == "GET" else _VERBS[method]
    return group or "", f"{resource}/{sub}" if sub else resource, verb


def granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def roles() -> dict[str, dict]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "20-rbac.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d and d["kind"] == "ClusterRole"}


def test_needs_reads_paths_as_the_api_server_authorises_them():
    assert needs("GET", "/api/v1/nodes") == ("", "nodes", "list")
    assert needs("PATCH", "/api/v1/nodes/gpu-1") == ("", "nodes", "patch")
    assert needs("POST", "/api/v1/namespaces/train/pods/llm-0/eviction") == ("", "pods/eviction", "create")
    assert needs("GET", "/apis/apps/v1/namespaces/x/deployments/y") == ("apps", "deployments", "get")


def test_the_roles_grant_exactly_what_the_adapter_tests_call(tmp_path):
    calls = tmp_path / "calls.jsonl"
    # Without hypothesis's plugin, which these tests do not use: on a fresh install the child
    # rewrote its modules' asserts and CPython 3.11.7 failed with "AST constructor recursion depth
    # mismatch" once in a suite run.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:hypothesispytest", *ADAPTER_TESTS],
                         cwd=ROOT, env={**os.environ, "FORESHOCK_KUBE_CALLS": str(calls)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    used = {needs(*json.loads(line)) for line in calls.read_text().splitlines()}
    allowed = set().union(*(granted(r) for r in roles().values()))
    assert used - allowed == set(), "the adapters call what no role grants"
    assert allowed - used == set(), "a role grants what no adapter calls"


def test_the_node_state_collector_role_is_one_poll_of_it(api_server, core_api):
    from foreshock.ingest.collectors.kube_nodes import KubeNodePoll

    assert KubeNodePoll(core_api)() and api_server.requests
    polled = {needs(method, path) for method, path, _ in api_server.requests}
    assert polled == granted(roles()["foreshock-node-states"])
