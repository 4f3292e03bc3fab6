"""Failures over the calendar and repairs: MTBF per period, repair-time distributions by kind.

Both take fleet records (:mod:`foreshock.models.fleet.records`) and return an
:class:`~foreshock.models.fleet.survival.Analysis`.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pandas as pd
from lifelines import LogNormalFitter
from matplotlib.figure import Figure

from foreshock.models.fleet.survival import Analysis

__all__ = ["mtbf_by_period", "repair_times"]

_HOUR: Final = pd.Timedelta(hours=1)
_MIN_REPAIR_HOURS: Final = 1 / 60  # a repair closed in the minute it opened still took the unit out


def mtbf_by_period(records: pd.DataFrame, freq: str = "QS", title: str | None = None) -> Analysis:
    """Failures and mean time between failures per calendar period (pandas ``freq``: ``QS``
    quarters, ``MS`` months, ``30D`` ...), over the span of the records.

    Frame: one row per period: ``period_start, period_end, hours, failures, system_mtbf_hours``
    (hours of the period per failure anywhere in the fleet: how often *something* fails),
    ``unit_hours`` (time units spent in service during the period) and ``unit_mtbf_hours``
    (unit-hours per failure: how long one unit lasts). Periods are cut to the span of the
    records, so a first or last partial period counts only its observed hours. A period without
    failures has an infinite MTBF.
    """
    start, end = records["install_time"].min(), records["end_time"].max()
    edges = pd.date_range(start.normalize(), end, freq=freq)  # calendar edges from midnight UTC
    edges = edges[edges > start].insert(0, start)
    edges = edges.append(pd.DatetimeIndex([end])) if edges[-1] < end else edges
    failures = records.loc[~records["censored"], "end_time"]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        overlap = (records["end_time"].clip(upper=hi) - records["install_time"].clip(lower=lo)).clip(
            lower=pd.Timedelta(0))
        count = int(((failures >= lo) & (failures < hi)).sum()) + int(hi == end and (failures == end).sum())
        hours = (hi - lo) / _HOUR
        unit_hours = overlap.dt.total_seconds().sum() / 3600.0  # a timedelta sum overflows at ~292 years
        rows.append({
            "period_start": lo, "period_end": hi, "hours": hours, "failures": count,
            "system_mtbf_hours": hours / count if count else np.inf,
            "unit_hours": unit_hours, "unit_mtbf_hours": unit_hours / count if count else np.inf,
        })
    out = pd.DataFrame(rows)
    figure = Figure(figsize=(9, 4.5))
    ax = figure.subplots()
    shown = out["system_mtbf_hours"].replace(np.inf, np.nan)
    ax.bar(out["period_start"], shown, width=(out["period_end"] - out["period_start"]) * 0.9, align="edge")
    ax.set_yscale("log")  # quiet and bad periods differ by orders of magnitude
    ax.set_ylabel("system MTBF (hours)")
    ax.set_xlabel("period")
    ax.set_title(title or f"System MTBF per period ({freq})")
    ax.grid(alpha=0.3, axis="y")
    figure.autofmt_xdate()
    return Analysis(out, figure)


def repair_times(records: pd.DataFrame, by: str = "kind", top: int = 8, title: str | None = None) -> Analysis:
    """How long repairs take, per failure ``kind`` (or any other column): the ``top`` most common
    groups, the rest pooled as ``other``.

    Frame: one row per group: ``group, repairs, median_hours, p90_hours, mean_hours`` and a
    lognormal fit by lifelines (``lognormal_median_hours``, ``lognormal_sigma``), the shape the
    simulator's profiles use. Only failures with a ``repaired_time`` count; a repair closed
    within a minute counts as one minute.
    """
    done = records[~records["censored"] & records["repaired_time"].notna()]
    hours = ((done["repaired_time"] - done["end_time"]) / _HOUR).clip(lower=_MIN_REPAIR_HOURS)
    group = done[by].astype(object).fillna("unknown")
    common = group.value_counts().index[:top]
    group = group.where(group.isin(common), "other")
    rows, figure = [], Figure(figsize=(8, 5))
    ax = figure.subplots()
    order = [g for g in common if (group == g).any()] + (["other"] if (group == "other").any() else [])
    for name in order:
        h = np.sort(hours[group == name].to_numpy())
        row = {"group": name, "repairs": len(h), "median_hours": float(np.median(h)),
               "p90_hours": float(np.quantile(h, 0.9)), "mean_hours": float(h.mean()),
               "lognormal_median_hours": np.nan, "lognormal_sigma": np.nan}
        if len(h) > 1 and h.min() < h.max():
            fit = LogNormalFitter().fit(h)
            row["lognormal_median_hours"], row["lognormal_sigma"] = float(np.exp(fit.mu_)), float(fit.sigma_)
        rows.append(row)
        ax.step(h, np.arange(1, len(h) + 1) / len(h), where="post", label=f"{name} ({len(h)})")
    ax.set_xscale("log")
    ax.set_xlabel("repair time (hours)")
    ax.set_ylabel("fraction of repairs done")
    ax.set_title(title or f"Repair time by {by}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return Analysis(pd.DataFrame(rows), figure)
