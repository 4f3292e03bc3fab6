"""The mitigator's loop: risk scores and node events in, audited actions out.

Consumes ``risk.scores``, ``node.events`` and operator pin/unpin requests (``mitigation.events``
records with status ``planned`` and a reason starting ``operator``; see :func:`pin_request`) as
one consumer group (key = node, so one member owns a node's state), runs each record through the
:class:`~mitigator.engine.MitigationEngine`, applies the plan with the
:class:`~mitigator.executor.Executor`, feeds outcomes back, and commits offsets only after the
actions' audit records are durable (at-least-once; a replay is harmless because action ids repeat
and the executor skips ids that already succeeded).
"""

from __future__ import annotations

import threading

from ingest.bus import Bus
from ingest.contract import MitigationEvent, NodeEvent, RiskScore, Topic
from ingest.stream import RecordStream, now_ms
from mitigator.engine import MitigationEngine
from mitigator.executor import Executor, Outcome

__all__ = ["MitigationService", "pin_request"]


class MitigationService:
    """Policy loop over a bus; :meth:`poll_once` for tests, :meth:`run` until ``stop`` is set."""

    def __init__(
        self, bus: Bus, engine: MitigationEngine, executor: Executor, group: str = "foreshock-mitigator"
    ):
        self.engine = engine
        self.executor = executor
        self.stream = RecordStream(
            bus, bus.consumer(group, [Topic.RISK, Topic.NODE_EVENTS, Topic.MITIGATION])
        )
        self.outcomes: list[Outcome] = []

    def handle(self, record: RiskScore | NodeEvent | MitigationEvent) -> list[Outcome]:
        """Plan and apply for one record."""
        if isinstance(record, RiskScore):
            plan = self.engine.observe(record)
        elif isinstance(record, NodeEvent) and record.event == "repaired":
            plan = self.engine.repaired(record.node, record.ts)
        elif (
            isinstance(record, MitigationEvent)
            and record.action in ("pin", "unpin")
            and record.status == "planned"
            and not record.dry_run
            and record.reason.startswith("operator")
            and not self.executor.audit.succeeded(record.action_id)
        ):
            plan = self.engine.pin(record.node, record.ts, record.action == "pin", record.reason)
        else:
            return []
        outcomes = self.executor.apply(plan)
        for o in outcomes:  # a dry run settles as if it had worked, so it simulates the whole episode
            self.engine.settle(o.action, o.succeeded or self.executor.dry_run)
        self.outcomes.extend(outcomes)
        return outcomes

    def poll_once(self, timeout_s: float = 0.5) -> int:
        """Handle one batch; returns records handled."""
        decoded = self.stream.poll(timeout_s)
        n = 0
        for d in decoded:
            for record in d.records:
                self.handle(record)
                n += 1
        if decoded:
            self.stream.commit(decoded)
        return n

    def run(self, stop: threading.Event, timeout_s: float = 0.5) -> None:
        while not stop.is_set():
            self.poll_once(timeout_s)

    def close(self) -> None:
        self.stream.close()


def pin_request(node: str, pinned: bool, reason: str = "", ts: int | None = None) -> MitigationEvent:
    """The record an operator publishes to pin (exclude from every action) or unpin a node."""
    ts = now_ms() if ts is None else ts
    kind = "pin" if pinned else "unpin"
    return MitigationEvent(
        ts=ts,
        node=node,
        action_id=f"{kind}:{node}:-:{ts}",
        action=kind,
        status="planned",
        reason=f"operator: {reason}".rstrip(": "),
    )
