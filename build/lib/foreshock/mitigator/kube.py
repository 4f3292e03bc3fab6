"""Kubernetes adapter through the official ``kubernetes`` client: cordon, taint, evict.

Drain = ``spec.unschedulable=true`` (cordon) + a ``foreshock.io/failure-risk:NoSchedule`` taint
(so the node stays out even if someone uncordons it by hand) + an Eviction for each of the job's
pods on the node (Evictions respect PodDisruptionBudgets, unlike deletes). Undrain removes the
taint and uncordons. Every request carries the client's ``_request_timeout``, so an API server
that holds a request costs at most ``timeout_s``. An eviction that fails after the cordon held is
reported with the parts done (as ``kubectl drain`` reports a half-done drain): the node stays
cordoned and the executor repeats the drain, which is idempotent, until the evictions go through.
The caller passes a configured ``CoreV1Api`` (in-cluster or kubeconfig, built by the composition
root).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from foreshock.ingest.contract import KUBE_DRAIN_TAINT as TAINT_KEY
from foreshock.mitigator.schedulers import SchedulerError

__all__ = ["KubernetesAdapter", "TAINT_KEY"]


class KubernetesAdapter:
    """Drain a node for the pods matching ``pod_selector`` (e.g. ``foreshock.io/job``) on it."""

    def __init__(
        self, api: client.CoreV1Api | None = None, pod_selector: str | None = None, timeout_s: float = 10.0
    ):
        self.api = api or client.CoreV1Api()
        self.pod_selector = pod_selector
        self.timeout_s = timeout_s

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        with _errors("cordon", node):
            current = self.api.read_node(node, _request_timeout=self.timeout_s)
            taints = [t for t in (current.spec.taints or []) if t.key != TAINT_KEY]
            if drained:
                taints.append(client.V1Taint(key=TAINT_KEY, value="true", effect="NoSchedule"))
            body = {
                "spec": {
                    "unschedulable": drained,
                    "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints],
                }
            }
            if drained:
                body["metadata"] = {"annotations": {f"{TAINT_KEY}-reason": reason[:250]}}
            self.api.patch_node(node, body, _request_timeout=self.timeout_s)
        if drained:
            with _errors("evict", node, done=("cordon", "taint")):
                self._evict(node)

    def foreshock_drained(self) -> set[str] | None:
        with _errors("list nodes", "-"):
            nodes = self.api.list_node(_request_timeout=self.timeout_s).items
        return {n.metadata.name for n in nodes if any(t.key == TAINT_KEY for t in (n.spec.taints or []))}

    def _evict(self, node: str) -> None:
        pods = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", label_selector=self.pod_selector,
            _request_timeout=self.timeout_s,
        )
        for pod in pods.items:
            meta = client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
            eviction = client.V1Eviction(api_version="policy/v1", kind="Eviction", metadata=meta)
            try:
                self.api.create_namespaced_pod_eviction(
                    pod.metadata.name, pod.metadata.namespace, eviction, _request_timeout=self.timeout_s
                )
            except ApiException as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise


@contextmanager
def _errors(step: str, node: str, done: tuple[str, ...] = ()) -> Iterator[None]:
    """Turn the client's failures during ``step`` into a :class:`SchedulerError`."""
    try:
        yield
    except ApiException as exc:
        unknown = exc.status == 404 and step == "cordon"
        raise SchedulerError(
            f"kubernetes {step} {node}: {exc.status} {exc.reason}", permanent=unknown, done=done
        ) from exc
    except (HTTPError, OSError) as exc:  # timeouts, refused connections
        raise SchedulerError(f"kubernetes {step} {node}: {type(exc).__name__}: {exc}", done=done) from exc
