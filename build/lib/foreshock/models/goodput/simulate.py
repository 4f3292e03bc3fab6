"""Event-driven goodput simulator: replays a failure trace against one checkpointed training job.

The job model is the one the closed forms in ``foreshock.models.reliability`` assume, so that a long
exponential trace reproduces ``ettr_periodic`` (the test suite checks it within 1 %):

* A *run* starts when training (re)starts: compute ``interval_s``, blocking checkpoint write
  ``checkpoint_s``, compute, checkpoint, ... A checkpoint counts once its write finishes.
* A failure that hits the job (running, checkpointing, restarting or migrating) is a *crash*:
  work since the last committed checkpoint is lost and the job restarts in ``restart_s`` from
  the general node pool (a failure during a restart starts it over).
* A warning (a failure predicted ``lead`` seconds ahead, or a false alarm) while the job runs
  triggers a proactive checkpoint (``checkpoint_s``), then a migration of the flagged node's
  ranks onto a hot spare (``migration_s``); the flagged node then leaves the job, and its
  failure, if it comes later, no longer interrupts anything. Without a free spare the job does
  a *planned restart* instead: checkpoint, then restart without the node
  (``checkpoint_s + restart_s``, no work lost). A warning that arrives while the job is down
  (restarting or migrating) is folded into that recovery: the node is left out when the job
  resumes, at no extra cost.
* Hot spares: ``spares`` warm nodes. A used spare is replaced by a fresh node from the cluster
  pool ``spare_refill_s`` after the migration, or sooner when the drained node comes back from
  repair (failure time + repair time from the trace). ``spare_refill_s = inf`` models a
  cluster without a free pool: spares come back only from repair.
* The general pool that crash restarts draw on is assumed never empty.

With ``JobParams.tiers`` set, the job keeps tiered in-memory checkpoints instead
(``foreshock.models.goodput.tiers`` describes the model): ``interval_s`` is the memory-snapshot interval,
``durable_every`` says which snapshots also go to storage, a crash rolls back to the last
replicated snapshot (or, for a failure that takes both copies, to the last durable one) and costs
the peer (or durable) recovery time, and a warning's proactive save is a memory snapshot
(``snapshot_s``) rather than a blocking checkpoint. Without tiers nothing above changes.

The loop is one Python step per event (failures, warnings, false alarms), so a year of a
16,384-GPU job (a few thousand events) replays in well under a second.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from foreshock.models.goodput.tiers import TierParams, draw_pair_losses
from foreshock.models.goodput.traces import FailureTrace
from foreshock.models.reliability import SECONDS_PER_DAY

__all__ = ["JobParams", "SimResult", "simulate", "reference_periodic_ettr"]

_FAIL, _WARN = 0, 1  # failures sort before warnings at equal times


@dataclass(frozen=True)
class JobParams:
    """What a failure or a mitigation costs the job (seconds) and how many hot spares exist.

    Defaults: 30 s blocking checkpoint write (the stall of an async
    ``torch.distributed.checkpoint`` save of a large model), 10 min restart after a crash
    (reschedule, process start, checkpoint load), 60 s migration onto a warm spare (torchrun
    elastic re-rendezvous), 2 hot spares, each replaced within 1 h of its use (provisioning a
    new warm standby from the cluster's free nodes).

    ``tiers`` switches the job to tiered in-memory checkpoints; ``checkpoint_s`` and
    ``restart_s`` then play no part (the tiers' stalls and recovery times replace them).
    """

    checkpoint_s: float = 30.0
    restart_s: float = 600.0
    migration_s: float = 60.0
    spares: int = 2
    spare_refill_s: float = 3600.0
    tiers: TierParams | None = None

    def __post_init__(self) -> None:
        times = (self.checkpoint_s, self.restart_s, self.migration_s, self.spare_refill_s)
        if min(times) < 0 or self.spares < 0:
            raise ValueError("job parameters must be non-negative")

    @property
    def save_s(self) -> float:
        """Stall of the save a warning triggers: a blocking checkpoint, or a memory snapshot with tiers."""
        return self.checkpoint_s if self.tiers is None else self.tiers.snapshot_s

    @property
    def rejoin_s(self) -> float:
        """Restart without a flagged node whose state is saved (no free spare): the crash restart,
        or with tiers the peer recovery (the saved snapshot is in memory and on the buddy)."""
        return self.restart_s if self.tiers is None else self.tiers.peer_recovery_s


@dataclass(frozen=True)
class SimResult:
    """Counts and productive time of one replay."""

    gpus: int
    duration_s: float
    interval_s: float
    productive_s: float
    crashes: int
    avoided: int
    migrations: int
    planned_restarts: int
    folded_warnings: int
    false_alarms: int
    durable_every: int = 0  # tiered jobs: every K-th memory snapshot goes to storage (0: one tier)
    pair_losses: int = 0  # tiered jobs: crashes that took both copies (restored from storage)
    pair_loss_probability: float = 0.0  # tiered jobs: the chance per failure the replay assumed

    @property
    def ettr(self) -> float:
        """Productive compute time / wall time."""
        return self.productive_s / self.duration_s

    @property
    def lost_gpu_hours_per_day(self) -> float:
        return (1.0 - self.ettr) * self.gpus * 24.0

    @property
    def interruptions_per_day(self) -> float:
        """Unplanned interruptions (crashes) per day; migrations and planned restarts excluded."""
        return self.crashes / (self.duration_s / SECONDS_PER_DAY)


class _Job:
    """Mutable state of the replay; one instance per :func:`simulate` call."""

    def __init__(self, interval_s: float, params: JobParams) -> None:
        self.interval, self.p = interval_s, params
        self.running, self.run_start, self.down_until = True, 0.0, 0.0
        self.productive = 0.0
        self.pending, self.pending_at = 0.0, math.inf  # work committed when a proactive checkpoint ends

    def split(self, t: float) -> tuple[float, float]:
        """(committed, uncommitted) compute of the current run at time ``t``."""
        u = t - self.run_start
        if math.isinf(self.interval):
            return 0.0, u
        cycle = self.interval + self.p.checkpoint_s
        k = math.floor(u / cycle)
        return k * self.interval, min(u - k * cycle, self.interval)

    def advance(self, t: float) -> None:
        """Apply what finished by ``t``: a proactive checkpoint's commit, the end of a down period."""
        if self.running:
            return
        if t >= self.pending_at:
            self.productive += self.pending
            self.pending, self.pending_at = 0.0, math.inf
        if t >= self.down_until:
            self.running, self.run_start = True, self.down_until

    def stop(self, t: float) -> float:
        """Stop the run at ``t``; commit its periodic checkpoints; return its uncommitted work."""
        committed, open_work = self.split(t)
        self.productive += committed
        self.running = False
        return open_work

    def crash(self, t: float, pair_lost: bool = False) -> None:
        """A failure hits the job at ``t`` (``pair_lost`` only matters to a tiered job)."""
        if self.running:
            self.stop(t)
        self.pending, self.pending_at = 0.0, math.inf  # a checkpoint still being written is lost
        self.down_until = t + self.p.restart_s

    def save(self, t: float) -> None:
        """Stop at a warning; the work so far is committed once the proactive save ends."""
        self.pending, self.pending_at = self.stop(t), t + self.p.save_s


class _TieredJob(_Job):
    """A job with memory, peer and durable tiers (see ``foreshock.models.goodput.tiers``).

    ``productive`` is the compute held by the point the job would restore to now; ``durable`` the
    compute held by the last durable snapshot, where a pair loss sends it back. Snapshots are
    counted on one grid across restarts: a run starts ``since`` snapshots after the last durable
    one, so its timeline is the periodic cycle of ``durable_every`` snapshots shifted by
    ``since`` snapshots (``_virtual``), and every question about it is a little arithmetic.
    """

    def __init__(self, interval_s: float, params: JobParams, durable_every: int) -> None:
        super().__init__(interval_s, params)
        assert params.tiers is not None
        self.t = params.tiers
        self.k = durable_every
        self.durable = 0.0
        self.since = self.pending_since = 0
        self.from_durable = False  # the recovery under way restores from storage

    def _virtual(self, t: float) -> float:
        return t - self.run_start + self.since * (self.interval + self.t.snapshot_s)

    def _snapshots(self, v: float) -> int:
        """Snapshots finished by virtual time ``v`` (counted from the last durable one before the run)."""
        if v < 0:
            return 0
        a = self.interval + self.t.snapshot_s
        cycle = self.k * a + self.t.durable_s
        c = math.floor(v / cycle)
        return c * self.k + min(math.floor((v - c * cycle) / a), self.k - 1)

    def _compute(self, v: float) -> float:
        a = self.interval + self.t.snapshot_s
        cycle = self.k * a + self.t.durable_s
        c = math.floor(v / cycle)
        r = v - c * cycle
        i = math.floor(r / a)
        inside = self.k * self.interval if i >= self.k else i * self.interval + min(r - i * a, self.interval)
        return c * self.k * self.interval + inside

    def _state(self, t: float) -> tuple[float, float, int, int]:
        """(compute of this run, compute at its restorable snapshot, that snapshot's count, durable count)."""
        v = self._virtual(t)
        done = self._snapshots(v)
        durable = done // self.k * self.k
        restorable = max(self._snapshots(v - self.t.replicate_s), durable, self.since)
        work = self._compute(v) - self.since * self.interval
        return work, (restorable - self.since) * self.interval, restorable, durable

    def split(self, t: float) -> tuple[float, float]:
        work, committed, _, _ = self._state(t)
        return committed, work - committed

    def stop(self, t: float) -> float:
        work, committed, restorable, durable = self._state(t)
        if durable > self.since:
            self.durable = self.productive + (durable - self.since) * self.interval
        self.productive += committed
        self.pending_since = self._snapshots(self._virtual(t)) % self.k
        self.since = restorable % self.k
        self.running = False
        return work - committed

    def advance(self, t: float) -> None:
        if not self.running and t >= self.pending_at:
            self.since = self.pending_since
        if not self.running and t >= self.down_until:
            self.from_durable = False
        super().advance(t)

    def crash(self, t: float, pair_lost: bool = False) -> None:
        if self.running:
            self.stop(t)
        self.pending, self.pending_at = 0.0, math.inf  # a snapshot still being taken or sent is lost
        if pair_lost:
            self.productive, self.since, self.from_durable = self.durable, 0, True
        recovery = self.t.durable_recovery_s if self.from_durable else self.t.peer_recovery_s
        self.down_until = t + recovery


def simulate(trace: FailureTrace, interval_s: float, params: JobParams, *,
             warn_s: np.ndarray | None = None, false_alarm_s: np.ndarray | None = None,
             durable_every: int = 1, pair_lost: np.ndarray | None = None) -> SimResult:
    """Replay ``trace`` against a job checkpointing every ``interval_s`` of compute.

    ``warn_s[i]`` is when failure ``i`` is predicted (NaN: not predicted); ``false_alarm_s`` are
    the times of warnings with no failure behind them. Without either, this is plain periodic
    checkpointing.

    With ``params.tiers``: ``interval_s`` is the memory-snapshot interval, every
    ``durable_every``-th snapshot also goes to storage, and ``pair_lost[i]`` says whether failure
    ``i`` takes both copies (default: drawn with the tiers' probability, :func:`draw_pair_losses`).
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    p, horizon, n = params, trace.duration_s, len(trace)
    if p.tiers is not None:
        if math.isinf(interval_s) or durable_every < 1:
            raise ValueError("a tiered job needs a finite snapshot interval and durable_every >= 1")
        job: _Job = _TieredJob(interval_s, p, durable_every)
        lost_both = draw_pair_losses(trace, p.tiers.q) if pair_lost is None else np.asarray(pair_lost, bool)
    else:
        job, lost_both, durable_every = _Job(interval_s, p), np.zeros(n, bool), 0
    events: list[tuple[float, int, int, int]] = [(float(t), _FAIL, i, i) for i, t in enumerate(trace.fail_s)]
    if warn_s is not None:
        events += [(float(t), _WARN, n + i, i) for i, t in enumerate(warn_s) if not math.isnan(t)]
    if false_alarm_s is not None:
        events += [(float(t), _WARN, 2 * n + j, -1) for j, t in enumerate(np.sort(false_alarm_s))]
    heapq.heapify(events)
    left_at = np.full(n, math.inf)  # when a warned node left the job
    spares_back: list[float] = []  # return times of hot spares in use
    crashes = avoided = migrations = planned = folded = false_alarms = pair_losses = 0
    while events:
        t, kind, _, i = heapq.heappop(events)
        if t >= horizon:
            break
        job.advance(t)
        if kind == _FAIL:
            if left_at[i] <= t:
                avoided += 1
            else:
                crashes += 1
                pair_losses += int(lost_both[i])
                job.crash(t, bool(lost_both[i]))
            continue
        if i >= 0 and trace.fail_s[i] <= t:
            continue  # a warning with no lead: the failure (sorted first) already struck
        if not job.running:
            if i >= 0:
                left_at[i] = job.down_until
                folded += 1
            continue
        job.save(t)
        while spares_back and spares_back[0] <= t:
            heapq.heappop(spares_back)
        if len(spares_back) < p.spares:
            migrations += 1
            job.down_until = leave = t + p.save_s + p.migration_s
            refilled = leave + p.spare_refill_s
            back = min(refilled, max(trace.fail_s[i], leave) + trace.repair_s[i]) if i >= 0 else refilled
            heapq.heappush(spares_back, back)
        else:
            planned += 1
            job.down_until, leave = t + p.save_s + p.rejoin_s, t + p.save_s
        if i >= 0:
            left_at[i] = leave
        else:
            false_alarms += 1
    job.advance(horizon)
    if job.running:
        job.productive += sum(job.split(horizon))
    return SimResult(trace.gpus, horizon, interval_s, job.productive, crashes, avoided, migrations, planned,
                     folded, false_alarms, durable_every, pair_losses,
                     0.0 if p.tiers is None else p.tiers.q)


def reference_periodic_ettr(trace: FailureTrace, interval_s: float, p: JobParams) -> float:
    """ETTR of plain periodic checkpointing by stepping through every checkpoint cycle.

    A slow, obviously-correct reference for :func:`simulate` (tests compare the two on random
    traces; the benchmark times both). Same job model, no warnings.
    """
    t, productive, k, fails = 0.0, 0.0, 0, trace.fail_s
    while t < trace.duration_s:
        nxt = fails[k] if k < len(fails) else math.inf
        cycle_end = t + interval_s + p.checkpoint_s
        if cycle_end <= nxt and cycle_end <= trace.duration_s:
            productive, t = productive + interval_s, cycle_end
            continue
        if nxt >= trace.duration_s:  # the horizon ends inside this cycle
            productive += min(trace.duration_s - t, interval_s)
            break
        t, k = nxt + p.restart_s, k + 1
        while k < len(fails) and fails[k] < t:  # failures during the restart start it over
            t, k = fails[k] + p.restart_s, k + 1
    return productive / trace.duration_s
