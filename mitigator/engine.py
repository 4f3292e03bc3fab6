"""The mitigator's memory: per-node views, recent drains, spare reservations, the breaker.

:class:`MitigationEngine` feeds each risk record to a policy through a frozen context, checks the
transition the plan asks for against the lifecycle table, keeps the new view, and hands the plan
back for an executor to apply. Executors report outcomes through :meth:`settle` (a drain that
succeeded moves the node to *drained*; one that failed for good sends it back to *watch*). Records
not newer than the last one seen for a node are ignored, so a replayed stream changes nothing.

Time that a record cannot move: the breaker's window and the drains counted in it are in the
engine's own clock (the time of receipt). A risk record dated more than ``future_tolerance_ms``
after its receipt, or older than ``horizon_ms`` at receipt, is rejected — returned as a plan with
``rejected`` set and not taken into any state — so no record, however dated, can shift the window
or blind the engine to later records of its node. The breaker latches: the first drain it refuses
opens it, and it stays open (across restarts, see :mod:`foreshock.mitigator.coldstart`) until
:meth:`reset_breaker`, as NVIDIA NVSentinel's does.

Node events feed the burn-in (:mod:`foreshock.mitigator.burnin`): :meth:`fault` counts a failure,
:meth:`returned` decides at a return whether the node goes into burn-in, :meth:`burn_ins_due` and
:meth:`pass_burn_in` end it, :meth:`clear_burn_in` is an operator's clear. Burn-in drains do not
count in the breaker's window or against the drain cap: they follow failures, not predictions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from foreshock.ingest.contract import RiskScore
from foreshock.ingest.stream import now_ms
from foreshock.mitigator import burnin
from foreshock.mitigator.jobs import JobSource, StaticJobs
from foreshock.mitigator.lifecycle import NodeState, check_transition
from foreshock.mitigator.plan import Action, NodeView, Plan, action_id, trigger_of
from foreshock.mitigator.policy import ExpectedLossPolicy, Policy, PolicyConfig, PolicyContext, free_spares

__all__ = ["MitigationEngine"]


class MitigationEngine:
    """Run ``policy`` over risk records; keep the state; validate every transition."""

    def __init__(
        self,
        policy: Policy | None = None,
        config: PolicyConfig | None = None,
        jobs: JobSource | None = None,
        fleet_size: int | None = None,
        clock: Callable[[], int] = now_ms,
        horizon_ms: int = 15 * 60_000,
        future_tolerance_ms: int = 2 * 60_000,
    ):
        if horizon_ms <= 0 or future_tolerance_ms < 0:
            raise ValueError("the horizon must be > 0 and the future tolerance >= 0")
        self.config = config or getattr(policy, "config", None) or PolicyConfig()
        self.policy = policy or ExpectedLossPolicy(self.config)
        self.job_source = jobs or StaticJobs()
        self.fleet_size = fleet_size
        self.clock = clock
        self.horizon_ms = horizon_ms
        self.future_tolerance_ms = future_tolerance_ms
        self.views: dict[str, NodeView] = {n: NodeView() for n in self.config.spare_nodes}
        self.breaker: str | None = None  # why the latched breaker is open; None while closed
        self._drains: list[int] = []  # receipt times of the drains planned within the window
        self._last_ts: dict[str, int] = {}  # newest risk record seen per node (replays are ignored)
        self._reserved: dict[str, str] = {}  # spare -> node whose migration it was promised to

    def state(self, node: str) -> NodeState:
        return self.views.get(node, NodeView()).state

    def observe(self, record: RiskScore) -> Plan:
        """Plan for one risk record (an empty plan for a replayed one, a rejection for an untrusted time)."""
        now = self.clock()
        current = self.views.get(record.node, NodeView())
        if (why := self._untrusted(record.ts, now)) is not None:
            return Plan(record.node, current, rejected=why)
        if record.ts <= self._last_ts.get(record.node, -1):
            return Plan(record.node, current)
        self._last_ts[record.node] = record.ts
        ctx = PolicyContext(
            record=record,
            nodes=MappingProxyType(self.views),  # read-only view; the policy runs before any change
            jobs=tuple(self.job_source.jobs()),
            recent_drains=tuple(self.drains_in_window(now)),
            fleet_size=self._fleet(record.node),
            reserved_spares=frozenset(self._reserved),
            breaker_open=self.breaker,
        )
        plan = self.policy(ctx)
        self._accept(plan, current)
        if plan.blocked is not None and plan.blocked.rail == "breaker" and self.breaker is None:
            self.breaker = f"{len(ctx.recent_drains)} drains within the window"
        for a in plan.actions:
            if a.kind == "drain":
                self._drains.append(now)
            if a.kind == "migrate" and a.replacement:
                self._reserved[a.replacement] = a.node
        return plan

    def drains_in_window(self, now: int | None = None) -> list[int]:
        """Receipt times of the drains planned within the breaker's window (dropping older ones)."""
        start = (self.clock() if now is None else now) - self.config.breaker_window_ms
        self._drains = [t for t in self._drains if t > start]
        return self._drains

    def breaker_limit(self) -> int:
        return self.config.breaker_limit(self._fleet(None))

    def free_spares(self) -> list[str]:
        """The spares a migration may move onto now (the policy's own test, see :func:`free_spares`)."""
        return free_spares(self.config.spare_nodes, self.views, self.job_source.jobs(), self._reserved)

    def reset_breaker(self) -> None:
        """An operator's reset: close the breaker and start its window afresh."""
        self.breaker = None
        self._drains = []

    def restore(self, views: Mapping[str, NodeView], drains: list[int], breaker: str | None) -> None:
        """Load the state a cold start rebuilt (:mod:`foreshock.mitigator.coldstart`) before any record."""
        self.views.update(views)
        self._drains = sorted(drains)
        self.breaker = breaker

    def mark(self, node: str) -> tuple:
        """What :meth:`undo` needs to forget one record's effect on ``node`` (its intent was not recorded)."""
        return node, self.views.get(node), self._last_ts.get(node), list(self._drains), self.breaker, dict(
            self._reserved)

    def undo(self, mark: tuple) -> None:
        node, view, last_ts, self._drains, self.breaker, self._reserved = mark
        for store, value in ((self.views, view), (self._last_ts, last_ts)):
            if value is None:
                store.pop(node, None)
            else:
                store[node] = value

    def _untrusted(self, ts: int, now: int) -> str | None:
        if ts > now + self.future_tolerance_ms:
            return (f"dated {(ts - now) / 1000:.0f} s after its receipt "
                    f"(tolerance {self.future_tolerance_ms / 1000:.0f} s)")
        if ts < now - self.horizon_ms:
            return f"{(now - ts) / 1000:.0f} s old at receipt (horizon {self.horizon_ms / 1000:.0f} s)"
        return None

    def _fleet(self, node: str | None) -> int:
        return self.fleet_size or max(len(self.views) + (node is not None and node not in self.views), 1)

    def fault(self, node: str, ts: int) -> bool:
        """A ``failed``/``down`` event at ``ts``: whether it is a new failure (then taken into the
        node's history; a node in burn-in goes to *drained*). Record it before calling this."""
        current = self.views.get(node, NodeView())
        view = burnin.after_fault(current, ts)
        if view is None:
            return False
        self._set(node, current, view)
        return True

    def is_new_fault(self, node: str, ts: int) -> bool:
        """Whether :meth:`fault` would count a failure at ``ts`` (so it can be recorded first)."""
        return burnin.after_fault(self.views.get(node, NodeView()), ts) is not None

    def returned(self, node: str, ts: int, event: str = "repaired") -> Plan:
        """The node is back in service (``repaired`` or ``up``): into burn-in when its failures call
        for one (:func:`foreshock.mitigator.burnin.due`), else a node Foreshock drained is undrained
        on ``repaired``."""
        current = self.views.get(node, NodeView())
        rule = self.config.burn_in
        if rule is not None and burnin.due(current, rule):
            since = min(ts, self.clock())  # from the return; never from a time still to come
            self._release(node)
            drain = Action(burnin.burn_in_id("drain", node, since), "drain", node, None,
                           burnin.reason(current, rule))
            plan = Plan(node, burnin.started(current, since, current.faults[-1]), (drain,))
            self._accept(plan, current)
            return plan
        if event != "repaired" or current.state is not NodeState.DRAINED:
            return Plan(node, current)
        self._release(node)
        view = replace(current, state=NodeState.REPAIRED, hot=0, cool=0, draining=False)
        plan = Plan(
            node,
            view,
            (
                Action(
                    action_id("undrain", node, None, ts), "undrain", node, None, "foreshock: node repaired"
                ),
            ),
        )
        self._accept(plan, current)
        return plan

    def burn_ins_due(self) -> list[str]:
        """Nodes whose burn-in has lasted its length without a fault (all of them without a rule)."""
        length_ms = self.config.burn_in.length_s * 1000 if self.config.burn_in is not None else 0
        now = self.clock()
        return sorted(n for n, v in self.views.items()
                      if v.state is NodeState.BURN_IN and v.burn_in_since + length_ms <= now)

    def pass_burn_in(self, node: str) -> Plan:
        """End a burn-in that lasted its length: undrain the node (healthy once that holds)."""
        current, rule = self.views[node], self.config.burn_in
        why = "foreshock: burn-in ended: no burn-in configured" if rule is None else \
            f"foreshock: burn-in passed: {burnin.span(rule.length_s)} back without a fault"
        return self._end_burn_in(node, burnin.burn_in_id("undrain", node, current.burn_in_since), why)

    def clear_burn_in(self, node: str, ts: int, reason: str) -> Plan | None:
        """An operator's clear of ``node``'s burn-in (None when it is in none): undrain it now."""
        if self.state(node) is not NodeState.BURN_IN:
            return None
        return self._end_burn_in(node, burnin.burn_in_id("undrain", node, ts), f"{reason}: burn-in cleared")

    def _end_burn_in(self, node: str, aid: str, why: str) -> Plan:
        current = self.views[node]
        view = replace(current, state=NodeState.REPAIRED, burn_in_since=0)
        plan = Plan(node, view, (Action(aid, "undrain", node, None, why),))
        self._accept(plan, current)
        return plan

    def observed(self, node: str, view: NodeView) -> None:
        """Take the view a reconciliation settled on (:mod:`foreshock.mitigator.reconcile`): the node as the
        scheduler shows it. A node back in service gives up the spare its migration was promised."""
        current = self.views.get(node, NodeView())
        if view.state is not current.state:
            check_transition(node, current.state, view.state, observed=True)
        if view.state is not NodeState.DRAINED:
            self._release(node)
        self.views[node] = view

    def pin(self, node: str, ts: int, pinned: bool = True, reason: str = "operator") -> Plan:
        """Pin (exclude from every action) or unpin a node; recorded like any action."""
        current = self.views.get(node, NodeView())
        kind = "pin" if pinned else "unpin"
        plan = Plan(
            node,
            replace(current, pinned=pinned),
            (Action(action_id(kind, node, None, ts), kind, node, None, reason),),
        )
        self._accept(plan, current)
        return plan

    def settle(self, action: Action, succeeded: bool, permanent: bool = False) -> None:
        """Take an executor's final outcome into the state (drained / back to watch / healthy).

        ``permanent``: the scheduler does not know the node, so it is never acted on again.
        """
        view = self.views.get(action.node, NodeView())
        if permanent:
            view = replace(view, unmanageable=True)
            self.views[action.node] = view
        if action.kind == "drain" and view.state is NodeState.MITIGATING:
            new = NodeState.DRAINED if succeeded else NodeState.WATCH
            drained = replace(view, state=new, draining=succeeded, hot=0)
            if succeeded:  # a predicted failure, dated by the record that triggered it
                drained = burnin.with_fault(drained, trigger_of(action.action_id))
            self._set(action.node, view, drained)
            if not succeeded:
                self._release(action.node)
        elif action.kind == "migrate" and not succeeded:
            self._release(action.node)
        elif action.kind == "undrain" and succeeded and view.state is NodeState.REPAIRED:
            self._set(action.node, view, replace(view, state=NodeState.HEALTHY))

    def _release(self, node: str) -> None:
        for spare, owner in list(self._reserved.items()):
            if owner == node:
                del self._reserved[spare]

    def _accept(self, plan: Plan, current: NodeView) -> None:
        self._set(plan.node, current, plan.view)

    def _set(self, node: str, current: NodeView, new: NodeView) -> None:
        if new.state is not current.state:
            check_transition(node, current.state, new.state)
        self.views[node] = new
