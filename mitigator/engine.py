"""The mitigator's memory: per-node views, recent drains, spare reservations.

:class:`MitigationEngine` feeds each risk record to a policy through a frozen context, checks the
transition the plan asks for against the lifecycle table, keeps the new view, and hands the plan
back for an executor to apply. Executors report outcomes through :meth:`settle` (a drain that
succeeded moves the node to *drained*; one that failed sends it back to *watch*). Records not newer
than the last one seen for a node are ignored, so a replayed stream changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ingest.contract import RiskScore
from mitigator.jobs import JobSource, StaticJobs
from mitigator.lifecycle import NodeState, check_transition
from mitigator.plan import Action, NodeView, Plan, action_id
from mitigator.policy import ExpectedLossPolicy, Policy, PolicyConfig, PolicyContext

__all__ = ["MitigationEngine"]


class MitigationEngine:
    """Run ``policy`` over risk records; keep the state; validate every transition."""

    def __init__(
        self,
        policy: Policy | None = None,
        config: PolicyConfig | None = None,
        jobs: JobSource | None = None,
        fleet_size: int | None = None,
    ):
        self.config = config or getattr(policy, "config", None) or PolicyConfig()
        self.policy = policy or ExpectedLossPolicy(self.config)
        self.job_source = jobs or StaticJobs()
        self.fleet_size = fleet_size
        self.views: dict[str, NodeView] = {n: NodeView() for n in self.config.spare_nodes}
        self._drains: list[int] = []
        self._last_ts: dict[str, int] = {}  # newest risk record seen per node (replays are ignored)
        self._reserved: dict[str, str] = {}  # spare -> node whose migration it was promised to

    def state(self, node: str) -> NodeState:
        return self.views.get(node, NodeView()).state

    def observe(self, record: RiskScore) -> Plan:
        """Plan for one risk record (an empty plan for a stale or replayed record)."""
        current = self.views.get(record.node, NodeView())
        if record.ts <= self._last_ts.get(record.node, -1):
            return Plan(record.node, current)
        self._last_ts[record.node] = record.ts
        window_start = record.ts - self.config.breaker_window_ms
        self._drains = [t for t in self._drains if t > window_start]
        ctx = PolicyContext(
            record=record,
            nodes=MappingProxyType(self.views),  # read-only view; the policy runs before any change
            jobs=tuple(self.job_source.jobs()),
            recent_drains=tuple(self._drains),
            fleet_size=self.fleet_size or max(len(self.views) + (record.node not in self.views), 1),
            reserved_spares=frozenset(self._reserved),
        )
        plan = self.policy(ctx)
        self._accept(plan, current)
        for a in plan.actions:
            if a.kind == "drain":
                self._drains.append(record.ts)
            if a.kind == "migrate" and a.replacement:
                self._reserved[a.replacement] = a.node
        return plan

    def repaired(self, node: str, ts: int) -> Plan:
        """The node was repaired: undrain it (only a drained node can be repaired)."""
        current = self.views.get(node, NodeView())
        if current.state is not NodeState.DRAINED:
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

    def settle(self, action: Action, succeeded: bool) -> None:
        """Take an executor's outcome into the state (drained / back to watch / healthy)."""
        view = self.views.get(action.node, NodeView())
        if action.kind == "drain" and view.state is NodeState.MITIGATING:
            new = NodeState.DRAINED if succeeded else NodeState.WATCH
            self._set(action.node, view, replace(view, state=new, draining=succeeded, hot=0))
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
