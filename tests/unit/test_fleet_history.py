"""The history-only ranking: features from the past only, labels from the horizon after, a
time-ordered split, and lift with ties handled in expectation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.models.fleet.history import history_ranking, history_samples, lift_at
from foreshock.models.fleet.records import validate
from foreshock.models.fleet.sources import load_infinitehbd
from foreshock.shipped import trace

T0 = pd.Timestamp("2025-01-01", tz="UTC")


def fleet(days: int = 120, lemons: int = 5, healthy: int = 45, every: float = 6.0) -> pd.DataFrame:
    """Lemons fail every ``every`` days (back 6 h later); healthy units never fail."""
    rows = []
    for i in range(lemons):
        up = T0
        t = T0 + pd.Timedelta(days=every * (i + 1) / lemons)
        while t + pd.Timedelta(hours=6) < T0 + pd.Timedelta(days=days):
            rows.append((f"lemon{i}", up, t, "Unknown Error", False, t + pd.Timedelta(hours=6)))
            up = t + pd.Timedelta(hours=6)
            t = up + pd.Timedelta(days=every)
        rows.append((f"lemon{i}", up, T0 + pd.Timedelta(days=days), None, True, pd.NaT))
    rows += [(f"ok{i}", T0, T0 + pd.Timedelta(days=days), None, True, pd.NaT) for i in range(healthy)]
    return validate(pd.DataFrame(rows, columns=["unit", "install_time", "end_time", "kind", "censored",
                                                "repaired_time"]))


def test_samples_see_only_the_past_and_label_the_horizon_after() -> None:
    records = fleet()
    samples = history_samples(records, horizons=(1, 7))
    lemon = samples[samples["unit"] == "lemon0"].set_index("cutoff")
    first_failure = records[(records["unit"] == "lemon0") & ~records["censored"]]["end_time"].iloc[0]
    day_before = first_failure.floor("D")
    assert lemon.at[day_before, "failures_ever"] == 0 and lemon.at[day_before, "fails_within_1d"]
    day_after = day_before + pd.Timedelta(days=1)
    assert lemon.at[day_after, "failures_ever"] == 1 and lemon.at[day_after, "failures_7d"] == 1
    assert lemon.at[day_after, "days_since_return"] == pytest.approx(
        (day_after - first_failure - pd.Timedelta(hours=6)) / pd.Timedelta(days=1))
    healthy = samples[samples["unit"] == "ok0"]
    assert (healthy["failures_ever"] == 0).all() and not healthy["fails_within_7d"].any()
    assert samples["cutoff"].max() <= records["end_time"].max() - pd.Timedelta(days=7)
    # a unit down for repair at a cutoff is not a sample then
    down = records[~records["censored"]]
    for r in down.itertuples():
        inside = samples[(samples["unit"] == r.unit) & (samples["cutoff"] >= r.end_time)
                         & (samples["cutoff"] < r.repaired_time)]
        assert inside.empty


def test_history_ranks_lemons_first_on_a_later_period() -> None:
    table = history_ranking(fleet(), horizons=(7,), top=0.1).frame.set_index("scorer")
    assert set(table.index) == {"failures, last 30 days", "days since return", "logistic regression"}
    assert table.at["failures, last 30 days", "auc"] > 0.95
    assert table.at["logistic regression", "auc"] > 0.95
    base = table["base_rate"].iloc[0]
    assert table.at["failures, last 30 days", "lift_top"] == pytest.approx(1 / base, rel=0.05)
    assert (table["train_samples"] > 0).all() and (table["test_samples"] > 0).all()


def test_a_history_that_says_nothing_ranks_like_chance() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(200):  # every unit fails at random times: the past says nothing of the future
        up = T0
        for day in np.sort(rng.uniform(0, 200, rng.poisson(3))):
            t = T0 + pd.Timedelta(days=float(day))
            if t < up:
                continue
            rows.append((f"n{i}", up, t, "x", False, t + pd.Timedelta(hours=1)))
            up = t + pd.Timedelta(hours=1)
        rows.append((f"n{i}", up, T0 + pd.Timedelta(days=200), None, True, pd.NaT))
    records = validate(pd.DataFrame(rows, columns=["unit", "install_time", "end_time", "kind", "censored",
                                                   "repaired_time"]))
    table = history_ranking(records, horizons=(7,)).frame
    assert table["auc"].between(0.42, 0.58).all()


def test_lift_counts_the_tied_group_at_the_cut_by_its_share() -> None:
    scores = np.array([3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    labels = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 1], dtype=bool)
    precision, lift = lift_at(scores, labels, 0.3)  # top 3: the 3, and 2 of the four 2s
    assert precision == pytest.approx((1 + 2 * 0.25) / 3)
    assert lift == pytest.approx(precision / 0.3)


def test_the_real_trace_gives_the_figures_of_docs_results() -> None:
    """docs/results.md, "History-only ranking on the real trace"."""
    table = history_ranking(load_infinitehbd(trace("infinitehbd"))).frame
    got = {(r.horizon_days, r.scorer): (round(r.auc, 3), round(r.lift_top, 1)) for r in table.itertuples()}
    assert got == {
        (1, "failures, last 30 days"): (0.626, 4.6), (1, "days since return"): (0.686, 5.1),
        (1, "logistic regression"): (0.611, 4.9), (7, "failures, last 30 days"): (0.612, 4.1),
        (7, "days since return"): (0.663, 4.3), (7, "logistic regression"): (0.604, 4.3),
    }
    assert table["positives"].tolist() == [196] * 3 + [1257] * 3
