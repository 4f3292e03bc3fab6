"""Tiered in-memory checkpoints: the job model's costs, its closed form and its derived intervals.

A tiered job keeps its state in three places (the training-side library's memory, peer and
durable tiers):

* every ``interval_s`` of compute a **memory snapshot** copies each GPU's state to host memory,
  stalling training ``snapshot_s``; the snapshot is then replicated **asynchronously** to a buddy
  node's host memory and counts for recovery ``replicate_s`` after its stall ends;
* every ``durable_every``-th snapshot is also written to **durable storage**, stalling training a
  further ``durable_s``; it counts once that write ends.

An unwarned failure loses the work since the last replicated snapshot and costs
``peer_recovery_s`` (the lost node is rebuilt from its buddy). With probability
``pair_loss_probability`` the failure takes both copies (the node and its buddy), and then the
work since the last durable snapshot is lost and recovery costs ``durable_recovery_s``. A warned
failure snapshots the node's memory and moves it to a spare: ``snapshot_s`` plus the job's
``migration_s``, no durable write and no work lost (see ``foreshock.models.goodput.simulate``).

The intervals are Young/Daly-optimal for each tier's stall and the failures that tier protects
against (:func:`tier_intervals`): the memory tier every unwarned failure, the durable tier the
pair losses only. :func:`ettr_tiered` is the exact expected ETTR of this model under exponential
failures (without replication delay), which the simulator is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from foreshock.models.goodput.traces import FailureTrace
from foreshock.models.reliability import daly_interval_seconds, ettr_with_warnings

__all__ = [
    "MAX_DURABLE_EVERY",
    "TierParams",
    "draw_pair_losses",
    "ettr_tiered",
    "ettr_tiered_with_prediction",
    "pair_loss_probability",
    "pair_loss_window_s",
    "tier_intervals",
]

MAX_DURABLE_EVERY = 2**31  # "never": the durable interval a trace without pair losses calls for


@dataclass(frozen=True)
class TierParams:
    """Seconds each tier costs the job, and the chance that one failure takes both copies.

    ``pair_loss_probability`` None means "estimate it from the trace being replayed"
    (:func:`pair_loss_probability`); strategies resolve it before simulating.
    """

    snapshot_s: float
    replicate_s: float
    durable_s: float
    peer_recovery_s: float
    durable_recovery_s: float
    pair_loss_probability: float | None = None

    def __post_init__(self) -> None:
        times = (self.snapshot_s, self.replicate_s, self.durable_s, self.peer_recovery_s,
                 self.durable_recovery_s)
        if min(times) < 0:
            raise ValueError("tier costs must be non-negative")
        q = self.pair_loss_probability
        if q is not None and not 0.0 <= q <= 1.0:
            raise ValueError("pair_loss_probability must be in [0, 1]")

    @property
    def q(self) -> float:
        """The pair-loss probability; an error while it is still to be estimated."""
        if self.pair_loss_probability is None:
            raise ValueError("pair_loss_probability not resolved: estimate it from the trace first")
        return self.pair_loss_probability


def tier_intervals(tiers: TierParams, unwarned_mtbf_s: float) -> tuple[float, int]:
    """(memory interval in compute seconds, durable every K-th snapshot), each Daly-optimal.

    The memory tier protects against every unwarned failure (mean time between them
    ``unwarned_mtbf_s``) at a stall of ``snapshot_s``; it is never shorter than the replication
    it waits for (a snapshot taken before the previous one reached the buddy buys nothing). The
    durable tier protects against pair losses only (mean time ``unwarned_mtbf_s / q``) at a stall
    of ``durable_s``; K is that interval in memory intervals, rounded, at least 1.

    >>> memory, every = tier_intervals(TierParams(0.1, 0.0, 3.0, 40.0, 60.0, 1e-3), 11_100.0)
    >>> round(memory, 1), every, round(every * memory / 3600, 1)   # 47 s snapshots, storage every 2.3 h
    (47.1, 173, 2.3)
    """
    memory = max(daly_interval_seconds(tiers.snapshot_s, unwarned_mtbf_s), tiers.replicate_s)
    if math.isinf(memory):
        return math.inf, MAX_DURABLE_EVERY
    q = tiers.q
    durable = math.inf if q <= 0 else daly_interval_seconds(tiers.durable_s, unwarned_mtbf_s / q)
    if math.isinf(durable):
        return memory, MAX_DURABLE_EVERY
    return memory, int(min(MAX_DURABLE_EVERY, max(1, round(durable / (memory + tiers.snapshot_s)))))


def pair_loss_window_s(tiers: TierParams, interval_s: float) -> float:
    """How long after a failure one copy only of the failed node's state (and its buddy's) exists.

    Recovery rebuilds the node from its buddy; the buddy's own replica, which lived on the failed
    node, is back once the next snapshot has been taken and replicated.
    """
    return tiers.peer_recovery_s + interval_s + tiers.snapshot_s + tiers.replicate_s


def pair_loss_probability(trace: FailureTrace, window_s: float) -> float:
    """P(a failure takes both copies), estimated from how failures of a trace cluster in time.

    Counts the pairs of failures of *different* nodes at most ``window_s`` apart (a burst of k
    simultaneous faults is k(k-1)/2 pairs) and charges each pair the chance that the two nodes
    are buddies, 1/(nodes - 1) for buddies paired at random (replication factor 2). The result
    is that expected number of pair losses per failure. Buddies placed in one failure domain
    (same rack, same leaf switch) would raise it; nothing in the traces says where nodes sit.
    """
    n = len(trace)
    if n < 2 or trace.nodes < 2:
        return 0.0
    t, node = trace.fail_s, trace.node
    close = np.arange(n) - np.searchsorted(t, t - window_s, side="left")  # earlier failures in the window
    same = 0
    order = np.lexsort((t, node))
    ts, ns = t[order], node[order]
    starts = np.flatnonzero(np.r_[True, ns[1:] != ns[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], n], strict=True):
        seg = ts[a:b]
        same += int(np.sum(np.arange(len(seg)) - np.searchsorted(seg, seg - window_s, side="left")))
    pairs = int(close.sum()) - same
    return pairs / n / (trace.nodes - 1)


def draw_pair_losses(trace: FailureTrace, q: float, seed: int = 0) -> np.ndarray:
    """Which failures take both copies: one draw per failure, shared by every tiered strategy."""
    return np.random.default_rng([seed, 2]).random(len(trace)) < q


def _restarted_lt(length: float, rate: float, s: float, inner: float = 1.0) -> float:
    """Laplace transform at ``s`` of the time to get through ``length`` seconds that a Poisson
    process of ``rate`` restarts, each restart first costing a delay of transform ``inner``."""
    k = rate + s
    hit = rate * -math.expm1(-k * length) / k if k > 0 else 0.0
    return math.exp(-k * length) / (1.0 - hit * inner)


def _restarted_mean(length: float, rate: float, restart_mean: float) -> float:
    """Mean of the same time at ``s = 0``: ``(e^(rate·length) − 1)·(1/rate + restart_mean)``."""
    if rate <= 0:
        return length
    return math.expm1(rate * length) * (1.0 / rate + restart_mean)


def ettr_tiered(interval_s: float, durable_every: int, tiers: TierParams, mtbf_s: float) -> float:
    """Expected ETTR of the tiered job model, exact under exponential failures when
    ``replicate_s`` is 0 (a replication delay of a fraction of a second is not modelled here).

    Failures arrive at rate λ = 1/``mtbf_s``, each a pair loss with probability q: peer losses
    at (1−q)λ and pair losses at qλ, independent. A durable cycle is K segments of
    ``interval_s + snapshot_s`` (the K-th also ``durable_s``). Within it a peer loss repeats the
    current segment after a peer recovery that peer losses restart; let X be the time to get
    through the cycle that way, with Laplace transform L. A pair loss anywhere (peer recoveries
    included) sends the job back to the cycle's start after a durable recovery that any failure
    restarts, of mean D = (e^(λ·R_d) − 1)/λ. With resets at rate qλ the cycle takes, on average,
    ``(1/L(qλ) − 1)·(1/(qλ) + D)`` (→ E[X] as q → 0), and ETTR = K·interval / that.

    >>> round(ettr_tiered(60.0, 10, TierParams(0.2, 0.0, 5.0, 60.0, 600.0, 0.0), 3 * 3600.0), 4)
    0.9802
    """
    if interval_s <= 0 or durable_every < 1:
        raise ValueError("interval_s must be > 0 and durable_every >= 1")
    if math.isinf(mtbf_s):
        cycle = durable_every * (interval_s + tiers.snapshot_s) + tiers.durable_s
        return interval_s * durable_every / cycle
    lam, q, k = 1.0 / mtbf_s, tiers.q, durable_every
    peer, pair = (1.0 - q) * lam, q * lam
    plain, last = interval_s + tiers.snapshot_s, interval_s + tiers.snapshot_s + tiers.durable_s
    if pair <= 0:
        recover = _restarted_mean(tiers.peer_recovery_s, peer, 0.0)
        wall = (k - 1) * _restarted_mean(plain, peer, recover) + _restarted_mean(last, peer, recover)
        return k * interval_s / wall
    recovery_lt = _restarted_lt(tiers.peer_recovery_s, peer, pair)
    cycle_lt = (_restarted_lt(plain, peer, pair, recovery_lt) ** (k - 1)
                * _restarted_lt(last, peer, pair, recovery_lt))
    durable_mean = math.expm1(lam * tiers.durable_recovery_s) / lam
    wall = (1.0 / cycle_lt - 1.0) * (1.0 / pair + durable_mean)
    return k * interval_s / wall


def ettr_tiered_with_prediction(interval_s: float, durable_every: int, tiers: TierParams, mtbf_s: float, *,
                                recall: float, lead_time_s: float, migration_s: float,
                                false_alarms_per_day: float) -> float:
    """First-order ETTR of the tiered job with warnings, as ``ettr_with_prediction`` is for one tier.

    Predicted failures warned at least ``snapshot_s + migration_s`` ahead are avoided at that
    cost; the rest go to :func:`ettr_tiered` at the residual rate; each false alarm costs the same
    snapshot and migration. Assumes a spare is always free and mitigations are rare.
    """
    return ettr_with_warnings(lambda mtbf: ettr_tiered(interval_s, durable_every, tiers, mtbf),
                              tiers.snapshot_s + migration_s, mtbf_s, recall=recall, lead_time_s=lead_time_s,
                              false_alarms_per_day=false_alarms_per_day)
