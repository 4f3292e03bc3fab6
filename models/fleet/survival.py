"""Survival of units in service: Kaplan-Meier curves, Cox hazard ratios by location, a Weibull fit.

Every function takes a survival frame, one row per subject with a duration and an event flag
(``unit_lifetimes`` or ``spells`` of :mod:`foreshock.models.fleet.records`: ``duration_days`` and
``failed``), fits with lifelines and returns an :class:`Analysis`: a tidy frame and a figure
built without pyplot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
from lifelines import CoxPHFitter, KaplanMeierFitter, WeibullFitter
from lifelines.statistics import proportional_hazard_test
from matplotlib.figure import Figure

__all__ = ["Analysis", "kaplan_meier", "cox_hazard_ratios", "weibull_fit"]

DURATION = "duration_days"
EVENT = "failed"


class Analysis(NamedTuple):
    """What an analysis found (``frame``) and how it looks (``figure``)."""

    frame: pd.DataFrame
    figure: Figure


def _groups(frame: pd.DataFrame, by: str | Sequence[str] | None) -> list[tuple[str, pd.DataFrame]]:
    """``(label, rows)`` per group in sorted order; one group ``all`` when ``by`` is None."""
    if by is None:
        return [("all", frame)]
    keys = [by] if isinstance(by, str) else list(by)
    out = []
    for value, rows in frame.groupby(keys, sort=True, observed=True):
        values = value if isinstance(value, tuple) else (value,)
        out.append((", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)), rows))
    return out


def kaplan_meier(
    frame: pd.DataFrame,
    by: str | Sequence[str] | None = None,
    *,
    duration: str = DURATION,
    event: str = EVENT,
    alpha: float = 0.05,
    title: str = "Survival (Kaplan-Meier)",
    time_unit: str = "days",
) -> Analysis:
    """Kaplan-Meier survival per group of ``by`` (one column or several), with (1 - alpha) bands.

    Frame: one row per group and event time: ``group, time, survival, lower, upper, at_risk``
    (the band is lifelines' exponential Greenwood interval).
    """
    parts = []
    figure = Figure(figsize=(8, 5))
    ax = figure.subplots()
    for label, rows in _groups(frame, by):
        kmf = KaplanMeierFitter(alpha=alpha).fit(rows[duration], rows[event].astype(bool), label=label)
        curve = kmf.survival_function_.iloc[:, 0]
        band = kmf.confidence_interval_survival_function_
        parts.append(pd.DataFrame({
            "group": label, "time": curve.index.to_numpy(), "survival": curve.to_numpy(),
            "lower": band.iloc[:, 0].to_numpy(), "upper": band.iloc[:, 1].to_numpy(),
            "at_risk": kmf.event_table["at_risk"].reindex(curve.index).to_numpy(),
        }))
        line = ax.step(curve.index, curve.to_numpy(), where="post", label=f"{label} (n={len(rows):,})")[0]
        ax.fill_between(curve.index, band.iloc[:, 0], band.iloc[:, 1], step="post",
                        alpha=0.2, color=line.get_color())
    ax.set_xlabel(f"time in service ({time_unit})")
    ax.set_ylabel("fraction still in service")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Analysis(pd.concat(parts, ignore_index=True), figure)


def _dummies(
    frame: pd.DataFrame, covariates: Sequence[str]
) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Indicator columns per level of each categorical covariate, its lowest level the reference.

    Returns the columns and ``(column, covariate, level)`` per column."""
    columns, names = {}, []
    for cov in covariates:
        levels = sorted(frame[cov].dropna().unique())
        for level in levels[1:]:
            name = f"{cov}={level}"
            columns[name] = (frame[cov] == level).astype(float)
            names.append((name, cov, str(level)))
    return pd.DataFrame(columns, index=frame.index), names


def cox_hazard_ratios(
    frame: pd.DataFrame,
    covariates: Sequence[str],
    *,
    strata: Sequence[str] | None = None,
    duration: str = DURATION,
    event: str = EVENT,
    alpha: float = 0.05,
    title: str = "Hazard ratio by location (Cox proportional hazards)",
) -> Analysis:
    """Cox proportional hazards with each covariate categorical (its lowest level the reference),
    and the proportional-hazards check of each term.

    Frame: one row per non-reference level: ``covariate, level, reference, hazard_ratio, lower,
    upper, p`` and the Schoenfeld-residual test of proportional hazards for that term (rank time
    transform): ``ph_statistic, ph_p`` (a small ``ph_p`` says the ratio drifts with age).
    ``strata`` are columns the baseline hazard is fitted separately for (a batch).
    """
    indicators, names = _dummies(frame, covariates)
    keep = [duration, event, *(strata or [])]
    data = pd.concat([frame[keep], indicators], axis=1)
    data[event] = data[event].astype(bool)
    cph = CoxPHFitter(alpha=alpha).fit(data, duration, event, strata=list(strata) if strata else None)
    ph = proportional_hazard_test(cph, data, time_transform="rank").summary
    s = cph.summary
    lo, hi = [c for c in s.columns if c.startswith("exp(coef) lower")][0], \
        [c for c in s.columns if c.startswith("exp(coef) upper")][0]
    rows = []
    for name, cov, level in names:
        reference = str(sorted(frame[cov].dropna().unique())[0])
        rows.append({
            "covariate": cov, "level": level, "reference": reference,
            "hazard_ratio": s.at[name, "exp(coef)"], "lower": s.at[name, lo], "upper": s.at[name, hi],
            "p": s.at[name, "p"],
            "ph_statistic": float(ph.at[name, "test_statistic"]), "ph_p": float(ph.at[name, "p"]),
        })
    out = pd.DataFrame(rows)
    return Analysis(out, _forest(out, title))


def _forest(ratios: pd.DataFrame, title: str) -> Figure:
    """Hazard ratios with their intervals, one line per level, grouped by covariate."""
    figure = Figure(figsize=(7, 0.32 * len(ratios) + 1.5))
    ax = figure.subplots()
    y = np.arange(len(ratios))[::-1]
    ax.errorbar(ratios["hazard_ratio"], y,
                xerr=[ratios["hazard_ratio"] - ratios["lower"], ratios["upper"] - ratios["hazard_ratio"]],
                fmt="o", capsize=3)
    ax.axvline(1.0, color="grey", lw=1)
    ax.set_yticks(y, [f"{r.covariate} {r.level} vs {r.reference}" for r in ratios.itertuples()])
    ax.set_xlabel("hazard ratio (95 % interval)")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    figure.tight_layout()
    return figure


def weibull_fit(
    frame: pd.DataFrame,
    by: str | Sequence[str] | None = None,
    *,
    duration: str = DURATION,
    event: str = EVENT,
    alpha: float = 0.05,
    title: str = "Weibull fit against Kaplan-Meier",
    time_unit: str = "days",
) -> Analysis:
    """A Weibull fit per group, S(t) = exp(-(t / scale) ** shape), drawn over the Kaplan-Meier curve.

    Frame: one row per group: ``group, units, failures, scale, scale_lower, scale_upper, shape,
    shape_lower, shape_upper, median`` (shape > 1: wear-out, the hazard rises with age; < 1:
    infant mortality). Durations of zero are moved to a second's worth so the likelihood exists.
    """
    rows = []
    figure = Figure(figsize=(8, 5))
    ax = figure.subplots()
    for label, part in _groups(frame, by):
        t = part[duration].clip(lower=1 / 86_400).to_numpy()
        e = part[event].astype(bool).to_numpy()
        wf = WeibullFitter(alpha=alpha).fit(t, e, label=label)
        s = wf.summary
        lo, hi = [c for c in s.columns if c.startswith("coef lower")][0], \
            [c for c in s.columns if c.startswith("coef upper")][0]
        rows.append({
            "group": label, "units": len(part), "failures": int(e.sum()),
            "scale": wf.lambda_, "scale_lower": s.at["lambda_", lo], "scale_upper": s.at["lambda_", hi],
            "shape": wf.rho_, "shape_lower": s.at["rho_", lo], "shape_upper": s.at["rho_", hi],
            "median": wf.median_survival_time_,
        })
        km = KaplanMeierFitter().fit(t, e).survival_function_.iloc[:, 0]
        line = ax.step(km.index, km.to_numpy(), where="post", alpha=0.6, label=f"{label} Kaplan-Meier")[0]
        grid = np.linspace(0, t.max(), 200)
        ax.plot(grid, np.exp(-((grid / wf.lambda_) ** wf.rho_)), "--", color=line.get_color(),
                label=f"{label} Weibull (shape {wf.rho_:.2f})")
    ax.set_xlabel(f"time in service ({time_unit})")
    ax.set_ylabel("fraction still in service")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Analysis(pd.DataFrame(rows), figure)
