"""Burn-in in the goodput simulator: what reaches the job when repaired nodes are held out.

Under a :class:`~foreshock.models.reliability.BurnIn` rule, a node back from a repair that follows
its ``failures``-th failure within ``window_s`` is not used as a spare and does not rejoin the job
until it has been back ``length_s`` without a fault. A fault within that time lands on a node out
of service: it interrupts nothing, the node goes back to repair, and its burn-in starts again
after that repair if the rule still holds (it does: one more failure within the window).

:func:`apply_burn_in` turns a trace into the trace the job sees: the failures that land in a
burn-in are dropped, and each remaining failure's ``repair_s`` runs until its node is usable
again (its repair, its burn-in, and any repair and burn-in a fault within it adds), which is when
a node drained on a warning comes back as a spare (:mod:`foreshock.models.goodput.simulate`).
Every strategy then replays that trace unchanged, and its checkpoint intervals follow the
failures it sees. Node identities matter here: a burn-in follows one node's own failures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from foreshock.models.goodput.traces import FailureTrace
from foreshock.models.reliability import BurnIn

__all__ = ["BurnInReplay", "apply_burn_in"]


@dataclass(frozen=True)
class BurnInReplay:
    """The job's view of a trace under a burn-in rule.

    ``kept[i]``: failure ``i`` of the original trace reaches the job; ``held``: failures that
    landed in a burn-in instead; ``burn_ins``: burn-ins started; ``node_s``: node-seconds spent in
    burn-in within the trace (capacity held out of the spare pool and the job).
    """

    trace: FailureTrace
    kept: np.ndarray
    held: int
    burn_ins: int
    node_s: float


def apply_burn_in(trace: FailureTrace, rule: BurnIn) -> BurnInReplay:
    """The failures of ``trace`` that reach a job whose repaired nodes go through ``rule``'s burn-in."""
    n = len(trace)
    kept = np.ones(n, dtype=bool)
    usable = trace.fail_s + trace.repair_s  # when each failure's node can take work again
    burn_ins, node_s = 0, 0.0
    for node in np.unique(trace.node):
        idx = np.flatnonzero(trace.node == node)  # fail_s is sorted, so these are in time order
        times = trace.fail_s[idx]
        due = [rule.due(times[max(0, j - rule.failures + 1): j + 1].tolist()) for j in range(idx.size)]
        for j in range(idx.size - 1, -1, -1):  # backwards: a fault in a burn-in defers its end
            if not due[j]:
                continue
            i, back = idx[j], usable[idx[j]]
            burn_ins += 1
            if j + 1 < idx.size and back <= times[j + 1] < back + rule.length_s:
                kept[idx[j + 1]] = False
                node_s += times[j + 1] - back
                usable[i] = usable[idx[j + 1]]
            else:
                node_s += max(0.0, min(rule.length_s, trace.duration_s - back))
                usable[i] = back + rule.length_s
    job = FailureTrace(trace.name, trace.nodes, trace.gpus_per_node, trace.duration_s, trace.fail_s[kept],
                       (usable - trace.fail_s)[kept], trace.cause[kept], trace.node[kept])
    return BurnInReplay(job, kept, int((~kept).sum()), burn_ins, node_s)
