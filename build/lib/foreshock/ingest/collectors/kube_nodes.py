"""Kubernetes node states through the official client's node list, for the node-state collector
(:mod:`.node_states`).

Service class of a node:

- ``down``: its ``Ready`` condition is ``False`` or ``Unknown`` (kubelet stopped reporting, node
  unreachable or rebooting); this wins over a cordon
- ``drained``: cordoned (``spec.unschedulable``) or carrying Foreshock's drain taint
  (:data:`~foreshock.ingest.contract.KUBE_DRAIN_TAINT`). The mitigator sets both; after a repair the
  operator removes the taint and uncordons, and the ``repaired`` that follows makes the mitigator
  undrain (both already undone: a success)
- ``up``: ready and schedulable
- no ``Ready`` condition yet (a node still registering): no class, so no event

The tests run this against a stand-in API server (tests/fixtures/kube.py): no kube-apiserver
can run where they run. The official client does the configuration, the requests and the
errors.
"""

from __future__ import annotations

from typing import Any, Final

from foreshock.ingest.collectors.base import CollectorOptions, CollectorUnavailable, register_collector
from foreshock.ingest.collectors.node_states import NodeStateCollector, PollFailed, check_state_file
from foreshock.ingest.contract import KUBE_DRAIN_TAINT

__all__ = ["KubeNodePoll", "node_class"]

_PAGE: Final = 500


def node_class(node: Any) -> tuple[str, str] | None:
    """(service class, detail) of one ``V1Node``; ``None`` before it reports ``Ready``."""
    conditions = (node.status.conditions if node.status else None) or []
    ready = next((c for c in conditions if c.type == "Ready"), None)
    if ready is None:
        return None
    if ready.status != "True":
        return "down", f"Ready={ready.status}" + (f" ({ready.reason})" if ready.reason else "")
    spec = node.spec
    if spec is not None and spec.unschedulable:
        return "drained", "cordoned"
    if spec is not None and any(t.key == KUBE_DRAIN_TAINT for t in spec.taints or []):
        return "drained", f"taint {KUBE_DRAIN_TAINT}"
    return "up", "Ready"


class KubeNodePoll:
    """One paged node list per call, through a configured ``CoreV1Api``."""

    def __init__(self, api: Any, timeout_s: float = 30.0) -> None:
        self.api = api
        self.timeout_s = timeout_s

    def __call__(self) -> dict[str, tuple[str, str]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        out: dict[str, tuple[str, str]] = {}
        token = None
        while True:
            try:
                page = self.api.list_node(limit=_PAGE, _continue=token, _request_timeout=self.timeout_s)
            except (ApiException, HTTPError, OSError) as exc:
                raise PollFailed(f"node list failed: {exc}") from None
            for node in page.items:
                cls = node_class(node)
                if cls is not None:
                    out[node.metadata.name] = cls
            token = page.metadata._continue if page.metadata else None
            if not token:
                return out


@register_collector("kubernetes")
def _create(options: CollectorOptions) -> NodeStateCollector:
    try:
        from kubernetes import client, config
    except ImportError:
        raise CollectorUnavailable("the kubernetes client library is not installed") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise CollectorUnavailable(
                f"no Kubernetes configuration (not in a pod, no kubeconfig): {exc}"
            ) from None
    return NodeStateCollector(
        KubeNodePoll(client.CoreV1Api()), check_state_file(options), options.clock, "kubernetes"
    )
