"""Node lifecycle for mitigation: an explicit transition table, checked on every change.

``healthy → watch → mitigating → drained → repaired → healthy`` with the back-edges that
hysteresis needs (``watch → healthy`` when the risk clears, ``mitigating → watch`` when a
checkpoint-only mitigation is over or an action failed), and the burn-in
(:mod:`foreshock.mitigator.burnin`): a node back from a repeat failure goes to ``burn_in`` instead of
service, from there to ``repaired`` once it passes (or an operator clears it), or back to
``drained`` when it faults again. Any other move is a bug in a policy and raises
:class:`IllegalTransition` instead of silently corrupting the state.

:data:`OBSERVED_TRANSITIONS` are the few more moves that only the scheduler's observed state may
force (see :mod:`foreshock.mitigator.reconcile`): a drained (or burning-in) node returned to service
by hand, a node found drained with Foreshock's mark.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["NodeState", "TRANSITIONS", "OBSERVED_TRANSITIONS", "IllegalTransition", "check_transition"]


class NodeState(StrEnum):
    HEALTHY = "healthy"
    WATCH = "watch"
    MITIGATING = "mitigating"
    DRAINED = "drained"
    REPAIRED = "repaired"
    BURN_IN = "burn_in"


TRANSITIONS: Final[dict[NodeState, frozenset[NodeState]]] = {
    NodeState.HEALTHY: frozenset({NodeState.WATCH, NodeState.BURN_IN}),
    NodeState.WATCH: frozenset({NodeState.HEALTHY, NodeState.MITIGATING, NodeState.BURN_IN}),
    NodeState.MITIGATING: frozenset({NodeState.DRAINED, NodeState.WATCH, NodeState.BURN_IN}),
    NodeState.DRAINED: frozenset({NodeState.REPAIRED, NodeState.BURN_IN}),
    NodeState.REPAIRED: frozenset({NodeState.HEALTHY, NodeState.WATCH, NodeState.BURN_IN}),
    NodeState.BURN_IN: frozenset({NodeState.REPAIRED, NodeState.DRAINED}),
}

OBSERVED_TRANSITIONS: Final[dict[NodeState, frozenset[NodeState]]] = {
    NodeState.HEALTHY: frozenset({NodeState.DRAINED}),
    NodeState.WATCH: frozenset({NodeState.DRAINED}),
    NodeState.MITIGATING: frozenset({NodeState.DRAINED}),
    NodeState.DRAINED: frozenset({NodeState.HEALTHY}),
    NodeState.REPAIRED: frozenset(),
    NodeState.BURN_IN: frozenset({NodeState.HEALTHY}),
}


class IllegalTransition(RuntimeError):
    """A policy asked for a move the lifecycle table does not allow."""


def check_transition(node: str, current: NodeState, new: NodeState, observed: bool = False) -> NodeState:
    """Return ``new`` when ``current → new`` is in :data:`TRANSITIONS` (or, when the scheduler's
    ``observed`` state forces it, in :data:`OBSERVED_TRANSITIONS`); raise otherwise.

    >>> check_transition("n1", NodeState.HEALTHY, NodeState.WATCH)
    <NodeState.WATCH: 'watch'>
    """
    if new not in TRANSITIONS[current] | (OBSERVED_TRANSITIONS[current] if observed else frozenset()):
        raise IllegalTransition(f"{node}: {current} -> {new} is not an allowed transition")
    return new
