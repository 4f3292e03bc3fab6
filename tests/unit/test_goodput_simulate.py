"""The goodput simulator against the closed forms, hand-computed timelines and the strategy contracts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock.models.goodput import FailureTrace, JobParams, OperatingPoint, run_strategies, simulate
from foreshock.models.goodput.simulate import reference_periodic_ettr
from foreshock.models.reliability import (
    daly_interval_seconds,
    ettr_periodic,
    ettr_with_prediction,
    mitigation_success_probability,
)


def exponential_trace(mtbf_s: float, failures: int, seed: int = 0, repair_s: float = 86400.0) -> FailureTrace:
    """A job hit by Poisson failures: ``failures`` expected over the trace."""
    rng = np.random.default_rng(seed)
    duration = mtbf_s * failures
    times = np.cumsum(rng.exponential(mtbf_s, int(failures * 1.3) + 50))
    times = times[times < duration]
    n = len(times)
    return FailureTrace("exp", 2048, 8, duration, times, np.full(n, repair_s),
                        np.array(["gpu"] * n, dtype=object), rng.integers(0, 2048, n))


def hand_trace(fail_s: list[float], duration: float = 10_000.0) -> FailureTrace:
    n = len(fail_s)
    return FailureTrace("hand", 4, 8, duration, np.array(fail_s, dtype=float), np.full(n, 3600.0),
                        np.array(["gpu"] * n, dtype=object), np.arange(n))


@pytest.mark.parametrize("interval_s, checkpoint_s, restart_s, mtbf_h", [
    (None, 30.0, 600.0, 3.0),      # Daly-optimal, Llama-3-like MTBF
    (1800.0, 30.0, 600.0, 3.0),    # the fixed 30-minute baseline
    (600.0, 120.0, 300.0, 1.0),    # long checkpoints, frequent failures
    (3600.0, 10.0, 900.0, 14.4),   # InfiniteHBD-like MTBF
])
def test_simulator_agrees_with_closed_form_ettr_within_one_percent(interval_s, checkpoint_s, restart_s,
                                                                   mtbf_h):
    mtbf = mtbf_h * 3600
    interval = interval_s or daly_interval_seconds(checkpoint_s, mtbf)
    params = JobParams(checkpoint_s=checkpoint_s, restart_s=restart_s)
    result = simulate(exponential_trace(mtbf, 20_000, seed=int(mtbf_h * 10)), interval, params)
    expected = ettr_periodic(interval, checkpoint_s, restart_s, mtbf)
    assert result.ettr == pytest.approx(expected, rel=0.01)
    # Closer still on the lost fraction than 1 % of ETTR would demand.
    assert 1 - result.ettr == pytest.approx(1 - expected, rel=0.05)


@pytest.mark.parametrize("mtbf_h, recall, lead_s, false_alarms", [
    (3.0, 0.6, 1800.0, 1.0), (1.0, 0.3, 120.0, 0.0), (12.0, 0.6, 1800.0, 2.0),
])
def test_simulator_with_prediction_agrees_with_closed_form_within_one_percent(mtbf_h, recall, lead_s,
                                                                               false_alarms):
    trace = exponential_trace(mtbf_h * 3600, 20_000, seed=1)
    params = JobParams(spares=10**6)  # the closed form assumes a spare is always there
    op = OperatingPoint(recall=recall, lead_time_s=lead_s, false_alarms_per_1000_node_days=false_alarms)
    result = run_strategies(trace, params, op, strategies=("foreshock",))["foreshock"]
    expected = ettr_with_prediction(result.interval_s, params.checkpoint_s, params.restart_s, trace.mtbf_s,
                                    recall=recall, lead_time_s=lead_s, migration_s=params.migration_s,
                                    false_alarms_per_day=false_alarms * trace.nodes / 1000)
    assert result.ettr == pytest.approx(expected, rel=0.01)
    caught = recall * mitigation_success_probability(lead_s, params.checkpoint_s + params.migration_s)
    assert result.crashes == pytest.approx(len(trace) * (1 - caught), rel=0.03)


@pytest.mark.parametrize("seed", range(12))
def test_event_replay_matches_the_naive_per_checkpoint_reference(seed):
    # Random parameters and bursty failures (restarts interrupted by further failures) included.
    rng = np.random.default_rng(seed)
    params = JobParams(checkpoint_s=float(rng.uniform(0, 300)), restart_s=float(rng.uniform(0, 3600)))
    mtbf = float(rng.uniform(600, 6 * 3600))
    trace = exponential_trace(mtbf, int(rng.integers(0, 400)), seed=seed)
    burst = np.sort(np.concatenate([trace.fail_s, trace.fail_s[::3] + rng.uniform(0, params.restart_s + 1)]))
    burst = burst[burst < trace.duration_s]
    trace = FailureTrace("burst", 8, 8, trace.duration_s, burst, np.ones(len(burst)),
                         np.array(["x"] * len(burst), dtype=object), np.zeros(len(burst), dtype=int))
    interval = float(rng.uniform(60, 7200))
    expected = reference_periodic_ettr(trace, interval, params)
    assert simulate(trace, interval, params).ettr == pytest.approx(expected, abs=1e-9)


def test_young_daly_interval_minimises_simulated_loss():
    mtbf, params = 3 * 3600.0, JobParams(checkpoint_s=60.0, restart_s=600.0)
    trace = exponential_trace(mtbf, 20_000, seed=7)
    daly = daly_interval_seconds(params.checkpoint_s, mtbf)
    factors = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0)
    lost = {f: 1 - simulate(trace, daly * f, params).ettr for f in factors}
    assert lost[1.0] <= min(lost.values()) * 1.005
    assert lost[1.0] < lost[0.5] and lost[1.0] < lost[2.0]
    assert lost[0.25] > lost[0.5] and lost[4.0] > lost[2.0]


def test_oracle_with_zero_migration_loses_only_its_proactive_checkpoints():
    trace = exponential_trace(3 * 3600.0, 2_000, seed=3)
    for migration_s in (0.0, 45.0):
        params = JobParams(checkpoint_s=30.0, restart_s=600.0, migration_s=migration_s, spares=10**6)
        oracle = run_strategies(trace, params, OperatingPoint(), strategies=("oracle",))["oracle"]
        assert oracle.crashes == 0 and oracle.planned_restarts == 0
        assert oracle.migrations + oracle.folded_warnings == len(trace)
        lost_s = trace.duration_s - oracle.productive_s
        assert lost_s == pytest.approx(oracle.migrations * (params.checkpoint_s + migration_s), rel=1e-9)


def test_foreshock_with_recall_zero_equals_its_young_daly_baseline():
    trace = exponential_trace(2 * 3600.0, 3_000, seed=5)
    op = OperatingPoint(recall=0.0, lead_time_s=1800.0, false_alarms_per_1000_node_days=0.0)
    results = run_strategies(trace, JobParams(), op)
    assert results["foreshock"] == results["young_daly"]
    # With recall it pays: fewer crashes, less time lost.
    better = run_strategies(trace, JobParams(), OperatingPoint(recall=0.6), strategies=("foreshock",))
    assert better["foreshock"].crashes < 0.5 * results["young_daly"].crashes
    assert better["foreshock"].ettr > results["young_daly"].ettr
    assert results["fixed"].interval_s == 1800.0


def test_hand_computed_crash_timeline():
    # T=1000 compute, C=10 checkpoint, R=100 restart; a crash at 2525 after two committed checkpoints
    # loses the 505 s computed since, then 7,375 s of run: 7 checkpoints + 305 s at the end.
    params = JobParams(checkpoint_s=10.0, restart_s=100.0, migration_s=5.0)
    result = simulate(hand_trace([2525.0]), 1000.0, params)
    assert result.productive_s == pytest.approx(2000 + 7000 + 305)
    assert result.crashes == 1


def test_hand_computed_warning_timelines():
    params = JobParams(checkpoint_s=10.0, restart_s=100.0, migration_s=5.0)
    trace = hand_trace([2525.0])
    # Warned 25 s ahead: checkpoint at 2500 keeps its 480 s, migration ends at 2515, failure avoided.
    saved = simulate(trace, 1000.0, params, warn_s=np.array([2500.0]))
    assert (saved.crashes, saved.avoided, saved.migrations) == (0, 1, 1)
    assert saved.productive_s == pytest.approx(2000 + 480 + 7000 + 415)
    # Warned 5 s ahead: the failure lands during the proactive checkpoint, which is lost.
    late = simulate(trace, 1000.0, params, warn_s=np.array([2520.0]))
    assert late.crashes == 1 and late.productive_s == pytest.approx(2000 + 7000 + 305)
    # No spare: a planned restart (checkpoint + restart) instead of a migration, no work lost.
    planned = simulate(trace, 1000.0, JobParams(checkpoint_s=10.0, restart_s=100.0, spares=0),
                       warn_s=np.array([2500.0]))
    assert (planned.crashes, planned.planned_restarts, planned.migrations) == (0, 1, 0)
    assert planned.productive_s == pytest.approx(2000 + 480 + 7000 + 320)  # resumes at 2610
    # A false alarm costs a checkpoint and a migration.
    alarm = simulate(hand_trace([]), 1000.0, params, false_alarm_s=np.array([2500.0]))
    assert alarm.false_alarms == 1 and alarm.productive_s == pytest.approx(10_000 - 2 * 10 - 15 - 7 * 10)


def test_spares_are_held_until_refill_or_repair():
    # Three warned failures one minute apart; one spare refilled after an hour: one migration, then
    # planned restarts. With an instant refill every warning gets a spare.
    trace = hand_trace([5000.0, 5800.0, 6600.0], duration=20_000.0)
    warn = trace.fail_s - 120.0
    scarce = simulate(trace, 1000.0, JobParams(spares=1, spare_refill_s=3600.0), warn_s=warn)
    assert (scarce.migrations, scarce.planned_restarts, scarce.crashes) == (1, 2, 0)
    ample = simulate(trace, 1000.0, JobParams(spares=1, spare_refill_s=0.0), warn_s=warn)
    assert (ample.migrations, ample.planned_restarts) == (3, 0)
    assert ample.ettr > scarce.ettr


def test_infinite_interval_without_failures_is_all_productive():
    assert simulate(hand_trace([]), math.inf, JobParams()).ettr == 1.0
