"""The burn-in thresholds read from repeat-failure curves: the real trace's, and fleets drawn with
and without repeat failures."""

from __future__ import annotations

import pandas as pd
import pytest

from foreshock.models.fleet.burnin import LIFT, MIN_EVENTS, derive_burn_in
from foreshock.models.fleet.sources import load_infinitehbd
from foreshock.models.reliability import DEFAULT_BURN_IN, SECONDS_PER_DAY, BurnIn
from foreshock.shipped import trace
from tests.unit.test_simulator_refault import simulated


@pytest.fixture(scope="module")
def real():
    return derive_burn_in(load_infinitehbd(trace("infinitehbd")))


def test_the_real_trace_gives_the_mitigators_default_burn_in(real) -> None:
    assert real.burn_in == DEFAULT_BURN_IN
    [chosen] = real.splits[real.splits["chosen"]].to_dict("records")
    assert (chosen["history_days"], chosen["failures"], chosen["flagged"]) == (30, 2, 242)
    assert chosen["statistic"] == pytest.approx(13.65, abs=0.01) and chosen["p_value"] < 0.001
    assert chosen["statistic"] == real.splits["statistic"].max()
    # the burn-in ends where the flagged repairs' hazard falls below LIFT x the fleet's for good
    h = real.hazard.set_index("to_hours")
    length_h = DEFAULT_BURN_IN.length_s / 3600
    assert h.at[length_h, "ratio"] >= LIFT and h.at[length_h, "refaults"] >= MIN_EVENTS
    assert (h.loc[h.index > length_h, "ratio"] < LIFT).all()
    assert real.figure.axes[0].get_ylabel().startswith("refault hazard")


def test_a_fleet_without_repeat_failures_needs_no_burn_in() -> None:
    derivation = derive_burn_in(simulated("infinitehbd", seed=2, nodes=1000))
    assert derivation.burn_in is None
    assert not derivation.splits["chosen"].any()  # no history tells its returns apart
    assert (derivation.hazard["ratio"] < LIFT).all()


def test_lemons_and_failed_repairs_call_for_a_burn_in_after_repeat_failures() -> None:
    derivation = derive_burn_in(simulated("infinitehbd-refault", seed=2, nodes=1000))
    burn_in = derivation.burn_in
    assert burn_in is not None and burn_in.failures >= 2
    # the simulated lemons fail 33 times as often as the rest: they hold the burn-in open for days
    assert burn_in.length_s >= 2 * SECONDS_PER_DAY


def test_too_few_repairs_is_a_clear_error() -> None:
    records = load_infinitehbd(trace("infinitehbd"))
    few = records[records["unit"].isin(records["unit"].drop_duplicates().iloc[:5])]
    with pytest.raises(ValueError, match="repairs in the records: at least 30"):
        derive_burn_in(few)


def test_a_burn_in_counts_the_failures_within_its_window_up_to_the_latest() -> None:
    rule = BurnIn(failures=3, window_s=7 * SECONDS_PER_DAY, length_s=3600)
    day = SECONDS_PER_DAY
    assert rule.due([0.0, 2 * day, 6.5 * day])
    assert not rule.due([0.0, 2 * day, 7.5 * day])  # the first fell out of the window
    assert not rule.due([2 * day, 7.5 * day]) and not rule.due([])
    assert rule.due([6.5 * day, 0.0, 2 * day])  # order does not matter
    for bad in ({"failures": 0}, {"window_s": 0}, {"length_s": -1}):
        with pytest.raises(ValueError, match="burn-in needs"):
            BurnIn(**{"failures": 2, "window_s": day, "length_s": 3600, **bad})
    assert pd.Timedelta(seconds=DEFAULT_BURN_IN.window_s) == pd.Timedelta("30D")
