"""Decision policies: a callable over a frozen :class:`PolicyContext` that returns a :class:`Plan`.

The expected-loss policy acts when the expected loss of doing nothing, P(fail within H) ×
(work since the job's last checkpoint + restart) × the job's GPUs, exceeds the cost of acting,
(checkpoint + migration) × GPUs — the maths lives in :mod:`foreshock.models.reliability`, not here.
Hysteresis: a node enters *watch* at ``watch_at``, is mitigated only after ``confirm``
consecutive records at or above ``watch_at`` for which acting pays off, and returns to *healthy*
only after ``clear_after`` consecutive records below ``clear_below``. A mitigation is a migration
plus a drain when every safety rail allows it, otherwise a checkpoint only:

* circuit breaker: no new drain once ``breaker_share`` of the fleet was drained within
  ``breaker_window_ms`` of the mitigator's own clock (fleet-wide events are rarely node faults);
  the engine latches it open from the first drain it refuses until an operator resets it;
* at most ``max_concurrent_drains`` nodes draining or drained at once;
* never more than ``max_job_share`` of a job's nodes (at least one) moved at once;
* only onto a free spare (healthy, unpinned, in no job, not promised to another migration): a
  node in burn-in (:mod:`foreshock.mitigator.burnin`) is never one.

Pinned nodes, nodes the scheduler does not know, and nodes out of service (drained, repaired and
waiting for their undrain, in burn-in) are never acted on. A rail that holds a
wanted drain back is named in the plan (:class:`~foreshock.mitigator.plan.Block`), so it can be audited.
New policies register in :data:`POLICIES` by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from foreshock.ingest.contract import RiskScore
from foreshock.mitigator.burnin import FAULTS_KEPT
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.plan import Action, Block, JobView, NodeView, Plan, action_id
from foreshock.models.reliability import (
    DEFAULT_BURN_IN,
    BurnIn,
    expected_crash_loss_gpu_seconds,
    mitigation_cost_gpu_seconds,
    should_mitigate,
)

__all__ = ["PolicyConfig", "PolicyContext", "Policy", "ExpectedLossPolicy", "POLICIES", "free_spares"]


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Thresholds, costs and safety rails; validated once at construction.

    ``burn_in``: the burn-in after a repeat failure (None: none), the real trace's by default.
    """

    watch_at: float = 0.3
    clear_below: float = 0.2
    clear_after: int = 3
    confirm: int = 2
    restart_s: float = 600.0
    migration_s: float = 120.0
    max_concurrent_drains: int = 2
    max_job_share: float = 0.25
    breaker_share: float = 0.05
    breaker_window_ms: int = 3_600_000
    spare_nodes: tuple[str, ...] = ()
    burn_in: BurnIn | None = DEFAULT_BURN_IN

    def __post_init__(self) -> None:
        if not 0.0 <= self.clear_below < self.watch_at <= 1.0:
            raise ValueError("need 0 <= clear_below < watch_at <= 1 (the hysteresis band)")
        if self.clear_after < 1 or self.confirm < 1 or self.max_concurrent_drains < 0:
            raise ValueError("clear_after and confirm must be >= 1, max_concurrent_drains >= 0")
        if not (0 < self.max_job_share <= 1 and 0 < self.breaker_share <= 1):
            raise ValueError("max_job_share and breaker_share must be in (0, 1]")
        if self.restart_s < 0 or self.migration_s < 0 or self.breaker_window_ms <= 0:
            raise ValueError("costs must be >= 0 and the breaker window > 0")
        if self.burn_in is not None and self.burn_in.failures > FAULTS_KEPT:
            raise ValueError(f"a burn-in counts at most {FAULTS_KEPT} failures")

    def breaker_limit(self, fleet_size: int) -> int:
        """Drains allowed within the breaker's window (at least one)."""
        return max(1, math.floor(self.breaker_share * fleet_size))


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Everything a policy may look at for one risk record (read-only)."""

    record: RiskScore
    nodes: Mapping[str, NodeView]
    jobs: tuple[JobView, ...]
    recent_drains: tuple[int, ...]
    fleet_size: int
    reserved_spares: frozenset[str]
    breaker_open: str | None = None  # why the latched breaker is open, None while closed

    def view(self, node: str) -> NodeView:
        return self.nodes.get(node, NodeView())

    def job_of(self, node: str) -> JobView | None:
        return next((j for j in self.jobs if node in j.nodes), None)


Policy = Callable[[PolicyContext], Plan]
_OUT_OF_SERVICE = frozenset({NodeState.DRAINED, NodeState.REPAIRED, NodeState.BURN_IN})


class ExpectedLossPolicy:
    """The decision-theoretic policy of the architecture (see the module docstring)."""

    def __init__(self, config: PolicyConfig | None = None):
        self.config = config or PolicyConfig()

    def __call__(self, ctx: PolicyContext) -> Plan:
        r, c = ctx.record, self.config
        view = ctx.view(r.node)
        elevated = r.probability >= c.watch_at or r.alert
        if view.pinned or view.unmanageable or view.state in _OUT_OF_SERVICE:
            return Plan(r.node, view)
        if view.state is NodeState.HEALTHY and not elevated:
            return Plan(r.node, view)  # the common case: nothing to remember, nothing to do
        job = ctx.job_of(r.node)
        pays = elevated and self._pays(r, job)  # below the watch level nothing counts
        view = replace(
            view, hot=view.hot + 1 if pays else 0, cool=view.cool + 1 if r.probability < c.clear_below else 0
        )
        if view.state is NodeState.HEALTHY:
            if r.probability >= c.watch_at or r.alert:
                view = replace(view, state=NodeState.WATCH)
            return Plan(r.node, view if view.state is NodeState.WATCH else replace(view, hot=0))
        if view.cool >= c.clear_after and not (view.state is NodeState.MITIGATING and view.draining):
            return Plan(
                r.node,
                replace(
                    view,
                    state=NodeState.HEALTHY if view.state is NodeState.WATCH else NodeState.WATCH,
                    hot=0,
                    trigger_ts=0,
                ),
            )
        if view.state is NodeState.WATCH and view.hot >= c.confirm:
            view = replace(view, state=NodeState.MITIGATING, trigger_ts=r.ts)
            return self._mitigate(ctx, view, job, self._why(r, job))
        if view.state is NodeState.MITIGATING and not view.draining and pays:
            return self._mitigate(ctx, view, job, self._why(r, job), upgrade_only=True)
        return Plan(r.node, view)

    def _pays(self, r: RiskScore, job: JobView | None) -> bool:
        if job is None:  # an idle node: moving it out costs nothing, so an alert is enough
            return r.alert
        c = self.config
        since_s = max(0.0, (r.ts - job.last_checkpoint_ms) / 1000)
        return should_mitigate(r.probability, since_s, c.restart_s, job.checkpoint_s, c.migration_s, job.gpus)

    def _why(self, r: RiskScore, job: JobView | None) -> str:
        if job is None:
            return f"p={r.probability:.2f}, idle node on alert"
        c = self.config
        since_s = max(0.0, (r.ts - job.last_checkpoint_ms) / 1000)
        loss = expected_crash_loss_gpu_seconds(r.probability, since_s, c.restart_s, job.gpus)
        cost = mitigation_cost_gpu_seconds(job.checkpoint_s, c.migration_s, job.gpus)
        return f"p={r.probability:.2f} expected loss {loss:.0f} GPU-s vs cost {cost:.0f} GPU-s"

    def _mitigate(
        self, ctx: PolicyContext, view: NodeView, job: JobView | None, why: str, upgrade_only: bool = False
    ) -> Plan:
        node, ts = ctx.record.node, view.trigger_ts
        blocked = self._drain_blocked(ctx, node, job)
        spare = None
        if job is not None and blocked is None:
            spare = self._free_spare(ctx)
            if spare is None:
                blocked = Block("no_spare", "no free spare")
        if blocked is not None:
            if upgrade_only or job is None:
                return Plan(node, view, blocked=blocked)
            return Plan(
                node,
                view,
                (
                    Action(
                        action_id("checkpoint", node, job.job, ts),
                        "checkpoint",
                        node,
                        job.job,
                        f"{why}; checkpoint only: {blocked.detail}",
                    ),
                ),
                blocked=blocked,
            )
        actions = []
        if job is not None:
            actions.append(
                Action(
                    action_id("migrate", node, job.job, ts),
                    "migrate",
                    node,
                    job.job,
                    f"{why}; migrate onto {spare}",
                    replacement=spare,
                )
            )
        actions.append(
            Action(
                action_id("drain", node, job.job if job else None, ts),
                "drain",
                node,
                job.job if job else None,
                f"foreshock: {why}",
            )
        )
        return Plan(node, replace(view, draining=True), tuple(actions))

    def _drain_blocked(self, ctx: PolicyContext, node: str, job: JobView | None) -> Block | None:
        c = self.config
        if ctx.breaker_open is not None:
            return Block("breaker", f"circuit breaker open ({ctx.breaker_open}; reset by an operator)")
        if (drains := len(ctx.recent_drains)) >= c.breaker_limit(ctx.fleet_size):
            return Block("breaker", f"circuit breaker open ({drains} drains within the window)")
        moving = {n for n, v in ctx.nodes.items() if v.draining and v.state is not NodeState.HEALTHY}
        if len(moving) >= c.max_concurrent_drains:
            return Block("concurrency", f"{len(moving)} drains in progress (cap {c.max_concurrent_drains})")
        if job is not None:
            allowed = max(1, math.floor(c.max_job_share * len(job.nodes)))
            if len(moving & set(job.nodes)) >= allowed:
                return Block("job_share", f"job {job.job} already has {allowed} node(s) moving (share cap)")
        return None

    def _free_spare(self, ctx: PolicyContext) -> str | None:
        free = free_spares(self.config.spare_nodes, ctx.nodes, ctx.jobs, ctx.reserved_spares)
        return free[0] if free else None


def free_spares(spares: Sequence[str], nodes: Mapping[str, NodeView], jobs: Iterable[JobView],
                reserved: Collection[str]) -> list[str]:
    """The spares a migration may move onto, in configured order: healthy, unpinned, in no job,
    not promised to another migration."""
    busy = {n for j in jobs for n in j.nodes}
    return [s for s in spares
            if s not in busy and s not in reserved and not (v := nodes.get(s, NodeView())).pinned
            and v.state is NodeState.HEALTHY]


POLICIES: dict[str, Callable[[PolicyConfig], Policy]] = {"expected-loss": ExpectedLossPolicy}
