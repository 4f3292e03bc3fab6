"""Kubernetes adapter through the official ``kubernetes`` client: cordon, taint, evict.

Drain = ``spec.unschedulable=true`` (cordon) + a ``foreshock.io/failure-risk:NoSchedule`` taint
(so the node stays out even if someone uncordons it by hand) + an Eviction for each of the job's
pods on the node (Evictions respect PodDisruptionBudgets, unlike deletes). Undrain removes the
taint and uncordons. The caller passes a configured ``CoreV1Api`` (in-cluster or kubeconfig, built
by the composition root).
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ingest.contract import KUBE_DRAIN_TAINT as TAINT_KEY
from mitigator.schedulers import SchedulerError

__all__ = ["KubernetesAdapter", "TAINT_KEY"]


class KubernetesAdapter:
    """Drain a node for the pods matching ``pod_selector`` (e.g. ``foreshock.io/job``) on it."""

    def __init__(self, api: client.CoreV1Api | None = None, pod_selector: str | None = None):
        self.api = api or client.CoreV1Api()
        self.pod_selector = pod_selector

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        try:
            current = self.api.read_node(node)
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
            self.api.patch_node(node, body)
            if drained:
                self._evict(node)
        except ApiException as exc:
            raise SchedulerError(f"kubernetes {exc.status}: {exc.reason}") from exc

    def _evict(self, node: str) -> None:
        pods = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", label_selector=self.pod_selector
        )
        for pod in pods.items:
            meta = client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
            eviction = client.V1Eviction(api_version="policy/v1", kind="Eviction", metadata=meta)
            try:
                self.api.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, eviction)
            except ApiException as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise
