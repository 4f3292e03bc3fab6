"""Scheduler node states: a node leaving or re-entering service becomes a ``NodeEvent``.

Three consumers need to know when a node leaves or comes back: the feature engines start a node's
windows afresh at a ``repaired`` or ``up`` event (a repaired node's burst from before the repair
says nothing about its future), the mitigator closes a drain on ``repaired``, and the labels of a
dataset that holds the events leave a node's time out of service (after ``down`` or ``drained``)
out of training. The simulator publishes these events with its ground truth; on a cluster the
scheduler knows them. A :class:`NodeStateCollector`, one per cluster (not per node), polls the
scheduler (``slurm``: ``sinfo``; ``kubernetes``: the node list) for each node's service class,
``down`` (failed, unreachable), ``drained`` (out of service by decision) or ``up``, and publishes
its changes.

Entering ``down`` or ``drained`` publishes that event. A return to ``up`` publishes ``repaired``
after a drain (the mitigator undrains on it; undraining an undrained node is a success) and ``up``
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
from collections.abc import Callable
from pathlib import Path
from typing import Final

from foreshock.ingest.collectors.base import CollectorOptions, CollectorUnavailable
from foreshock.ingest.contract import UNAVAILABLE_EVENTS, NodeEvent

__all__ = ["NodeStateCollector", "PollFailed", "SERVICE_CLASSES", "check_state_file"]

log = logging.getLogger(__name__)

SERVICE_CLASSES: Final = ("down", "drained", "up")

Poll = Callable[[], dict[str, tuple[str, str]]]
"""One read of the scheduler: {node: (service class, the scheduler's own words for the detail)}."""


class PollFailed(RuntimeError):
    """The scheduler could not be read this time (the message says why); the next poll retries."""


def _event(previous: str | None, current: str) -> str | None:
    """The event a change of class publishes (``None``: nothing to say)."""
    if current == previous:
        return None
    if current in UNAVAILABLE_EVENTS:  # down, drained: the class is the event
        return current
    if previous is None:
        return None
    return "repaired" if previous == "drained" else "up"


def check_state_file(options: CollectorOptions) -> Path | None:
    """``--path`` as the state file; refused when its folder does not exist."""
    if options.path is not None and not options.path.parent.is_dir():
        raise CollectorUnavailable(f"no folder {options.path.parent} for the state file")
    return options.path


class NodeStateCollector:
    """Call ``poll`` once per ``collect``; publish changes of each node's service class."""

    def __init__(self, poll: Poll, state_file: Path | None, clock: Callable[[], int], source: str) -> None:
        self.poll = poll
        self.state_file = state_file
        self.clock = clock
        self.source = source
        self.published: dict[str, str] = self._load()
        self._saved = dict(self.published)
        self.failures = 0

    def _load(self) -> dict[str, str]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            raise CollectorUnavailable(f"cannot read the state file {self.state_file}: {exc}") from None
        if not isinstance(data, dict) or not all(v in SERVICE_CLASSES for v in data.values()):
            raise CollectorUnavailable(f"{self.state_file} is not a node-state collector's state file")
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
            states = self.poll()
        except PollFailed as exc:  # no events, nothing forgotten: the next poll compares again
            self.failures += 1
            log.warning("%s node states unavailable: %s", self.source, exc)
            return []
        events = []
        for node, (cls, detail) in sorted(states.items()):
            kind = _event(self.published.get(node), cls)
            if kind is not None:
                events.append(NodeEvent(node=node, ts=ts, event=kind, detail=f"{self.source}: {detail}"))
            self.published[node] = cls
        return events

    def drain(self) -> list[NodeEvent]:
        """Nothing is held back; record the last poll's classes (called after its events went out)."""
        self._save()
        return []
