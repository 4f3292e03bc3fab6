"""Closed-form reliability maths: MTBF, Young/Daly intervals, ETTR, the mitigation decision."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock.models.reliability import (
    cluster_mtbf_seconds,
    daly_interval_seconds,
    ettr_periodic,
    ettr_with_prediction,
    expected_crash_loss_gpu_seconds,
    mitigation_cost_gpu_seconds,
    mitigation_success_probability,
    should_mitigate,
    young_interval_seconds,
)


def test_cluster_mtbf_reproduces_llama3_published_figure():
    # Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs, "one every ~3.1 h".
    rate = 419 / 54 / 16384
    assert cluster_mtbf_seconds(rate, 16384) / 3600 == pytest.approx(3.1, abs=0.05)
    # Halving the job doubles its MTBF: rates are per GPU and add up.
    assert cluster_mtbf_seconds(rate, 8192) == pytest.approx(2 * cluster_mtbf_seconds(rate, 16384))
    assert math.isinf(cluster_mtbf_seconds(0.0, 1024))
    with pytest.raises(ValueError):
        cluster_mtbf_seconds(rate, 0)


@pytest.mark.parametrize("checkpoint_s, mtbf_s",
                         [(30, 3 * 3600), (120, 3 * 3600), (10, 24 * 3600), (600, 3600)])
def test_daly_interval_is_close_to_the_exact_optimum(checkpoint_s, mtbf_s):
    grid = np.geomspace(checkpoint_s / 10, mtbf_s * 3, 4000)
    best = grid[np.argmax([ettr_periodic(t, checkpoint_s, 600, mtbf_s) for t in grid])]
    daly, young = daly_interval_seconds(checkpoint_s, mtbf_s), young_interval_seconds(checkpoint_s, mtbf_s)
    assert daly == pytest.approx(best, rel=0.03)
    # Daly's is never worse than Young's first-order interval on the exact model.
    assert (ettr_periodic(daly, checkpoint_s, 600, mtbf_s)
            >= ettr_periodic(young, checkpoint_s, 600, mtbf_s) - 1e-12)


def test_daly_degenerates_to_mtbf_when_checkpoints_are_long_and_young_formula():
    assert daly_interval_seconds(3 * 3600, 3600) == 3600
    assert young_interval_seconds(30, 3 * 3600) == pytest.approx(math.sqrt(2 * 30 * 3 * 3600))
    assert math.isinf(daly_interval_seconds(30, math.inf))


def test_ettr_periodic_limits_and_monotonicity():
    assert ettr_periodic(1800, 30, 600, math.inf) == pytest.approx(1800 / 1830)
    assert ettr_periodic(1800, 0, 0, 1e15) == pytest.approx(1.0, abs=1e-9)
    slower_restart = ettr_periodic(1800, 30, 1200, 3 * 3600)
    assert slower_restart < ettr_periodic(1800, 30, 600, 3 * 3600) < ettr_periodic(1800, 30, 600, 6 * 3600)
    assert ettr_periodic(math.inf, 30, 600, 3600) == 0.0
    with pytest.raises(ValueError):
        ettr_periodic(0, 30, 600, 3600)


def test_lead_time_success_probability_median_and_sample():
    assert mitigation_success_probability(1800.0, 1800.0) == pytest.approx(0.5)
    assert mitigation_success_probability(1800.0, 0.0) == 1.0
    assert mitigation_success_probability(np.array([10.0, 100.0, 1000.0, 5000.0]), 90.0) == 0.75
    assert mitigation_success_probability(0.0, 90.0) == 0.0


def test_ettr_with_prediction_reduces_to_periodic_and_improves_with_recall():
    args = (1200.0, 30.0, 600.0, 3 * 3600.0)
    kw = dict(lead_time_s=1800.0, false_alarms_per_day=0.0, migration_s=60.0)
    assert ettr_with_prediction(*args, recall=0.0, **kw) == pytest.approx(ettr_periodic(*args))
    values = [ettr_with_prediction(*args, recall=r, **kw) for r in (0.0, 0.3, 0.6, 0.9)]
    assert values == sorted(values) and values[-1] > values[0]
    # False alarms cost checkpoint + migration each.
    noisy = ettr_with_prediction(*args, recall=0.6, **dict(kw, false_alarms_per_day=50.0))
    assert noisy < values[2]
    # Perfect, free prediction with no periodic checkpoints loses nothing.
    assert ettr_with_prediction(math.inf, 0.0, 600.0, 3600.0, recall=1.0, lead_time_s=np.array([600.0]),
                                false_alarms_per_day=0.0, migration_s=0.0) == 1.0


def test_should_mitigate_compares_expected_crash_loss_with_action_cost():
    for p_fail in np.linspace(0.0, 1.0, 21):
        for since in (0.0, 300.0, 1800.0):
            loss = expected_crash_loss_gpu_seconds(p_fail, since, 600.0, 2048)
            cost = mitigation_cost_gpu_seconds(30.0, 60.0, 2048)
            assert loss == pytest.approx(p_fail * (since + 600.0) * 2048)
            assert cost == 90.0 * 2048
            assert should_mitigate(p_fail, since, 600.0, 30.0, 60.0, 2048) == (loss > cost)
    # The threshold probability is (checkpoint + migration) / (since + restart).
    assert not should_mitigate(0.09, 300.0, 600.0, 30.0, 60.0, 8)
    assert should_mitigate(0.11, 300.0, 600.0, 30.0, 60.0, 8)


def test_docstring_examples_hold():
    import doctest

    import foreshock.models.reliability

    assert doctest.testmod(foreshock.models.reliability).failed == 0
