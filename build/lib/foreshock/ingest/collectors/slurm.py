"""Slurm node states through ``sinfo``, for the node-state collector (:mod:`.node_states`).

Service class of a ``sinfo %T`` state:

- ``down``: DOWN, FAIL, FAILING, REBOOT_ISSUED, INVAL (the node failed, rebooted or lost slurmd)
- ``drained``: DRAINED, DRAINING, MAINT (out of service by decision; a draining node finishes
  its work but takes no new work)
- ``up``: IDLE, ALLOCATED, MIXED, COMPLETING, RESERVED, PLANNED, BLOCKED
- anything else (UNKNOWN, FUTURE, the power-saving states): no class, so no event
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from typing import Final

from foreshock.ingest.collectors.base import CollectorOptions, CollectorUnavailable, register_collector
from foreshock.ingest.collectors.node_states import NodeStateCollector, PollFailed, check_state_file

__all__ = ["SinfoPoll", "service_class", "parse_sinfo", "SINFO_ARGS"]

SINFO_ARGS: Final = ("--Node", "--noheader", "--format=%N|%T")
_CLASS_OF: Final = {
    **dict.fromkeys(("down", "fail", "failing", "reboot_issued", "inval"), "down"),
    **dict.fromkeys(("drained", "draining", "maint"), "drained"),
    **dict.fromkeys(("idle", "allocated", "mixed", "completing", "reserved", "planned", "blocked"), "up"),
}


def service_class(state: str) -> str | None:
    """``down``, ``drained``, ``up`` or ``None`` for one ``sinfo %T`` state (``idle*``,
    ``drained``, ``mixed-``): Slurm's flag suffixes (``*`` not responding, ``~`` powered off,
    ``#``, ``!``, ``%``, ``$``, ``@``, ``^``, ``-``, ``+``) are dropped first."""
    return _CLASS_OF.get(state.strip().lower().rstrip("*~#!%$@^-+"))


def parse_sinfo(text: str) -> dict[str, tuple[str, str]]:
    """``node|state`` lines into {node: (service class, state)}; lines without a known class are
    skipped.

    ``sinfo --Node`` lists a node once per partition; every line of a node carries the same state.
    """
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        node, sep, state = line.partition("|")
        cls = service_class(state) if sep else None
        if node.strip() and cls is not None:
            out[node.strip()] = (cls, f"state {state.strip()}")
    return out


class SinfoPoll:
    """One ``sinfo`` run per call. ``SLURM_CONF`` in ``env`` (or the process environment) picks the
    cluster; ``run`` stands in for :func:`subprocess.run` only so a caller can wrap it (the tests
    run the real ``sinfo`` against a real slurmctld)."""

    def __init__(
        self,
        sinfo: str = "sinfo",
        env: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ) -> None:
        self.sinfo = sinfo
        self.env = env
        self.timeout_s = timeout_s
        self._run = run

    def __call__(self) -> dict[str, tuple[str, str]]:
        args = [self.sinfo, *SINFO_ARGS]
        try:
            proc = self._run(args, capture_output=True, text=True, env=self.env, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PollFailed(str(exc)) from None
        if proc.returncode != 0:  # a silent failure is a failure too, not an empty cluster
            raise PollFailed((proc.stderr or proc.stdout).strip() or f"sinfo exit status {proc.returncode}")
        return parse_sinfo(proc.stdout)


@register_collector("slurm")
def _create(options: CollectorOptions) -> NodeStateCollector:
    state_file = check_state_file(options)
    if shutil.which("sinfo") is None:
        raise CollectorUnavailable("sinfo is not on PATH: install Slurm's client commands on this host")
    return NodeStateCollector(SinfoPoll(), state_file, options.clock, "slurm")
