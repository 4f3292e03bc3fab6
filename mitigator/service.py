"""The mitigator's loop: risk scores and node events in, audited actions out.

Consumes ``risk.scores``, ``node.events`` and operator requests (``mitigation.events`` records
with status ``planned`` and a reason starting ``operator``: pin/unpin, see :func:`pin_request`,
the breaker's reset, see :func:`breaker_reset_request`, and a burn-in's clear, see
:func:`burn_in_clear_request`) as one consumer group (key = node, so one member owns a node's state).

Node events drive the burn-in (:mod:`foreshock.mitigator.burnin`): a ``failed`` or ``down`` event
that is a new failure is audited (``fault``, ``observed``) and then counted; a ``repaired`` or
``up`` event sends a node with enough recent failures into burn-in, else undrains a node
Foreshock drained (``repaired``). Every pass ends the burn-ins that have lasted their length.

Before the first record it rebuilds its state (:mod:`foreshock.mitigator.coldstart`); then, every
``reconcile_every_s``, it reads the scheduler's state off the loop and the pass that receives it
compares each node's desired state with it (:mod:`foreshock.mitigator.reconcile`). Each record goes
through the :class:`~foreshock.mitigator.engine.MitigationEngine`; the plan's intent is made durable by the
:class:`~foreshock.mitigator.executor.Executor` and the offsets are committed after that, so a crash loses
no promise: what was planned and not finished is resumed from the audit log at the next start.
The executor's attempts then run without holding this loop (on its worker pool), retried with
backoff, and their outcomes are settled into the engine as they end.

Every block is visible — in the audit log, in the log, in the metrics and in :meth:`status`: a
record rejected for its time (also dead-lettered), a drain a safety rail held back, the breaker
tripping. When the audit log cannot be written the service pauses: it acts on nothing, rewinds
the consumer to the first record whose intent is not durable, reports not ready with the reason,
and probes the log every ``audit_retry_s`` until it can go on. A log that can be read but not
written at start (read-only storage after a crash) starts the service paused the same way, its
cold start redone once the log takes writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from foreshock.ingest.bus import Bus, Message
from foreshock.ingest.contract import RETURN_EVENTS, MitigationEvent, NodeEvent, RiskScore, Topic
from foreshock.ingest.stream import Decoded, RecordStream, now_ms
from foreshock.mitigator import burnin
from foreshock.mitigator.audit import AuditUnavailable
from foreshock.mitigator.coldstart import ColdStart, rebuild
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor, Outcome
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.metrics import MitigatorMetrics
from foreshock.mitigator.plan import NodeView, Plan, action_id, count_states
from foreshock.mitigator.reconcile import compare

__all__ = ["MitigationService", "pin_request", "breaker_reset_request", "burn_in_clear_request"]

log = logging.getLogger(__name__)

_SAID = {"returned_by_hand": "was returned to service by hand; respected",
         "drained_by_scheduler": "is drained with Foreshock's mark, not by this mitigator; taken as drained"}


class MitigationService:
    """Policy loop over a bus; :meth:`poll_once` for tests, :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        bus: Bus,
        engine: MitigationEngine,
        executor: Executor,
        group: str = "foreshock-mitigator",
        metrics: MitigatorMetrics | None = None,
        audit_retry_s: float = 5.0,
        reconcile_every_s: float = 30.0,
        consumer_config: Mapping[str, object] | None = None,
    ):
        if reconcile_every_s < 0:
            raise ValueError("reconcile_every_s must be >= 0 (0: only at the cold start)")
        self.engine = engine
        self.executor = executor
        self.metrics = metrics or MitigatorMetrics()
        self.audit_retry_s = audit_retry_s
        self.outcomes: list[Outcome] = []
        self.rejections: deque[dict] = deque(maxlen=50)
        self.paused: str | None = None
        self._next_probe = 0.0
        self._blocks_seen: set[tuple[str, str]] = set()
        self._lock = threading.RLock()  # the loop and GET /status
        self.reconcile_every_s = reconcile_every_s
        self.reconciled: deque[dict] = deque(maxlen=50)
        self.observed: dict = {"read_ms": None, "error": None}
        self._reading: tuple[Future, dict[str, NodeView], set[str]] | None = None
        self.cold_start: ColdStart | None = None  # None until the start's rows are written
        try:
            executor.audit.probe()  # a log that takes no writes is known at once, not at the first record
            self.cold_start = self._cold_start()
        except AuditUnavailable as exc:  # readable, not writable: start paused; the cold start follows
            self._pause(exc, [])
        self._next_read = executor.monotonic() + reconcile_every_s
        topics = [Topic.RISK, Topic.NODE_EVENTS, Topic.MITIGATION]  # consumer_config: where a group starts
        self.stream = RecordStream(bus, bus.consumer(group, topics, **dict(consumer_config or {})))

    def handle(self, record: RiskScore | NodeEvent | MitigationEvent) -> list[Outcome]:
        """Plan for one record and run what is due (an executor without workers acts at once).

        A record whose intent cannot be recorded pauses the service and is dropped here; the loop
        (:meth:`poll_once`) reads it again instead."""
        with self._lock:
            try:
                planned = self._plan(record, None)
            except AuditUnavailable as exc:
                self._pause(exc, [])
                return []
            return planned + self._run_due()

    def poll_once(self, timeout_s: float = 0.5) -> int:
        """Handle one batch; returns records handled. Never blocks on an action."""
        if self.paused is not None and not self._try_resume():
            time.sleep(min(timeout_s, self.audit_retry_s))
            return 0
        due = self.executor.next_due_s()
        decoded = self.stream.poll(timeout_s if due is None else min(timeout_s, due))
        n = 0
        with self._lock:
            handled: list[Decoded] = []
            try:
                for d in decoded:
                    for record in d.records:
                        self._plan(record, d.message)
                    n += len(d.records)
                    handled.append(d)
            except AuditUnavailable as exc:
                self._pause(exc, decoded[len(handled):])
            if handled:
                self.stream.commit(handled)
            if self.paused is None:
                self._run_due()
        return n

    def run(self, stop: threading.Event, timeout_s: float = 0.5) -> None:
        while not stop.is_set():
            self.poll_once(timeout_s)

    def close(self) -> None:
        self.executor.close()
        self.stream.close()

    def render_metrics(self) -> bytes:
        """``/metrics``: the gauges read at scrape time, then the registry."""
        with self._lock:
            self._gauges()
        return self.metrics.render()

    @property
    def ready(self) -> bool:
        return self.paused is None

    def status(self) -> dict:
        """What ``GET /status`` shows: the breaker, the nodes per state, actions in flight, rejections."""
        with self._lock:
            nodes: dict[str, list[str]] = {}
            for node, view in sorted(self.engine.views.items()):
                nodes.setdefault(view.state.value, []).append(node)
            return {
                "ready": self.ready,
                "paused": self.paused,
                "dry_run": self.executor.dry_run,
                "breaker": {
                    "open": self.engine.breaker is not None,
                    "reason": self.engine.breaker,
                    "drains_in_window": len(self.engine.drains_in_window()),
                    "limit": self.engine.breaker_limit(),
                    "window_s": self.engine.config.breaker_window_ms / 1000,
                },
                "nodes": nodes,
                "burn_in": self._burn_in_status(),
                "pinned": sorted(n for n, v in self.engine.views.items() if v.pinned),
                "unmanageable": sorted(n for n, v in self.engine.views.items() if v.unmanageable),
                "in_flight": [
                    {"action_id": f.action.action_id, "action": f.action.kind, "node": f.action.node,
                     "attempts": f.attempts, "running": f.running,
                     "next_attempt_in_s": round(f.next_attempt_in_s, 1)}
                    for f in self.executor.in_flight()
                ],
                "rejections": list(self.rejections),
                "cold_start": None if (cs := self.cold_start) is None else {
                    "nodes": cs.counts(),
                    "drains_in_window": len(cs.drains),
                    "resumed": [a.action_id for a in cs.resumed],
                    "drained_by_scheduler": cs.drained_by_scheduler,
                    "returned_by_hand": cs.returned_by_hand,
                },
                "reconcile": {
                    "every_s": self.reconcile_every_s if self._reconciles() else None,
                    "read_ms": self.observed["read_ms"],
                    "error": self.observed["error"],
                    "recent": list(self.reconciled),
                },
            }

    def _burn_in_status(self) -> dict:
        rule = self.engine.config.burn_in
        length_ms = 0 if rule is None else int(rule.length_s * 1000)
        return {
            "rule": None if rule is None else {"failures": rule.failures, "window_s": rule.window_s,
                                               "length_s": rule.length_s},
            "nodes": [{"node": n, "since_ms": v.burn_in_since, "until_ms": v.burn_in_since + length_ms,
                       "failures": 0 if rule is None else burnin.failures_within(v, rule)}
                      for n, v in sorted(self.engine.views.items()) if v.state is NodeState.BURN_IN],
        }

    def _cold_start(self) -> ColdStart:
        cs = rebuild(
            self.executor.audit,
            dry_run=self.executor.dry_run,
            now_ms=self.engine.clock(),
            window_ms=self.engine.config.breaker_window_ms,
            scheduler=self.executor.scheduler,
        )
        self.engine.restore(cs.views, cs.drains, cs.breaker)
        self.executor.resume(cs.resumed)
        self.metrics.cold_start_resumed.set(len(cs.resumed))
        for state in NodeState:
            self.metrics.cold_start_nodes.labels(state.value).set(cs.counts().get(state.value, 0))
        return cs

    def _plan(self, record, message: Message | None) -> list[Outcome]:
        """The engine's plan for ``record``, its intent recorded; forgotten again if that fails."""
        self.metrics.records.inc()
        mark = self.engine.mark(record.node)
        try:
            plan = self._decide(record, message)
            if plan is None:
                return []
            outcomes = self.executor.submit(plan)
        except AuditUnavailable:
            self.engine.undo(mark)
            raise
        self._settle(outcomes)
        return outcomes

    def _decide(self, record, message: Message | None) -> Plan | None:
        if isinstance(record, RiskScore):
            was_open = self.engine.breaker
            plan = self.engine.observe(record)
            if plan.rejected is not None:
                self._reject(record, plan.rejected, message)
                return None
            if self.engine.breaker is not None and was_open is None:
                trip_id = f"breaker:-:-:{self.engine.clock()}"
                self._note("*", trip_id, "breaker", "tripped", self.engine.breaker)
                log.warning("circuit breaker tripped: %s; drains stop until an operator resets it",
                            self.engine.breaker)
            if plan.blocked is not None:
                self._block(plan)
            return plan
        if isinstance(record, NodeEvent):
            return self._node_event(record)
        if not (
            isinstance(record, MitigationEvent)
            and record.status == "planned"
            and not record.dry_run
            and record.reason.startswith("operator")
        ):
            return None
        if record.action in ("pin", "unpin") and not self.executor.audit.succeeded(record.action_id):
            return self.engine.pin(record.node, record.ts, record.action == "pin", record.reason)
        if record.action == "breaker" and not self.executor.audit.has(record.action_id, "reset"):
            self._note(record.node, record.action_id, "breaker", "reset", record.reason)
            log.warning("circuit breaker reset by %s", record.reason)
            self.engine.reset_breaker()
        if (record.action == "undrain" and burnin.is_burn_in(record.action_id)
                and not self.executor.audit.succeeded(record.action_id)):
            return self._clear_burn_in(record)
        return None

    def _node_event(self, record: NodeEvent) -> Plan | None:
        node = record.node
        if record.event in ("failed", "down"):
            if self.engine.is_new_fault(node, record.ts):
                was = self.engine.state(node)
                detail = f"node event {record.event}" + (f": {record.detail}" if record.detail else "")
                self._note(node, f"fault:{node}:-:{record.ts}", "fault", "observed", detail, ts=record.ts)
                self.engine.fault(node, record.ts)
                self.metrics.faults.inc()
                if was is NodeState.BURN_IN:
                    self.metrics.burn_ins.labels("failed").inc()
                    log.warning("%s failed during its burn-in (%s); its next return starts another", node,
                                detail)
            return None
        if record.event not in RETURN_EVENTS:
            return None
        was = self.engine.state(node)
        plan = self.engine.returned(node, record.ts, record.event)
        if plan.view.state is NodeState.BURN_IN and was is not NodeState.BURN_IN:
            self.metrics.burn_ins.labels("started").inc()
            log.warning("%s back from repair goes into burn-in: %s", node, plan.actions[0].reason)
        return plan

    def _clear_burn_in(self, record: MitigationEvent) -> Plan | None:
        plan = self.engine.clear_burn_in(record.node, record.ts, record.reason)
        if plan is None:
            log.warning("burn-in clear for %s ignored: it is in no burn-in (%s)", record.node,
                        self.engine.state(record.node))
            return None
        self.metrics.burn_ins.labels("cleared").inc()
        log.warning("burn-in of %s cleared by %s", record.node, record.reason)
        return plan

    def _pass_burn_ins(self) -> None:
        """End the burn-ins that lasted their length: undrain each (its intent recorded first)."""
        for node in self.engine.burn_ins_due():
            mark = self.engine.mark(node)
            plan = self.engine.pass_burn_in(node)
            try:
                outcomes = self.executor.submit(plan)
            except AuditUnavailable:
                self.engine.undo(mark)
                raise
            self.metrics.burn_ins.labels("passed").inc()
            log.info("%s passed its burn-in; back to service", node)
            self._settle(outcomes)

    def _reject(self, record: RiskScore, why: str, message: Message | None) -> None:
        self._note(record.node, action_id("record", record.node, None, record.ts), "record", "rejected", why)
        if message is not None:
            self.stream.dead_letter(message, f"{record.node} ts={record.ts}: {why}")
        kind = "future" if "after its receipt" in why else "stale"
        self.metrics.rejected.labels(kind).inc()
        self.rejections.append({"received_ms": self.engine.clock(), "node": record.node, "ts": record.ts,
                                "reason": why})
        log.warning("rejected a risk record for %s (ts %d): %s", record.node, record.ts, why)

    def _block(self, plan: Plan) -> None:
        block = plan.blocked
        aid = action_id("drain", plan.node, None, plan.view.trigger_ts)
        if (aid, block.rail) in self._blocks_seen:
            return
        self._blocks_seen.add((aid, block.rail))
        self._note(plan.node, aid, "drain", "blocked", block.detail)
        self.metrics.blocked.labels(block.rail).inc()
        log.warning("drain of %s held back: %s", plan.node, block.detail)

    def _note(self, node: str, aid: str, action: str, status: str, reason: str,
              ts: int | None = None) -> None:
        """An audit row for something decided or seen rather than done (a rejection, a block, the
        breaker, a failure: dated ``ts``, the mitigator's clock by default)."""
        self.executor.audit.record(MitigationEvent(
            ts=self.engine.clock() if ts is None else ts, node=node, action_id=aid, action=action,
            status=status, reason=reason, dry_run=self.executor.dry_run,
        ))

    def tick(self) -> list[Outcome]:
        """Run the attempts that are due, settle those that ended (``poll_once`` calls it every pass)."""
        with self._lock:
            return self._run_due()

    def _run_due(self) -> list[Outcome]:
        try:
            self._pass_burn_ins()
            outcomes = self.executor.run_due()
        except AuditUnavailable as exc:
            self._pause(exc, [])
            return []
        self._settle(outcomes)
        try:
            self._reconcile()
        except AuditUnavailable as exc:
            self._pause(exc, [])
        return outcomes

    def _reconciles(self) -> bool:
        return self.reconcile_every_s > 0 and not self.executor.dry_run

    def _reconcile(self) -> None:
        """Start a reading of the scheduler when one is due; compare with it on the pass it arrives.

        Only nodes whose view did not change while the reading was taken, and that have no action
        queued then or now, are compared: a drain that ended during the reading is not undone by it.
        """
        if self._reading is None:
            if not self._reconciles() or self.executor.monotonic() < self._next_read:
                return
            before, busy = dict(self.engine.views), self.executor.busy()
            self._reading = (self.executor.call(self.executor.scheduler.foreshock_drained), before, busy)
        future, before, busy = self._reading
        if not future.done():
            return
        self._reading = None
        self._next_read = self.executor.monotonic() + self.reconcile_every_s
        try:
            drained = future.result()
        except Exception as exc:  # an unreadable scheduler changes nothing; the next period reads again
            if self.observed["error"] is None:
                log.warning("reconcile: the scheduler's state is unreadable (%s); nothing compared", exc)
            self.observed["error"] = f"{type(exc).__name__}: {exc}"
            return
        if drained is None:  # the adapter cannot tell (no scheduler): nothing to compare, ever
            self.reconcile_every_s = 0
            return
        if self.observed["error"] is not None:
            log.warning("reconcile: the scheduler's state can be read again")
        self.observed.update(read_ms=self.engine.clock(), error=None)
        views = self.engine.views
        unchanged = {n: v for n, v in views.items() if before.get(n) is v}
        shown = {n for n in drained if n in unchanged or (n not in views and n not in before)}
        for gap in compare(unchanged, shown, busy | self.executor.busy()):
            now = self.engine.clock()
            self.executor.audit.record(gap.event(now, self.executor.dry_run))  # recorded before taken in
            self.engine.observed(gap.node, gap.view)
            self.metrics.reconciled.labels(gap.kind).inc()
            self.reconciled.append({"ts": now, "node": gap.node, "kind": gap.kind})
            log.warning("reconcile: %s %s", gap.node, _SAID[gap.kind])

    def _settle(self, outcomes: Sequence[Outcome]) -> None:
        for o in outcomes:  # a dry run settles as if it had worked, so it simulates the whole episode
            self.engine.settle(o.action, o.succeeded or self.executor.dry_run, o.permanent)
            self.metrics.actions.labels(o.action.kind, o.status).inc()
        self.outcomes.extend(outcomes)

    def _pause(self, exc: AuditUnavailable, unhandled: Sequence[Decoded]) -> None:
        """Stop acting; read the records whose intent is not durable again once the log is back."""
        first: dict[tuple[str, int], int] = {}
        for d in unhandled:
            key = (d.message.topic, d.message.partition)
            first[key] = min(first.get(key, d.message.offset), d.message.offset)
        if first:
            self.stream.consumer.seek(first)
        if self.paused is None:
            log.error("paused, acting on nothing: %s", exc)
        self.paused = str(exc)
        self.metrics.paused.set(1)
        self._next_probe = time.monotonic() + self.audit_retry_s

    def _try_resume(self) -> bool:
        if time.monotonic() < self._next_probe:
            return False
        try:
            self.executor.audit.probe()
            if self.cold_start is None:
                self.cold_start = self._cold_start()
        except AuditUnavailable as exc:
            self.paused = str(exc)
            self._next_probe = time.monotonic() + self.audit_retry_s
            return False
        log.warning("the audit log can be written again; resuming")
        self.paused = None
        self.metrics.paused.set(0)
        return True

    def _gauges(self) -> None:
        m = self.metrics
        m.breaker_open.set(self.engine.breaker is not None)
        m.drains_in_window.set(len(self.engine.drains_in_window()))
        m.breaker_limit.set(self.engine.breaker_limit())
        m.in_flight.set(len(self.executor.in_flight()))
        counts = count_states(self.engine.views.values())
        for state in NodeState:
            m.nodes.labels(state.value).set(counts.get(state.value, 0))
        e = self.engine
        m.observe_fleet(len(e.config.spare_nodes), len(e.free_spares()), e.job_source.jobs(), e.clock(),
                        self.executor.audit.write_failures)


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


def burn_in_clear_request(node: str, reason: str = "", ts: int | None = None) -> MitigationEvent:
    """The record an operator publishes to end ``node``'s burn-in now (the undrain is audited)."""
    ts = now_ms() if ts is None else ts
    return MitigationEvent(
        ts=ts, node=node, action_id=burnin.burn_in_id("undrain", node, ts), action="undrain",
        status="planned", reason=f"operator: {reason}".rstrip(": "),
    )


def breaker_reset_request(reason: str = "", ts: int | None = None) -> MitigationEvent:
    """The record an operator publishes to close a tripped circuit breaker (audited as ``reset``)."""
    ts = now_ms() if ts is None else ts
    return MitigationEvent(
        ts=ts, node="*", action_id=f"breaker:-:-:{ts}", action="breaker", status="planned",
        reason=f"operator: {reason}".rstrip(": "),
    )
