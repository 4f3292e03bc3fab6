"""Burn-in after a repair: a node back from a repeat failure stays out until it proves itself.

A node that failed ``failures`` times within ``window_s``
(:class:`~foreshock.models.reliability.BurnIn`; the defaults come from the real trace's
repeat-failure curve, :data:`~foreshock.models.reliability.DEFAULT_BURN_IN`) is likely to fail again
soon after its return. When such a node comes back (a ``repaired`` or ``up`` node event), the
mitigator drains it with a ``foreshock: burn-in: …`` reason instead of returning it to service: it
is in no spare pool (:func:`~foreshock.mitigator.policy.free_spares` takes healthy nodes only) and
no job can be placed on it. After ``length_s`` back without a new fault it is undrained and healthy
again; a fault during it sends it to repair (*drained*), and its next return starts a new burn-in.
An operator may clear a burn-in at any time (``foreshock mitigate --clear-burn-in NODE``), or return
the node by hand (reconciliation respects it).

What counts as a failure: a ``failed`` or ``down`` node event while the node is not already out
with Foreshock's drain, and every drain this mitigator made on a risk record (dated by the record
that triggered it). Each counted one is audited (``fault``, ``observed``) so a restart reads the
history back. One failure gets one burn-in at most: a return after an operator's clear does not
start another. These functions are pure, and shared by the engine and the cold start, so both
read the history the same way.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from foreshock.mitigator.lifecycle import NodeState
from foreshock.mitigator.plan import NodeView, action_id
from foreshock.models.reliability import SECONDS_PER_DAY, BurnIn

__all__ = ["BURN_IN_TAG", "FAULTS_KEPT", "ENTERS", "burn_in_id", "is_burn_in", "after_fault", "with_fault",
           "due", "started", "reason", "failures_within", "span"]

BURN_IN_TAG: Final = "burn-in"
"""Where a job's name goes in the ids of a burn-in's drain and undrain (``drain:N:burn-in:TS``)."""
FAULTS_KEPT: Final = 16
"""Newest failures a node's view keeps: a burn-in counts its ``failures`` newest (at most this many)."""
ENTERS: Final = frozenset({NodeState.HEALTHY, NodeState.WATCH, NodeState.MITIGATING, NodeState.DRAINED,
                           NodeState.REPAIRED})
"""States a node may enter its burn-in from (not while a migration of it is under way)."""


def burn_in_id(kind: str, node: str, ts: int) -> str:
    """Id of a burn-in's drain or undrain; ``ts`` is when the burn-in began (the node's return), or
    the operator's request for an undrain that clears it. A restart reads the start back from it."""
    return action_id(kind, node, BURN_IN_TAG, ts)  # type: ignore[arg-type]


def is_burn_in(aid: str) -> bool:
    """Whether an action id is a burn-in's drain or undrain."""
    return f":{BURN_IN_TAG}:" in aid


def with_fault(view: NodeView, ts: int) -> NodeView:
    """``view`` with a failure at ``ts`` in its history (the newest :data:`FAULTS_KEPT`)."""
    return replace(view, faults=tuple(sorted({*view.faults, ts}))[-FAULTS_KEPT:])


def after_fault(view: NodeView, ts: int) -> NodeView | None:
    """The view after a ``failed``/``down`` event at ``ts``; None when it is no new failure: the node
    is already out with Foreshock's drain, or the event is not newer than its newest failure (a replay)."""
    if view.state is NodeState.DRAINED or (view.faults and ts <= view.faults[-1]):
        return None
    view = with_fault(view, ts)
    if view.state is NodeState.BURN_IN:  # it failed its burn-in: to repair, still drained with our mark
        return replace(view, state=NodeState.DRAINED, draining=False, burn_in_since=0)
    return view


def failures_within(view: NodeView, rule: BurnIn) -> int:
    """The node's failures within the rule's window up to its newest."""
    if not view.faults:
        return 0
    return sum(view.faults[-1] - rule.window_s * 1000 < t for t in view.faults)


def due(view: NodeView, rule: BurnIn | None) -> bool:
    """Whether a node returning to service with ``view`` goes into burn-in under ``rule``."""
    return (rule is not None and bool(view.faults) and view.faults[-1] != view.burned
            and not view.pinned and not view.unmanageable
            and (view.state in ENTERS and not (view.state is NodeState.MITIGATING and view.draining))
            and rule.due([t / 1000 for t in view.faults]))


def started(view: NodeView, since: int, fault: int) -> NodeView:
    """The view of a node whose burn-in (following its failure at ``fault``) began at ``since``
    (its return, or the mitigator's clock when the return is dated later)."""
    return replace(view, state=NodeState.BURN_IN, burn_in_since=since, burned=fault, hot=0, cool=0,
                   trigger_ts=0, draining=False)


def span(seconds: float) -> str:
    """A length as people write it in a reason: ``48 h``, ``90 min``, ``40 s``, ``30 d``.

    >>> span(172800), span(5400), span(40), span(30 * 86400)
    ('48 h', '90 min', '40 s', '30 d')
    """
    if seconds >= SECONDS_PER_DAY * 7 and seconds % SECONDS_PER_DAY == 0:
        return f"{seconds / SECONDS_PER_DAY:g} d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def reason(view: NodeView, rule: BurnIn) -> str:
    """The burn-in drain's reason (the Slurm drain reason too)."""
    return (f"foreshock: burn-in: {failures_within(view, rule)} failures within {span(rule.window_s)}; "
            f"back after {span(rule.length_s)} without a fault")
