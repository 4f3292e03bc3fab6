"""Scheduler adapters: take a node out of (and back into) service. One method, a registry by name.

``set_drained(node, True, reason)`` must be idempotent: draining a drained node is a success.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["SchedulerAdapter", "SlurmAdapter", "NoScheduler", "SCHEDULERS", "SchedulerError"]


class SchedulerError(RuntimeError):
    """The scheduler refused or failed; the executor retries with backoff."""


class SchedulerAdapter(Protocol):
    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        """Drain (no new work; running work may finish or is moved) or return the node to service."""
        ...


class SlurmAdapter:
    """Slurm through ``scontrol update NodeName=… State=DRAIN Reason=…`` / ``State=RESUME``.

    ``env`` lets a caller point the client at a cluster (``SLURM_CONF``); ``run`` is injectable
    only so a caller can add a timeout wrapper — tests run the real binary against a real slurmctld.
    """

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ):
        self.scontrol = scontrol
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self._run = run

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        args = [self.scontrol, "update", f"NodeName={node}"]
        args += ["State=DRAIN", f"Reason={reason[:200] or 'foreshock'}"] if drained else ["State=RESUME"]
        proc = self._run(args, capture_output=True, text=True, env=self.env, timeout=self.timeout_s)
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            if not drained and "Invalid node state" in err:
                return  # already in service: resuming twice is a success
            raise SchedulerError(f"scontrol failed ({proc.returncode}): {err}")


class NoScheduler:
    """No scheduler to tell (``--scheduler none``): the drain is only audited."""

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        return None


def _kubernetes(**kwargs) -> SchedulerAdapter:
    from mitigator.kube import KubernetesAdapter

    return KubernetesAdapter(**kwargs)


SCHEDULERS: dict[str, Callable[..., SchedulerAdapter]] = {
    "slurm": SlurmAdapter,
    "kubernetes": _kubernetes,
    "none": NoScheduler,
}
