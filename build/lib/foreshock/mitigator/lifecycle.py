"""Node lifecycle for mitigation: an explicit transition table, checked on every change.

``healthy → watch → mitigating → drained → repaired → healthy`` with the back-edges that
hysteresis needs (``watch → healthy`` when the risk clears, ``mitigating → watch`` when a
checkpoint-only mitigation is over or an action failed). Any other move is a bug in a policy and
raises :class:`IllegalTransition` instead of silently corrupting the state.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["NodeState", "TRANSITIONS", "IllegalTransition", "check_transition"]


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


class IllegalTransition(RuntimeError):
    """A policy asked for a move the lifecycle table does not allow."""


def check_transition(node: str, current: NodeState, new: NodeState) -> NodeState:
    """Return ``new`` when ``current → new`` is in :data:`TRANSITIONS`; raise otherwise.

    >>> check_transition("n1", NodeState.HEALTHY, NodeState.WATCH)
    <NodeState.WATCH: 'watch'>
    """
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"{node}: {current} -> {new} is not an allowed transition")
    return new
