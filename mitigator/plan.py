"""The data a policy reads and returns: frozen views in, a :class:`Plan` out, never side effects.

An :class:`Action` id is derived from what triggered it (node, job, the timestamp of the risk
record that opened the episode), so replaying the same risk stream yields the same ids and the
executor, which refuses an id it already completed, acts once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from foreshock.mitigator.lifecycle import NodeState

__all__ = [
    "ActionKind", "Action", "NodeView", "JobView", "Block", "Rail", "Plan", "action_id", "trigger_of",
    "count_states",
]

ActionKind = Literal["checkpoint", "drain", "undrain", "migrate", "pin", "unpin"]
Rail = Literal["breaker", "concurrency", "job_share", "no_spare"]


def action_id(kind: ActionKind, node: str, job: str | None, trigger_ts: int) -> str:
    """Deterministic id: the same trigger always names the same action.

    >>> action_id("drain", "node0007", "llm-70b", 1700000000000)
    'drain:node0007:llm-70b:1700000000000'
    """
    return f"{kind}:{node}:{job or '-'}:{trigger_ts}"


def trigger_of(action_id: str) -> int:
    """The trigger timestamp an :func:`action_id` was derived from.

    >>> trigger_of("drain:node0007:llm-70b:1700000000000")
    1700000000000
    """
    return int(action_id.rsplit(":", 1)[1])


@dataclass(frozen=True, slots=True)
class Action:
    """One thing to do. ``replacement`` names the spare a migration moves onto (if any)."""

    action_id: str
    kind: ActionKind
    node: str
    job: str | None
    reason: str
    replacement: str | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the mitigator remembers about one node.

    ``hot``/``cool`` count consecutive records for which acting pays off / the risk is below the
    clear level (the hysteresis); ``trigger_ts`` is the record that started the current episode;
    ``draining`` says the current episode moves the node out (not just a checkpoint).

    The burn-in's memory (:mod:`foreshock.mitigator.burnin`): ``faults`` are the times (ms) of the
    node's newest failures, ``burn_in_since`` when its current burn-in began (mitigator clock, 0
    outside one), ``burned`` the failure its last burn-in followed (one burn-in per failure).
    """

    state: NodeState = NodeState.HEALTHY
    hot: int = 0
    cool: int = 0
    trigger_ts: int = 0
    draining: bool = False
    pinned: bool = False
    unmanageable: bool = False  # the scheduler does not know the node: never acted on again
    faults: tuple[int, ...] = ()
    burn_in_since: int = 0
    burned: int = 0


@dataclass(frozen=True, slots=True)
class JobView:
    """A training job as the mitigator sees it (published by its hook or by the scheduler).

    ``last_checkpoint_ms`` is when its newest durable snapshot finished (the job's start when
    it has none); ``checkpoint_s`` is how long a snapshot takes it.
    """

    job: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    last_checkpoint_ms: int
    checkpoint_s: float

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)


@dataclass(frozen=True, slots=True)
class Block:
    """A drain the policy wanted and a safety rail refused: audited, logged and counted, never silent."""

    rail: Rail
    detail: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's answer for one node: its next view, the actions to take in order, what held it back.

    ``rejected`` says why the record was not taken into the state at all (a time the mitigator
    does not trust); ``blocked`` names the rail that held a wanted drain back.
    """

    node: str
    view: NodeView
    actions: tuple[Action, ...] = ()
    blocked: Block | None = None
    rejected: str | None = None


def count_states(views: Iterable[NodeView]) -> dict[str, int]:
    """Nodes per lifecycle state (the metrics' and the status page's tally)."""
    return dict(Counter(v.state.value for v in views))
