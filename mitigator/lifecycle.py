"""Node lifecycle for mitigation: an explicit transition table, checked on every change.

``healthy → watch → mitigating → drained → repaired → healthy`` with the back-edges that
hysteresis needs (``watch → healthy`` when the risk clears, ``mitigating → watch`` when a
checkpoint-only mitigation is over or an action failed). Any other move is a bug in a policy and
raises :class:`IllegalTransition` instead of silently corrupting the state.

:data:`OBSERVED_TRANSITIONS` are the few more moves that only the scheduler's observed state may
force (see :mod:`foreshock.mitigator.reconcile`): a drained node returned to service by hand, a node
found drained with Foreshock's mark.
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


TRANSITIONS: Final[dict[NodeState, frozenset[NodeState]]] = {
    NodeState.HEALTHY: frozenset({NodeState.WATCH}),
    NodeState.WATCH: frozenset({NodeState.HEALTHY, NodeState.MITIGATING}),
    NodeState.MITIGATING: frozenset({NodeState.DRAINED, NodeState.WATCH}),
    NodeState.DRAINED: frozenset({NodeState.REPAIRED}),
    NodeState.REPAIRED: frozenset({NodeState.HEALTHY, NodeState.WATCH}),
}

OBSERVED_TRANSITIONS: Final[dict[NodeState, frozenset[NodeState]]] = {
    NodeState.HEALTHY: frozenset({NodeState.DRAINED}),
    NodeState.WATCH: frozenset({NodeState.DRAINED}),
    NodeState.MITIGATING: frozenset({NodeState.DRAINED}),
    NodeState.DRAINED: frozenset({NodeState.HEALTHY}),
    NodeState.REPAIRED: frozenset(),
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
