"""Scheduler adapters: take a node out of (and back into) service, and say which nodes are out.

``set_drained(node, True, reason)`` must be idempotent: draining a drained node is a success, so
the executor can drive a drain to completion by repeating it. Every call is bounded in time.
``foreshock_drained()`` reads the scheduler's actual state — the nodes out of service with
Foreshock's mark (its drain reason, its taint) — for the mitigator's cold start; None means the
adapter cannot tell.

Failures are :class:`SchedulerError`: ``permanent`` when repeating cannot help (an unknown node),
``done`` naming the parts that took effect before the failure (a cordon that held while the
eviction failed), so the audit records what happened rather than a bare "failed".
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["SchedulerAdapter", "SlurmAdapter", "NoScheduler", "SCHEDULERS", "SchedulerError", "DRAIN_MARK"]

DRAIN_MARK = "foreshock"
"""How every drain reason starts, so a restarted mitigator can tell its drains from an operator's."""


class SchedulerError(RuntimeError):
    """The scheduler refused or failed. Transient ones are retried with backoff; permanent ones once."""

    def __init__(self, message: str, *, permanent: bool = False, done: tuple[str, ...] = ()):
        super().__init__(message)
        self.permanent = permanent
        self.done = done


class SchedulerAdapter(Protocol):
    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        """Drain (no new work; running work may finish or is moved) or return the node to service."""
        ...

    def foreshock_drained(self) -> set[str] | None:
        """Nodes now out of service with Foreshock's mark, or None when that cannot be known."""
        ...


def marked(reason: str) -> str:
    """``reason`` with Foreshock's mark in front (once)."""
    return reason if reason.startswith(DRAIN_MARK) else f"{DRAIN_MARK}: {reason}"


class SlurmAdapter:
    """Slurm through ``scontrol update NodeName=… State=DRAIN Reason=…`` / ``State=RESUME``.

    Each ``scontrol``/``sinfo`` runs under ``timeout_s``; a slurmctld that does not answer is a
    transient error like any other, retried later by the executor, never in a loop here. ``env``
    points the client at a cluster (``SLURM_CONF``); ``run`` is injectable only so a caller can wrap
    the call — tests run the real binary against a real slurmctld.
    """

    def __init__(
        self,
        scontrol: str = "scontrol",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 15.0,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        sinfo: str = "sinfo",
    ):
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self._run = run

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        args = [self.scontrol, "update", f"NodeName={node}"]
        args += ["State=DRAIN", f"Reason={marked(reason)[:200]}"] if drained else ["State=RESUME"]
        proc = self._call(args)
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip()
            if not drained and "Invalid node state" in err:
                return  # already in service: resuming twice is a success
            permanent = "Invalid node name" in err
            raise SchedulerError(f"scontrol failed ({proc.returncode}): {err}", permanent=permanent)

    def foreshock_drained(self) -> set[str] | None:
        proc = self._call([self.sinfo, "-N", "-h", "-o", "%N|%T|%E"])
        if proc.returncode != 0:
            raise SchedulerError(f"sinfo failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
        out = set()
        for line in proc.stdout.splitlines():
            node, state, reason = (line.split("|", 2) + ["", ""])[:3]
            if "drain" in state.lower() and reason.startswith(DRAIN_MARK):
                out.add(node.strip())
        return out

    def _call(self, args: list[str]) -> subprocess.CompletedProcess:
        try:
            return self._run(args, capture_output=True, text=True, env=self.env, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{args[0]} did not answer within {self.timeout_s:g} s") from None


class NoScheduler:
    """No scheduler to tell (``--scheduler none``): the drain is only audited."""

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        return None

    def foreshock_drained(self) -> set[str] | None:
        return None


def _kubernetes(**kwargs) -> SchedulerAdapter:
    from foreshock.mitigator.kube import KubernetesAdapter

    return KubernetesAdapter(**kwargs)


SCHEDULERS: dict[str, Callable[..., SchedulerAdapter]] = {
    "slurm": SlurmAdapter,
    "kubernetes": _kubernetes,
    "none": NoScheduler,
}
