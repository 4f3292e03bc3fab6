"""Reconciliation: each node's desired state against what the scheduler shows, and a rule for each gap.

The mitigator's view of a node is what it wants the node to be: *in service* (healthy, watch, a
checkpoint-only mitigation, repaired), *migrating* (its job leaves and a drain follows) or *drained*
(drained, or in burn-in after a repeat failure). The scheduler shows what is: out of service with
Foreshock's mark (the Slurm reason ``foreshock: …``, the Kubernetes taint), or not. Like the
Kubernetes node lifecycle controller, the mitigator compares the two level by level — at its cold
start, and then on every pass that has a fresh reading of the scheduler (taken every
``reconcile_every_s``, off the consumer loop) — not only when it acts. Where they differ:

* **drained, shown in service**: the drain had been confirmed, so someone returned the node —
  an operator's resume, a repair, or an operator ending a burn-in by hand. The mitigator respects
  it: the node is healthy again and its next alerts start a new episode (the drain still counts in
  the breaker's window). Foreshock cannot tell an operator's resume from a scheduler that lost its
  state; both are taken as the operator's.
* **in service, shown drained with Foreshock's mark**: a drain this mitigator did not record (a log
  lost or replaced, another instance) — the node is taken as drained, so it counts against the
  drain cap and a ``repaired`` event returns it to service.
* **migrating, or an action queued for the node**: the executor is driving it, and a drain not yet
  in effect is repeated with backoff until the scheduler takes it
  (:mod:`foreshock.mitigator.executor`); the comparison leaves the node alone.

Each gap becomes one audit row, replayed by the next cold start like any other: ``undrain`` /
``succeeded`` or ``drain`` / ``succeeded``, with a reason starting :data:`OBSERVED`. In ``--dry-run``
nothing is compared: the scheduler was never touched, so it cannot agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from foreshock.ingest.contract import MitigationEvent
from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.plan import NodeView, action_id

__all__ = ["Desired", "Gap", "OBSERVED", "desired", "compare"]

Desired = Literal["in_service", "migrating", "drained"]
OBSERVED = "observed: "
"""How the reason of every reconciliation row starts."""

_REASONS = {
    "returned_by_hand": f"{OBSERVED}back in service, not by Foreshock (an operator's resume or a repair); "
                        "respected",
    "drained_by_scheduler": f"{OBSERVED}drained with Foreshock's mark, not by this mitigator; "
                            "taken as drained",
}


def desired(view: NodeView) -> Desired:
    """What the mitigator wants ``view``'s node to be.

    >>> desired(NodeView(state=NodeState.MITIGATING, draining=True))
    'migrating'
    """
    if view.state in (NodeState.DRAINED, NodeState.BURN_IN):
        return "drained"
    if view.state is NodeState.MITIGATING and view.draining:
        return "migrating"
    return "in_service"


@dataclass(frozen=True, slots=True)
class Gap:
    """A node whose observed state differs from the desired one, and the view that settles it."""

    node: str
    kind: Literal["returned_by_hand", "drained_by_scheduler"]
    view: NodeView

    def event(self, now_ms: int, dry_run: bool) -> MitigationEvent:
        """The audit row that records it (the cold start replays it into the same view)."""
        kind = "undrain" if self.kind == "returned_by_hand" else "drain"
        return MitigationEvent(ts=now_ms, node=self.node, action_id=action_id(kind, self.node, None, now_ms),
                               action=kind, status="succeeded", reason=_REASONS[self.kind], dry_run=dry_run)


def compare(views: Mapping[str, NodeView], drained: Collection[str], busy: Collection[str]) -> list[Gap]:
    """The gaps between ``views`` and the nodes the scheduler shows ``drained`` with Foreshock's mark.

    ``busy``: nodes with an action queued or running, left to the executor. A node the scheduler
    shows drained and ``views`` does not hold is a gap too (a healthy node, as far as views go).
    A repaired node is left alone: its undrain is queued, or ended for good.
    """
    gaps = []
    for node in sorted(set(views) | set(drained)):
        view = views.get(node, NodeView())
        if node in busy or view.state is NodeState.REPAIRED:
            continue
        want, shown = desired(view), node in drained
        if want == "drained" and not shown:
            gaps.append(Gap(node, "returned_by_hand", replace(
                view, state=NodeState.HEALTHY, draining=False, hot=0, cool=0, trigger_ts=0, burn_in_since=0)))
        elif want == "in_service" and shown:
            drained_view = replace(view, state=NodeState.DRAINED, draining=True)
            gaps.append(Gap(node, "drained_by_scheduler", drained_view))
    return gaps
