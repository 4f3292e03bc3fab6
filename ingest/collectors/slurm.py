"""Slurm node states: a node leaving or re-entering service becomes a ``NodeEvent``.

Three consumers need to know when a node leaves or comes back: the feature engines start a node's
windows afresh at a ``repaired`` or ``up`` event (a repaired node's burst from before the repair
says nothing about its future), the mitigator closes a drain on ``repaired``, and the labels of a
dataset that holds the events leave a node's time out of service (after ``down`` or ``drained``)
out of training. The simulator publishes these events with its ground truth; on a cluster the
scheduler knows them. This collector, one per cluster (not per node), polls ``sinfo`` and
publishes a change of a node's service class:

- ``down``: DOWN, FAIL, FAILING, REBOOT_ISSUED, INVAL (the node failed, rebooted or lost slurmd)
- ``drained``: DRAINED, DRAINING, MAINT (out of service by decision; a draining node finishes
  its work but takes no new work)
- ``up``: IDLE, ALLOCATED, MIXED, COMPLETING, RESERVED, PLANNED, BLOCKED
- anything else (UNKNOWN, FUTURE, the power-saving states): no class, so no event

Entering ``down`` or ``drained`` publishes that event. A return to ``up`` publishes ``repaired``
after a drain (the mitigator undrains on it; resuming a resumed node is a success) and ``up``
after a fault. The first sight of a node publishes only an out-of-service class: an ``up`` for
every node at start would cut every node's windows.

The classes last published are kept in a JSON state file (``--path``). It is written at the
start of the next poll and on shutdown, that is after the collect loop has handed the records
to the bus, so a crash can repeat an event (at least once) but never lose one; a restarted
collector compares with what it last published, so a return while it was stopped is published.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ingest.collectors.base import CollectorOptions, CollectorUnavailable, register_collector
from ingest.contract import NodeEvent

__all__ = ["SlurmNodeCollector", "service_class", "parse_sinfo", "SINFO_ARGS"]

log = logging.getLogger(__name__)

SINFO_ARGS: Final = ("--Node", "--noheader", "--format=%N|%T")
_CLASS_OF: Final = {
    **dict.fromkeys(("down", "fail", "failing", "reboot_issued", "inval"), "down"),
    **dict.fromkeys(("drained", "draining", "maint"), "drained"),
    **dict.fromkeys(("idle", "allocated", "mixed", "completing", "reserved", "planned", "blocked"), "up"),
}
_OUT_OF_SERVICE: Final = frozenset({"down", "drained"})


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
            out[node.strip()] = (cls, state.strip())
    return out


def _event(previous: str | None, current: str) -> str | None:
    """The event a change of class publishes (``None``: nothing to say)."""
    if current == previous:
        return None
    if current in _OUT_OF_SERVICE:
        return current
    if previous is None:
        return None
    return "repaired" if previous == "drained" else "up"


class SlurmNodeCollector:
    """Poll ``sinfo`` once per ``collect``; publish changes of each node's service class.

    ``run`` stands in for :func:`subprocess.run` only so a caller can wrap it; the tests run the
    real ``sinfo`` against a real slurmctld. ``SLURM_CONF`` in ``env`` (or the process
    environment) picks the cluster.
    """

    def __init__(
        self,
        state_file: Path | None,
        clock: Callable[[], int],
        sinfo: str = "sinfo",
        env: dict[str, str] | None = None,
        timeout_s: float = 30.0,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ) -> None:
        self.state_file = state_file
        self.clock = clock
        self.sinfo = sinfo
        self.env = env
        self.timeout_s = timeout_s
        self._run = run
        self.published: dict[str, str] = self._load()
        self._saved = dict(self.published)
        self.failures = 0

    def _load(self) -> dict[str, str]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            raise CollectorUnavailable(f"cannot read the Slurm state file {self.state_file}: {exc}") from None
        if not isinstance(data, dict) or not all(v in ("down", "drained", "up") for v in data.values()):
            raise CollectorUnavailable(f"{self.state_file} is not a Slurm collector state file")
        return {str(k): str(v) for k, v in data.items()}

    def _save(self) -> None:
        """Write the classes published so far (atomically: a crash leaves the old file or the new)."""
        if self.state_file is None or self.published == self._saved:
            return
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(self.published, sort_keys=True))
        os.replace(tmp, self.state_file)
        self._saved = dict(self.published)

    def collect(self) -> list[NodeEvent]:
        self._save()  # the previous poll's events have been handed to the bus by now
        ts = self.clock()
        try:
            proc = self._run(
                [self.sinfo, *SINFO_ARGS],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return self._failed(str(exc))
        if proc.returncode != 0:
            return self._failed((proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}")
        events = []
        for node, (cls, state) in sorted(parse_sinfo(proc.stdout).items()):
            kind = _event(self.published.get(node), cls)
            if kind is not None:
                events.append(NodeEvent(node=node, ts=ts, event=kind, detail=f"slurm state {state}"))
            self.published[node] = cls
        return events

    def _failed(self, error: str) -> list[NodeEvent]:
        """A poll that could not read the states: no events, nothing forgotten, a warning."""
        self.failures += 1
        log.warning("sinfo failed: %s", error)
        return []

    def drain(self) -> list[NodeEvent]:
        """Nothing is held back; record the last poll's classes (called after its events went out)."""
        self._save()
        return []


@register_collector("slurm")
def _create(options: CollectorOptions) -> SlurmNodeCollector:
    if shutil.which("sinfo") is None:
        raise CollectorUnavailable("sinfo is not on PATH: install Slurm's client commands on this host")
    if options.path is not None and not options.path.parent.is_dir():
        raise CollectorUnavailable(f"no folder {options.path.parent} for the state file")
    return SlurmNodeCollector(options.path, options.clock)
