"""Repeat failures: how likely a unit back from repair is to fail again soon, against the fleet.

After a repair, a unit either is fixed or is not: a failed repair (the fault was not found, or
the part swapped was not the bad one) or a *lemon* (a unit that keeps failing) shows as another
failure soon after the return. :func:`repeat_failure_curve` measures it as
P(the unit fails again within W of its return), a Kaplan-Meier estimate over every repair (a
unit whose records end before W is censored, not counted as fixed), beside the base rate: the
chance that a unit picked at random fails within a window of W placed at random.

Split by ``history`` (how many failures the unit had in the N days up to the repair), the curve
says how long a unit back from its k-th failure in N days stays riskier than the fleet: the
reading a burn-in policy needs (hold such a unit out until the curve meets the base rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd
from lifelines import KaplanMeierFitter
from matplotlib.figure import Figure

from foreshock.models.fleet.survival import Analysis

__all__ = ["DEFAULT_WINDOWS", "repairs", "base_rate", "repeat_failure_curve"]

DEFAULT_WINDOWS: Final = tuple(pd.to_timedelta(w) for w in (
    "1h", "3h", "6h", "12h", "1D", "2D", "3D", "7D", "14D", "30D"))
"""W from one hour to thirty days."""
_DAY: Final = pd.Timedelta(days=1)
_BASE_GRID_POINTS: Final = 2000  # window placements per W for the base rate (hourly at most)


def _naive(times: pd.Series) -> np.ndarray:
    """UTC times as numpy datetime64 (numpy has no zones; everything here is UTC)."""
    return times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()


def repairs(records: pd.DataFrame, history: pd.Timedelta | None = None, most: int = 3) -> pd.DataFrame:
    """One row per repair: ``unit, kind, failed_at, repaired_at, gap_days, refault, next_kind``.

    ``gap_days`` runs from the return to the unit's next failure (``refault`` true) or, without
    one, to the end of its records (censored). With ``history``, ``prior_failures`` counts the
    unit's failures in the ``history`` up to and including this one, as text ``1``, ``2``, ...,
    with ``most`` and above pooled (``3+``).
    """
    failed = records[~records["censored"]].sort_values(["unit", "end_time"], kind="stable")
    last_seen = records.groupby("unit")["end_time"].max()
    rows = []
    for unit, group in failed.groupby("unit", sort=True):
        times, backs = _naive(group["end_time"]), _naive(group["repaired_time"])
        kinds = group["kind"].to_numpy()
        for i in np.flatnonzero(~np.isnat(backs)):
            back = backs[i]
            later = np.flatnonzero(times >= back)
            nxt = later[later > i]
            end = times[nxt[0]] if nxt.size else last_seen[unit].tz_localize(None).to_datetime64()
            row = {"unit": unit, "kind": kinds[i], "failed_at": pd.Timestamp(times[i], tz="UTC"),
                   "repaired_at": pd.Timestamp(back, tz="UTC"),
                   "gap_days": (end - back) / np.timedelta64(1, "D"),
                   "refault": bool(nxt.size), "next_kind": kinds[nxt[0]] if nxt.size else None}
            if history is not None:
                k = int(((times > times[i] - history.to_timedelta64()) & (times <= times[i])).sum())
                row["prior_failures"] = f"{most}+" if k >= most else str(k)
            rows.append(row)
    columns = ["unit", "kind", "failed_at", "repaired_at", "gap_days", "refault", "next_kind"]
    out = pd.DataFrame(rows, columns=columns + (["prior_failures"] if history is not None else []))
    return out


def base_rate(records: pd.DataFrame, window: pd.Timedelta) -> float:
    """P(a unit fails within ``window``), for a window placed at random in the records' span and a
    unit picked at random among those observed over the whole window."""
    start, end = records["install_time"].min(), records["end_time"].max()
    if end - start <= window:
        return float("nan")
    step = max(pd.Timedelta(hours=1), (end - start - window) / _BASE_GRID_POINTS)
    grid = pd.date_range(start, end - window, freq=step).tz_localize(None).to_numpy()
    spans = records.groupby("unit").agg(first=("install_time", "min"), last=("end_time", "max"))
    observed = ((_naive(spans["first"])[:, None] <= grid[None, :])
                & (_naive(spans["last"])[:, None] >= grid[None, :] + window.to_timedelta64())).sum(axis=0)
    hit = np.zeros(grid.size)
    failures = records[~records["censored"]]
    for _, times in failures.groupby("unit")["end_time"]:
        t = np.sort(_naive(times))
        i = np.searchsorted(t, grid, side="left")
        hit += (i < t.size) & (t[np.minimum(i, t.size - 1)] < grid + window.to_timedelta64())
    mask = observed > 0
    return float((hit[mask] / observed[mask]).mean()) if mask.any() else float("nan")


def _curve(gaps: pd.DataFrame, windows: Sequence[pd.Timedelta], alpha: float) -> pd.DataFrame:
    kmf = KaplanMeierFitter(alpha=alpha).fit(gaps["gap_days"], gaps["refault"])
    timeline = kmf.survival_function_.index.to_numpy()
    survival = kmf.survival_function_.iloc[:, 0].to_numpy()
    band = kmf.confidence_interval_survival_function_.to_numpy()
    rows = []
    for w in windows:
        i = np.searchsorted(timeline, w / _DAY, side="right") - 1
        rows.append({"p_refault": 1 - survival[i], "lower": 1 - band[i, 1], "upper": 1 - band[i, 0]})
    return pd.DataFrame(rows)


def repeat_failure_curve(
    records: pd.DataFrame,
    windows: Sequence[pd.Timedelta] = DEFAULT_WINDOWS,
    *,
    history: pd.Timedelta | None = None,
    alpha: float = 0.05,
    title: str = "Another failure within W of a repair, against the fleet's base rate",
) -> Analysis:
    """P(another failure within W after a repair) and the base rate, for each W in ``windows``.

    Frame: one row per W (and per ``prior_failures`` group with ``history``): ``window``,
    ``window_hours``, ``prior_failures`` (``all`` without ``history``), ``repairs``,
    ``p_refault`` with its (1 - alpha) band ``lower``/``upper``, ``base_rate`` and
    ``ratio`` = p_refault / base_rate (how many times riskier than a unit picked at random).
    """
    fixes = repairs(records, history)
    groups = [("all", fixes)]
    if history is not None:
        groups += [(k, part) for k, part in fixes.groupby("prior_failures", sort=True)]
        groups = groups[1:]
    base = np.array([base_rate(records, w) for w in windows])
    hours = np.array([w / pd.Timedelta(hours=1) for w in windows])
    parts = []
    for label, part in groups:
        curve = _curve(part, windows, alpha)
        curve.insert(0, "window", list(windows))
        curve.insert(1, "window_hours", hours)
        curve.insert(2, "prior_failures", label)
        curve.insert(3, "repairs", len(part))
        curve["base_rate"] = base
        curve["ratio"] = curve["p_refault"] / base
        parts.append(curve)
    frame = pd.concat(parts, ignore_index=True)
    return Analysis(frame, _plot(frame, title, history))


def _plot(frame: pd.DataFrame, title: str, history: pd.Timedelta | None) -> Figure:
    figure = Figure(figsize=(8, 5))
    ax = figure.subplots()
    for label, part in frame.groupby("prior_failures", sort=True):
        name = "after a repair" if label == "all" else f"after failure no. {label} in {history.days} days"
        line = ax.plot(part["window_hours"], part["p_refault"], "o-",
                       label=f"{name} ({int(part['repairs'].iloc[0])} repairs)")[0]
        ax.fill_between(part["window_hours"], part["lower"], part["upper"], alpha=0.15,
                        color=line.get_color())
    first = frame.drop_duplicates("window_hours")
    ax.plot(first["window_hours"], first["base_rate"], "k--", label="base rate (any unit, any window)")
    ax.set_xscale("log")
    ticks = first["window_hours"].to_numpy()
    ax.set_xticks(ticks, [f"{h:g} h" if h < 24 else f"{h / 24:g} d" for h in ticks])
    ax.set_xlabel("window W after the return to service")
    ax.set_ylabel("P(fails again within W)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure
