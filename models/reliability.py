"""Reliability maths for checkpointed training jobs: MTBF, optimal checkpoint intervals, ETTR.

Closed forms that the goodput simulator (``foreshock.models.goodput``) is tested against and that the
mitigator's policy uses to decide whether acting on a risk score pays.

Common assumptions (each function restates what it relies on):

* Failures of the job arrive as a Poisson process (exponential inter-arrival times, memoryless)
  with mean ``mtbf_s``; any failure of any of the job's GPUs interrupts the whole job.
* ``checkpoint_s`` is the *blocking* part of a checkpoint (for an async save, the time the
  training loop is stalled), during which a failure loses the checkpoint being written.
* ``restart_s`` is the time from a crash to training again (rescheduling onto a replacement node,
  process start, loading the last checkpoint). Failures can also strike during a restart, which
  then starts over.
* ``interval_s`` is the compute time between the end of one checkpoint and the start of the next.

ETTR (effective training time ratio) is productive compute time / wall time; 1 - ETTR is the
fraction of the job's GPU time lost to checkpoints, recomputation, restarts and migrations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SECONDS_PER_DAY",
    "cluster_mtbf_seconds",
    "young_interval_seconds",
    "daly_interval_seconds",
    "ettr_periodic",
    "ettr_with_prediction",
    "ettr_with_warnings",
    "mitigation_success_probability",
    "expected_crash_loss_gpu_seconds",
    "mitigation_cost_gpu_seconds",
    "should_mitigate",
    "BurnIn",
    "DEFAULT_BURN_IN",
]

SECONDS_PER_DAY = 86_400.0


def cluster_mtbf_seconds(rate_per_gpu_day: float, gpus: int) -> float:
    """Mean time between job interruptions of a job spanning ``gpus`` GPUs.

    ``rate_per_gpu_day`` is the interruption rate of one GPU (all causes summed: per-cause rates
    add because independent Poisson processes superpose). Assumes failures of different GPUs are
    independent, so the job's rate is ``gpus`` times the per-GPU rate.

    >>> round(cluster_mtbf_seconds(419 / 54 / 16384, 16384) / 3600, 2)   # Llama 3: ~3.1 h
    3.09
    """
    if rate_per_gpu_day < 0 or gpus <= 0:
        raise ValueError("rate_per_gpu_day must be >= 0 and gpus > 0")
    if rate_per_gpu_day == 0:
        return math.inf
    return SECONDS_PER_DAY / (rate_per_gpu_day * gpus)


def young_interval_seconds(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimal compute time between checkpoints: sqrt(2·C·M).

    Valid when the checkpoint cost C is small against the MTBF M; it ignores restart time and
    failures during checkpoints. Returns ``inf`` when failures never happen.
    """
    if math.isinf(mtbf_s):
        return math.inf
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_seconds(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimal compute time between checkpoints.

    ``sqrt(2dM)·[1 + (1/3)·sqrt(d/2M) + (1/9)·(d/2M)] − d`` for d < 2M, and M otherwise
    (d = checkpoint_s, M = mtbf_s). Assumes exponential failures; more accurate than Young when
    the checkpoint is not negligible against the MTBF. Returns ``inf`` when failures never happen.

    >>> round(daly_interval_seconds(30, 3 * 3600))
    785
    """
    if math.isinf(mtbf_s):
        return math.inf
    d, m = checkpoint_s, mtbf_s
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def ettr_periodic(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected ETTR of periodic checkpointing, exact under exponential failures (Daly 2006).

    A segment is ``interval_s`` of compute followed by a ``checkpoint_s`` blocking write; it only
    counts once both finish without a failure. After a failure the job restarts (``restart_s``,
    itself interruptible) and recomputes from the last committed checkpoint. The expected wall
    time per segment is ``M·e^(R/M)·(e^((T+C)/M) − 1)``, so ETTR = T / that.

    >>> round(ettr_periodic(1800, 30, 600, 3 * 3600), 3)
    0.854
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    if math.isinf(mtbf_s):
        return 1.0 if math.isinf(interval_s) else interval_s / (interval_s + checkpoint_s)
    if math.isinf(interval_s):
        return 0.0
    m = mtbf_s
    with np.errstate(over="ignore"):
        wall = m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m)
    return interval_s / wall


def mitigation_success_probability(lead_time_s: float | Sequence[float] | np.ndarray,
                                   needed_s: float) -> float:
    """P(lead time >= ``needed_s``): the share of predicted failures warned early enough to finish
    a proactive checkpoint and migration.

    A scalar ``lead_time_s`` is taken as the *median* of an exponential lead-time distribution
    (memoryless, deliberately pessimistic: many warnings come late); an array is used as an
    empirical sample of lead times.
    """
    if np.ndim(lead_time_s) == 0:
        median = float(lead_time_s)  # type: ignore[arg-type]
        if median <= 0:
            return 0.0
        return float(2.0 ** (-needed_s / median))
    sample = np.asarray(lead_time_s, dtype=float)
    if sample.size == 0:
        return 0.0
    return float(np.mean(sample >= needed_s))


def ettr_with_prediction(
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    *,
    recall: float,
    lead_time_s: float | Sequence[float] | np.ndarray,
    false_alarms_per_day: float,
    migration_s: float,
) -> float:
    """Expected ETTR of periodic checkpointing plus proactive mitigation of predicted failures.

    A failure is predicted with probability ``recall``; a predicted failure whose warning leaves
    at least ``checkpoint_s + migration_s`` (see :func:`mitigation_success_probability`) is
    avoided at the cost of a checkpoint and a migration, with no recomputation and no restart.
    Every other failure crashes the job as in :func:`ettr_periodic` with the residual rate.
    Each false alarm (``false_alarms_per_day`` over the whole job) costs a checkpoint and a
    migration too. First-order approximation: assumes spares are always available, mitigations
    are rare (their cost is a fraction of wall time), and ignores that a proactive checkpoint
    also resets the periodic schedule (a small gain).
    """
    return ettr_with_warnings(lambda mtbf: ettr_periodic(interval_s, checkpoint_s, restart_s, mtbf),
                              checkpoint_s + migration_s, mtbf_s, recall=recall, lead_time_s=lead_time_s,
                              false_alarms_per_day=false_alarms_per_day)


def ettr_with_warnings(ettr_of: Callable[[float], float], mitigate_s: float, mtbf_s: float, *,
                       recall: float, lead_time_s: float | Sequence[float] | np.ndarray,
                       false_alarms_per_day: float) -> float:
    """First-order ETTR of any job model with warnings: ``ettr_of(mtbf)`` for the failures left.

    Failures warned at least ``mitigate_s`` ahead are avoided at that cost, the rest crash the job
    at the residual rate, and each false alarm costs ``mitigate_s`` too.
    """
    if not 0.0 <= recall <= 1.0:
        raise ValueError("recall must be in [0, 1]")
    rate = 0.0 if math.isinf(mtbf_s) else 1.0 / mtbf_s
    avoided = rate * recall * mitigation_success_probability(lead_time_s, mitigate_s)
    residual = rate - avoided
    base = ettr_of(math.inf if residual <= 0 else 1.0 / residual)
    overhead = (avoided + false_alarms_per_day / SECONDS_PER_DAY) * mitigate_s
    return max(0.0, base * (1.0 - overhead))


def expected_crash_loss_gpu_seconds(p_fail: float, seconds_since_checkpoint: float, restart_s: float,
                                    gpus: int) -> float:
    """Expected GPU-seconds lost if nothing is done: P(fail) × (work since checkpoint + restart) × GPUs.

    Assumes a crash loses all work since the last committed checkpoint and idles every GPU of the
    job for the restart.
    """
    return p_fail * (seconds_since_checkpoint + restart_s) * gpus


def mitigation_cost_gpu_seconds(checkpoint_s: float, migration_s: float, gpus: int) -> float:
    """GPU-seconds a proactive checkpoint plus migration costs: (checkpoint + migration) × GPUs.

    Assumes the whole job stalls for the blocking checkpoint write and the migration, and that a
    spare node is available (otherwise the cost is a planned restart: checkpoint + restart).
    """
    return (checkpoint_s + migration_s) * gpus


def should_mitigate(p_fail: float, seconds_since_checkpoint: float, restart_s: float, checkpoint_s: float,
                    migration_s: float, gpus: int) -> bool:
    """True when the expected loss of doing nothing exceeds the cost of acting now.

    >>> should_mitigate(0.5, 1200, 600, 30, 60, 1024)
    True
    >>> should_mitigate(0.01, 60, 600, 30, 60, 1024)
    False
    """
    loss = expected_crash_loss_gpu_seconds(p_fail, seconds_since_checkpoint, restart_s, gpus)
    return loss > mitigation_cost_gpu_seconds(checkpoint_s, migration_s, gpus)


@dataclass(frozen=True, slots=True)
class BurnIn:
    """Burn-in after a repair: a node back from its ``failures``-th failure within ``window_s``
    (that failure included) stays out of service, out of the spare pool and off every job, until
    it has spent ``length_s`` back without a new fault (or an operator clears it).

    One rule for the mitigator (``foreshock mitigate --burn-in-failures/--burn-in-window/--burn-in``)
    and the goodput simulator (``foreshock goodput --burn-in``).

    >>> DEFAULT_BURN_IN.due([0.0, 10 * SECONDS_PER_DAY])
    True
    >>> DEFAULT_BURN_IN.due([0.0, 40 * SECONDS_PER_DAY])
    False
    """

    failures: int
    window_s: float
    length_s: float

    def __post_init__(self) -> None:
        if self.failures < 1 or self.window_s <= 0 or self.length_s <= 0:
            raise ValueError("a burn-in needs failures >= 1, a window > 0 and a length > 0")

    def due(self, failure_times: Sequence[float]) -> bool:
        """Whether a node whose failures came at ``failure_times`` (seconds, the latest is the one
        just repaired) goes into burn-in: ``failures`` of them within ``window_s`` up to the latest."""
        if not failure_times:
            return False
        latest = max(failure_times)
        return sum(latest - self.window_s < t <= latest for t in failure_times) >= self.failures


DEFAULT_BURN_IN = BurnIn(failures=2, window_s=30 * SECONDS_PER_DAY, length_s=2 * SECONDS_PER_DAY)
"""What the InfiniteHBD trace's repeat-failure curve gives (400 servers, 349 days, 582 repairs):
:func:`foreshock.models.fleet.burnin.derive_burn_in` splits the repairs by the failures in the
days before them and keeps the split whose refault curves differ most (a second failure within
30 days: 242 repairs, log-rank statistic 13.7 against the first failures), then holds those nodes
out until their refault hazard stays below ten times the fleet's failure rate: 700 times it in
the first hour, 12 times it on the second day, 5.7 times it on the third.
``tests/unit/test_fleet_burnin.py`` checks the derivation."""
