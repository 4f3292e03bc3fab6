"""The injected failures follow the profile: mix, rate, repairs, detectability, foreshock windows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from foreshock.commands.simulate import profile_path
from foreshock.ingest.simulator import load_profile
from foreshock.ingest.simulator.schedule import MS_PER_DAY, draw_schedule

START = 1_735_689_600_000


@pytest.fixture(scope="module", params=["llama3", "infinitehbd"])
def long_run(request):
    """A long run: 512 nodes x 1 year at 10x the rate (about 7,000 failures)."""
    profile = load_profile(profile_path(request.param))
    days = 365
    schedule = draw_schedule(profile, 512, START, START + days * MS_PER_DAY, seed=11, rate_multiplier=10.0)
    return profile, schedule, 512, days


def test_counts_per_cause_match_the_profile_mix(long_run):
    profile, schedule, _, _ = long_run
    counts = Counter(f.cause for f in schedule.failures)
    n = len(schedule.failures)
    assert n > 5_000
    observed = np.array([counts.get(f.cause, 0) for f in profile.failures])
    shares = np.array([f.share for f in profile.failures])
    expected = shares / shares.sum() * n
    chi2, p = stats.chisquare(observed, expected)
    assert p > 0.001, f"mix differs from the profile (chi2={chi2:.1f}, p={p:.2g})"


def test_failure_rate_per_gpu_day_of_up_time_matches(long_run):
    profile, schedule, nodes, days = long_run
    end = START + days * MS_PER_DAY
    down_ms = sum(min(f.repair_ts, end) - f.ts for f in schedule.failures)
    up_gpu_days = (nodes * days * MS_PER_DAY - down_ms) / MS_PER_DAY * profile.cluster.gpus_per_node
    n = len(schedule.failures)
    expected_rate = profile.cluster.interruptions_per_gpu_day * 10.0
    # Poisson: the count's standard error is sqrt(n); allow 4 of them
    assert abs(n / up_gpu_days - expected_rate) < 4 * np.sqrt(n) / up_gpu_days


def test_detectable_fraction_and_lead_times_follow_each_class(long_run):
    profile, schedule, _, _ = long_run
    by_cause = {f.cause: f for f in profile.failures}
    for cause, cls in by_cause.items():
        fs = [f for f in schedule.failures if f.cause == cause]
        if len(fs) < 200:
            continue
        det = np.mean([f.detectable for f in fs])
        assert abs(det - cls.detectable) < 4 * np.sqrt(cls.detectable * (1 - cls.detectable) / len(fs)) + 1e-9
        for f in fs:
            assert (f.precursor_start_ms is not None) == f.detectable
            if f.detectable:
                lead_min = (f.ts - f.precursor_start_ms) / 60_000
                assert lead_min <= cls.lead_minutes[1] + 1e-6


def test_repair_times_follow_the_lognormal_of_each_class(long_run):
    profile, schedule, _, _ = long_run
    for cls in profile.failures:
        hours = np.array([(f.repair_ts - f.ts) / 3.6e6 for f in schedule.failures if f.cause == cls.cause])
        if hours.size < 500:
            continue
        # the sample median of log-hours has standard error ~1.25 sigma / sqrt(n)
        tolerance = 5 * 1.25 * cls.repair_sigma / np.sqrt(hours.size)
        assert abs(np.median(np.log(hours)) - np.log(cls.repair_median_hours)) < tolerance


def test_a_node_never_fails_while_it_is_down(long_run):
    _, schedule, _, _ = long_run
    last_repair: dict[int, int] = {}
    for f in schedule.failures:
        assert f.ts >= last_repair.get(f.node, 0)
        last_repair[f.node] = f.repair_ts


def test_same_seed_same_schedule_other_seed_other_schedule():
    profile = load_profile(profile_path("llama3"))
    end = START + 30 * MS_PER_DAY
    a = draw_schedule(profile, 64, START, end, seed=3, rate_multiplier=20)
    b = draw_schedule(profile, 64, START, end, seed=3, rate_multiplier=20)
    c = draw_schedule(profile, 64, START, end, seed=4, rate_multiplier=20)
    assert a == b
    assert a.failures != c.failures


def test_false_alarms_are_weaker_than_failures_and_end_without_failure():
    profile = load_profile(profile_path("llama3"))
    end = START + 60 * MS_PER_DAY
    schedule = draw_schedule(profile, 128, START, end, seed=5, rate_multiplier=20)
    alarms = [e for e in schedule.episodes if not e.failure]
    real = [e for e in schedule.episodes if e.failure]
    assert len(alarms) > 50 and len(real) > 50
    lo, hi = profile.noise.false_alarm_strength
    assert all(lo <= e.strength <= hi and e.peak_ms < e.end_ms for e in alarms)
    assert np.median([e.strength for e in alarms]) < np.median([e.strength for e in real])
    for a in alarms[:20]:  # rises from nothing, peaks near its strength, fades back to nothing
        x = a.intensity(np.array([a.start_ms - 1, a.peak_ms - 1, a.end_ms]))
        assert x[0] == 0 and x[2] == 0 and x[1] == pytest.approx(a.strength, rel=0.01)
