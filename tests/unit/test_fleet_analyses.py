"""The fleet analyses recover what was put into data drawn with known parameters."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from foreshock.models.fleet.periods import mtbf_by_period, repair_times
from foreshock.models.fleet.records import spells, validate
from foreshock.models.fleet.repeat import base_rate, repairs, repeat_failure_curve
from foreshock.models.fleet.survival import cox_hazard_ratios, kaplan_meier, weibull_fit

T0 = pd.Timestamp("2025-01-01", tz="UTC")


def lifetimes(n: int, scale: float, shape: float, seed: int, censor_at: float | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = scale * rng.weibull(shape, n)
    failed = np.ones(n, dtype=bool)
    if censor_at is not None:
        failed = t < censor_at
        t = np.minimum(t, censor_at)
    return pd.DataFrame({"duration_days": t, "failed": failed})


def test_kaplan_meier_follows_the_true_survival_inside_its_band() -> None:
    data = pd.concat([lifetimes(3000, 100.0, 1.0, 1, censor_at=150).assign(rack="a"),
                      lifetimes(3000, 50.0, 1.0, 2, censor_at=150).assign(rack="b")])
    km = kaplan_meier(data, "rack")
    assert isinstance(km.figure, Figure) and km.figure.axes[0].get_title().startswith("Survival")
    for rack, scale in (("a", 100.0), ("b", 50.0)):
        curve = km.frame[km.frame["group"] == f"rack={rack}"]
        at = curve[curve["time"] <= 60].iloc[-1]
        assert at["lower"] <= np.exp(-60 / scale) <= at["upper"]
        assert at["upper"] - at["lower"] < 0.06
    for _, curve in km.frame.groupby("group"):
        assert curve["survival"].is_monotonic_decreasing


def test_cox_recovers_a_hazard_ratio_per_location_level_and_flags_non_proportional_hazards() -> None:
    rng = np.random.default_rng(5)
    cage = rng.integers(0, 3, 6000)
    t = rng.exponential(100.0 / np.array([1.0, 1.5, 3.0])[cage])
    data = pd.DataFrame({"duration_days": t, "failed": True, "cage": cage})
    cox = cox_hazard_ratios(data, ["cage"])
    by_level = cox.frame.set_index("level")
    assert list(by_level.index) == ["1", "2"] and (by_level["reference"] == "0").all()
    for level, truth in (("1", 1.5), ("2", 3.0)):
        assert by_level.at[level, "lower"] <= truth <= by_level.at[level, "upper"]
    assert (by_level["ph_p"] > 0.001).all()  # exponential: hazards are proportional
    # cage 1 wears out (Weibull shape 3) while cage 0 does not: the ratio drifts with age
    worn = data.assign(duration_days=np.where(cage == 1, 100.0 * rng.weibull(3.0, cage.size), t))
    drift = cox_hazard_ratios(worn, ["cage"]).frame.set_index("level")
    assert drift.at["1", "ph_p"] < 1e-6
    assert len(cox.figure.axes[0].get_yticklabels()) == 2


def test_weibull_fit_recovers_shape_and_scale() -> None:
    fit = weibull_fit(lifetimes(4000, 800.0, 2.5, 3, censor_at=1000)).frame.iloc[0]
    assert fit["shape_lower"] <= 2.5 <= fit["shape_upper"]
    assert fit["scale_lower"] <= 800.0 <= fit["scale_upper"]
    assert fit["failures"] < fit["units"] == 4000


def _node_records(rows: list[tuple[str, str, str, str]], end: str) -> pd.DataFrame:
    """Spells of repairable nodes from their (unit, failed_at, repaired_at, kind) failures, to ``end``."""
    out = []
    for unit in sorted({r[0] for r in rows}):
        up = T0
        for _, failed_at, repaired_at, kind in [r for r in rows if r[0] == unit]:
            out.append((unit, up, pd.Timestamp(failed_at, tz="UTC"), kind, False,
                        pd.Timestamp(repaired_at, tz="UTC")))
            up = pd.Timestamp(repaired_at, tz="UTC")
        out.append((unit, up, pd.Timestamp(end, tz="UTC"), None, True, pd.NaT))
    columns = ["unit", "install_time", "end_time", "kind", "censored", "repaired_time"]
    return validate(pd.DataFrame(out, columns=columns))


def test_mtbf_by_period_counts_each_quarters_failures_and_hours() -> None:
    rows = [("n1", "2025-02-01", "2025-02-02", "PSU"), ("n1", "2025-05-01", "2025-05-03", "PSU"),
            ("n2", "2025-05-10", "2025-05-11", "NIC"), ("n2", "2025-06-10", "2025-06-11", "NIC")]
    records = pd.concat([_node_records(rows, "2025-09-30"),
                         validate(pd.DataFrame({"unit": ["n3"], "install_time": [T0],
                                                "end_time": ["2025-09-30"], "censored": [True]}))])
    mtbf = mtbf_by_period(records, "QS")
    q = mtbf.frame.set_index(mtbf.frame["period_start"].dt.strftime("%Y-%m"))
    assert q["failures"].to_dict() == {"2025-01": 1, "2025-04": 3, "2025-07": 0}
    assert q.at["2025-01", "hours"] == 90 * 24
    assert q.at["2025-04", "system_mtbf_hours"] == pytest.approx(91 * 24 / 3)
    down_q2 = 2 + 1 + 1  # days n1 and n2 spent in repair during April-June
    assert q.at["2025-04", "unit_hours"] == pytest.approx((3 * 91 - down_q2) * 24)
    assert q.at["2025-07", "system_mtbf_hours"] == np.inf
    assert q.at["2025-07", "period_end"] == pd.Timestamp("2025-09-30", tz="UTC")  # cut to the records


def test_repair_times_per_kind_fit_the_lognormal_they_were_drawn_from() -> None:
    rng = np.random.default_rng(9)
    rows = []
    for i, (kind, median, sigma) in enumerate((("PSU", 48.0, 0.5), ("ECC", 4.0, 1.0))):
        for k in range(400):
            fail = T0 + pd.Timedelta(days=k)
            hours = median * np.exp(sigma * rng.standard_normal())
            rows.append((f"{kind}-{k}", fail, fail + pd.Timedelta(hours=hours), kind, i))
    records = validate(pd.DataFrame(
        [(u, T0 - pd.Timedelta(days=1), f, kind, False, back) for u, f, back, kind, _ in rows],
        columns=["unit", "install_time", "end_time", "kind", "censored", "repaired_time"]))
    fits = repair_times(records).frame.set_index("group")
    assert fits.at["PSU", "lognormal_median_hours"] == pytest.approx(48.0, rel=0.1)
    assert fits.at["PSU", "lognormal_sigma"] == pytest.approx(0.5, rel=0.1)
    assert fits.at["ECC", "lognormal_median_hours"] == pytest.approx(4.0, rel=0.15)
    assert fits.at["ECC", "repairs"] == 400


def test_repeat_failure_curve_and_base_rate_on_a_fleet_built_by_hand() -> None:
    """Ten nodes over 100 days. n0..n4 fail on day 10, are back 12 h later, and fail again 2 h
    after that (n0, n1) or on day 50 (n2..n4); n5..n9 never fail."""
    rows = []
    for i in range(5):
        second = "2025-01-11T00:00:00" if i < 2 else "2025-02-20T00:00:00"
        rows += [(f"n{i}", "2025-01-10T10:00:00", "2025-01-10T22:00:00", "Unknown Error"),
                 (f"n{i}", second, "2025-02-21T00:00:00", "ECC")]
    quiet = pd.DataFrame({"unit": [f"n{i}" for i in range(5, 10)], "install_time": T0,
                          "end_time": pd.Timestamp("2025-04-11", tz="UTC"), "censored": True})
    records = pd.concat([_node_records(rows, "2025-04-11"), validate(quiet)], ignore_index=True)
    fixes = repairs(records)
    assert len(fixes) == 10 and fixes["refault"].sum() == 5  # the first returns refault; the second do not
    windows = [pd.Timedelta("1h"), pd.Timedelta("3h"), pd.Timedelta("30D"), pd.Timedelta("45D")]
    curve = repeat_failure_curve(records, windows).frame
    assert curve["p_refault"].round(6).tolist() == [0.0, 0.2, 0.2, 0.5]
    assert (curve["lower"] <= curve["p_refault"]).all() and (curve["p_refault"] <= curve["upper"]).all()
    # base rate: a 1-day window starting at t in [0, 99] days holds a failure of n2..n4 for t in
    # (8.42, 9.42] or (49, 50] (2 days of t each), of n0, n1 for t in (8.42, 10] (1 d 14 h each)
    one_day = base_rate(records, pd.Timedelta("1D"))
    assert one_day == pytest.approx((3 * 2 + 2 * (1 + 14 / 24)) / 99 / 10, rel=0.02)
    assert curve["ratio"].iloc[1] == pytest.approx(0.2 / curve["base_rate"].iloc[1])
    by_history = repeat_failure_curve(records, windows, history=pd.Timedelta("30D")).frame
    assert set(by_history["prior_failures"]) == {"1", "2"}
    second = by_history[by_history["prior_failures"] == "2"]
    assert second["repairs"].iloc[0] == 2 and second["p_refault"].max() == 0.0


def test_spells_view_gives_times_between_failures() -> None:
    records = _node_records([("n1", "2025-01-11", "2025-01-12", "PSU")], "2025-01-22")
    view = spells(records)
    assert view["duration_days"].tolist() == [10.0, 10.0]
    assert view["failed"].tolist() == [True, False]
