"""The cold start: the mitigator's state rebuilt, before any new record, from what it did and what is.

A restart must not forget what the mitigator promised: which nodes it drained (so a ``repaired``
event for one still returns it to service), how many drains fall in the breaker's window, whether
the breaker is open, which actions a crash cut off, which nodes are in burn-in since when, and the
failures each node had (:mod:`foreshock.mitigator.burnin`). NVIDIA NVSentinel's fault-quarantine
module recovers the same way at start-up. Two sources:

* **the audit log** (the mitigator's own record; in ``--dry-run`` its dry-run rows, so a dry run
  restarts into the state it would have had): each node's view follows from its actions' rows in
  order, the window holds the drains planned within it (by the mitigator's clock; a burn-in's
  excepted), the breaker is open when its last row is ``tripped``, a node's failures are its
  ``fault`` rows and its drains, a burn-in runs from the start its drain's id names. An action whose
  last row says it had not ended is
  closed as ``abandoned`` and queued again under the same id, so the executor drives it to its end —
  a drain is idempotent, and a hook acts on a command id once;
* **the scheduler's actual state**, compared with that by the rules of
  :mod:`foreshock.mitigator.reconcile` (which the running service applies again on a period): a node
  out of service with Foreshock's mark is drained whatever the log says (a log lost or replaced),
  and a node the log holds as drained that someone returned to service is healthy again. Each such
  gap is audited, so the next start reads it from the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import msgspec

from foreshock.ingest.contract import MitigationEvent
from foreshock.mitigator import burnin
from foreshock.mitigator.audit import AuditLog, is_open
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.plan import Action, NodeView, count_states, trigger_of
from foreshock.mitigator.reconcile import OBSERVED, compare
from foreshock.mitigator.schedulers import SchedulerAdapter, SchedulerError

__all__ = ["ColdStart", "rebuild"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ColdStart:
    """What a start recovered (``GET /status`` and the metrics report it)."""

    views: dict[str, NodeView]
    drains: list[int]
    breaker: str | None
    resumed: list[Action]
    drained_by_scheduler: list[str]  # found out of service with Foreshock's mark, unknown to the log
    returned_by_hand: list[str]  # the log held them drained; the scheduler has them in service

    def counts(self) -> dict[str, int]:
        return count_states(self.views.values())


def rebuild(
    audit: AuditLog,
    *,
    dry_run: bool,
    now_ms: int,
    window_ms: int,
    scheduler: SchedulerAdapter | None = None,
) -> ColdStart:
    """Read the state back; close open actions as ``abandoned`` (audited) and return them to resume."""
    events = [e for e in audit.events() if e.dry_run == dry_run]
    views: dict[str, NodeView] = {}
    breaker: str | None = None
    planned: dict[str, MitigationEvent] = {}
    last: dict[str, MitigationEvent] = {}
    drains: list[int] = []
    for e in events:
        if e.action == "breaker":
            breaker = e.reason if e.status == "tripped" else None if e.status == "reset" else breaker
            continue
        if e.action == "record":
            continue
        last[e.action_id] = e
        if e.status == "planned":
            planned[e.action_id] = e
            if e.action == "drain" and e.ts > now_ms - window_ms and not burnin.is_burn_in(e.action_id):
                drains.append(e.ts)
        views[e.node] = _apply(views.get(e.node, NodeView()), e, dry_run)
    resumed = []
    for action_id, e in last.items():
        if not is_open(e) or action_id not in planned:
            continue
        p = planned[action_id]
        action = Action(action_id, p.action, p.node, p.job, p.reason)
        audit.record(msgspec.structs.replace(e, status="abandoned", reason="cut off by a restart; resumed",
                                             ts=now_ms))
        resumed.append(action)
    by_scheduler, by_hand = ([], []) if dry_run else _compare(
        audit, views, scheduler, {a.node for a in resumed}, now_ms)
    if resumed or by_scheduler or by_hand or views:
        log.info("cold start: %d node(s) known, %d drain(s) in the window, breaker %s, %d action(s) resumed",
                 len(views), len(drains), "open" if breaker else "closed", len(resumed))
    return ColdStart(views, drains, breaker, resumed, by_scheduler, by_hand)


def _apply(view: NodeView, e: MitigationEvent, dry_run: bool) -> NodeView:
    """A node's view after one audit row (only the rows that change what the node is)."""
    done = e.status == "succeeded" or (dry_run and e.status == "skipped" and "dry run" in e.reason)
    final_failure = e.status == "failed" and not is_open(e)
    if e.action == "fault":
        return burnin.after_fault(view, e.ts) or view
    if e.action == "drain" and burnin.is_burn_in(e.action_id):
        fault = view.faults[-1] if view.faults else 0
        if e.status == "planned" and not (view.state is NodeState.BURN_IN and view.burned == fault):
            return burnin.started(view, trigger_of(e.action_id), fault)
        if final_failure and e.reason.startswith("permanent"):
            return replace(view, unmanageable=True)
        return view
    if e.action in ("drain", "migrate") and e.status == "planned":
        return replace(view, state=NodeState.MITIGATING, draining=True)
    if e.action == "drain" and done:
        drained = replace(view, state=NodeState.DRAINED, draining=True)
        if e.reason.startswith(OBSERVED):  # found drained: no failure this mitigator saw
            return drained
        return burnin.with_fault(drained, trigger_of(e.action_id))
    if e.action in ("drain", "migrate") and final_failure:
        return replace(view, state=NodeState.WATCH, draining=False,
                       unmanageable=view.unmanageable or e.reason.startswith("permanent"))
    held_back = (e.action, e.status) in (("drain", "blocked"), ("checkpoint", "planned"))
    if held_back and view.state in (NodeState.HEALTHY, NodeState.WATCH):  # mitigating, without a drain
        return replace(view, state=NodeState.MITIGATING, draining=False)
    if e.action == "undrain" and e.status == "planned":
        return replace(view, state=NodeState.REPAIRED, draining=False, burn_in_since=0)
    if e.action == "undrain" and done:
        return replace(view, state=NodeState.HEALTHY, draining=False, burn_in_since=0)
    if e.action in ("pin", "unpin") and done:
        return replace(view, pinned=e.action == "pin")
    return view


def _compare(audit: AuditLog, views: dict[str, NodeView], scheduler: SchedulerAdapter | None, busy: set[str],
             now_ms: int) -> tuple[list[str], list[str]]:
    """Reconcile the log's views with the scheduler's nodes out of service (in place; each gap audited)."""
    if scheduler is None:
        return [], []
    try:
        out = scheduler.foreshock_drained()
    except SchedulerError as exc:
        log.warning("cold start: the scheduler's state is unreadable (%s); using the audit log alone", exc)
        return [], []
    if out is None:
        return [], []
    gaps = compare(views, out, busy)
    for gap in gaps:
        audit.record(gap.event(now_ms, dry_run=False))
        views[gap.node] = gap.view
    by_scheduler = [g.node for g in gaps if g.kind == "drained_by_scheduler"]
    by_hand = [g.node for g in gaps if g.kind == "returned_by_hand"]
    if gaps:
        log.warning("cold start: drained in the scheduler, not in the log: %s; back in service by hand: %s",
                    ", ".join(by_scheduler) or "none", ", ".join(by_hand) or "none")
    return by_scheduler, by_hand
