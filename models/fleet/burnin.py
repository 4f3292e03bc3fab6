"""The burn-in thresholds, read from a fleet's repeat-failure curve.

A node back from repair is riskier than the fleet for a while (:mod:`foreshock.models.fleet.repeat`),
and more so after a repeat failure. A burn-in holds such a node out of service until the early
refaults are behind it (:class:`foreshock.models.reliability.BurnIn`). Its three thresholds come
from the records, in two steps:

1. **Who** (``failures`` within ``window``): every repair is split into those after at least k
   failures within the N days before it (this one included) and the rest, for each N in
   ``history_days`` and k in ``counts``. The split kept is the one whose two refault curves
   differ most by the log-rank test (lifelines), among splits that leave at least
   ``min_repairs`` repairs on each side and differ at the 5 % level: the history that best
   tells a risky return from an ordinary one. When no history tells them apart, every repair
   is flagged (k = 1).
2. **How long** (``length``): the refault hazard of the flagged repairs, interval by interval of
   the curve's windows (1 h ... 30 days), against the fleet's failure rate per unit-hour in
   service. The burn-in ends at the start of the first interval from which the hazard stays
   below ``lift`` times the fleet's (an interval with fewer than :data:`MIN_EVENTS` refaults
   does not count as above it: one refault in a short interval is not evidence). Past that
   point the node's excess risk is the slow, lasting one of a lemon, which a longer wait no
   longer removes. None when no interval is above it: no burn-in pays.

``python -m foreshock.models.fleet.burnin [TRACE]`` prints the splits, the hazards and the result
for a ``fault_trace.json`` (the shipped InfiniteHBD trace by default): what
:data:`foreshock.models.reliability.DEFAULT_BURN_IN` holds.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd
from lifelines import KaplanMeierFitter
from lifelines.statistics import logrank_test
from matplotlib.figure import Figure

from foreshock.models.fleet.refault import failures_per_unit_day
from foreshock.models.fleet.repeat import DEFAULT_WINDOWS, repairs
from foreshock.models.reliability import SECONDS_PER_DAY, BurnIn

__all__ = ["HISTORY_DAYS", "FAILURE_COUNTS", "LIFT", "MIN_REPAIRS", "MIN_EVENTS", "SIGNIFICANCE",
           "BurnInDerivation", "history_splits", "refault_hazard", "derive_burn_in"]

HISTORY_DAYS: Final = (3, 7, 14, 30)
"""History windows N (days) the split is tried with."""
FAILURE_COUNTS: Final = (2, 3, 4)
"""Failure counts k the split is tried with (k = 1 would flag every repair)."""
LIFT: Final = 10.0
"""The burn-in lasts while a returned node is this many times riskier than the fleet: an order of
magnitude, the one judgement in the derivation."""
MIN_REPAIRS: Final = 30
"""Repairs each side of a split needs: fewer, and its curve is a handful of steps."""
MIN_EVENTS: Final = 3
"""Refaults an interval needs before its hazard can hold the burn-in open."""
SIGNIFICANCE: Final = 0.05
"""Largest log-rank p-value of a split that is taken to tell risky returns apart."""
_HOUR: Final = pd.Timedelta(hours=1)


@dataclass(frozen=True)
class BurnInDerivation:
    """The thresholds (``burn_in``; None when returned nodes are never ``lift`` times riskier than
    the fleet, so no burn-in pays) and the figures they were read from.

    ``splits``: one row per (``history_days``, ``failures``) tried: ``flagged`` and ``others``
    (repairs each side), the log-rank ``statistic`` and ``p_value``, ``chosen``. ``hazard``: per
    interval of the curve (``from_hours``, ``to_hours``), the flagged repairs' ``refaults`` in it
    and ``p_refault`` by its end, their ``hazard_per_hour``, the fleet's ``fleet_per_hour`` and
    the ``ratio``.
    """

    burn_in: BurnIn | None
    splits: pd.DataFrame
    hazard: pd.DataFrame
    figure: Figure


def _counts(fixes: pd.DataFrame) -> np.ndarray:
    return fixes["prior_failures"].str.rstrip("+").astype(int).to_numpy()


def history_splits(records: pd.DataFrame, history_days: Sequence[int] = HISTORY_DAYS,
                   counts: Sequence[int] = FAILURE_COUNTS) -> pd.DataFrame:
    """The log-rank test of every split "k or more failures within N days" against the rest."""
    rows = []
    for days in history_days:
        fixes = repairs(records, pd.Timedelta(days=days), most=max(counts))
        prior = _counts(fixes)
        for k in counts:
            flagged, others = fixes[prior >= k], fixes[prior < k]
            test = None
            if len(flagged) and len(others):
                test = logrank_test(flagged["gap_days"], others["gap_days"], flagged["refault"],
                                    others["refault"])
            rows.append({"history_days": days, "failures": k, "flagged": len(flagged), "others": len(others),
                         "statistic": np.nan if test is None else float(test.test_statistic),
                         "p_value": np.nan if test is None else float(test.p_value)})
    return pd.DataFrame(rows)


def refault_hazard(fixes: pd.DataFrame, fleet_per_day: float,
                   windows: Sequence[pd.Timedelta] = DEFAULT_WINDOWS) -> pd.DataFrame:
    """Refault hazard of ``fixes`` (rows of :func:`~foreshock.models.fleet.repeat.repairs`) over each
    interval between 0 and the ``windows``, from their Kaplan-Meier curve, against the fleet's rate."""
    edges = np.array([0.0] + [w / _HOUR for w in windows])
    km = KaplanMeierFitter().fit(fixes["gap_days"], fixes["refault"])
    refault = 1.0 - km.survival_function_at_times(edges / 24.0).to_numpy()
    survived = np.maximum(1.0 - refault[:-1], 1e-12)
    hazard = np.diff(refault) / survived / np.diff(edges)
    fleet = fleet_per_day / 24.0
    gap_h = fixes["gap_days"].to_numpy() * 24.0
    hit = fixes["refault"].to_numpy(dtype=bool)
    events = [int((hit & (gap_h > lo) & (gap_h <= hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:],
                                                                                    strict=True)]
    return pd.DataFrame({"from_hours": edges[:-1], "to_hours": edges[1:], "refaults": events,
                         "p_refault": refault[1:],
                         "hazard_per_hour": hazard, "fleet_per_hour": fleet, "ratio": hazard / fleet})


def _length_hours(hazard: pd.DataFrame, lift: float) -> float:
    """Start of the first interval from which no interval is above ``lift`` (with :data:`MIN_EVENTS`
    refaults at least); 0 when none is, the last window's end when even the last one is."""
    above = np.flatnonzero((hazard["ratio"].to_numpy() >= lift)
                           & (hazard["refaults"].to_numpy() >= MIN_EVENTS))
    if not above.size:
        return float(hazard["from_hours"].iloc[0])
    return float(hazard["to_hours"].iloc[above[-1]])


def derive_burn_in(records: pd.DataFrame, *, history_days: Sequence[int] = HISTORY_DAYS,
                   counts: Sequence[int] = FAILURE_COUNTS, lift: float = LIFT,
                   min_repairs: int = MIN_REPAIRS,
                   windows: Sequence[pd.Timedelta] = DEFAULT_WINDOWS) -> BurnInDerivation:
    """The burn-in thresholds for ``records`` (fleet records with repairs; see the module docstring).

    Raises ``ValueError`` when the records hold fewer than ``min_repairs`` repairs.
    """
    splits = history_splits(records, history_days, counts)
    usable = splits[(splits["flagged"] >= min_repairs) & (splits["others"] >= min_repairs)
                    & (splits["p_value"] < SIGNIFICANCE)]
    best = usable["statistic"].idxmax() if len(usable) else None
    splits["chosen"] = splits.index == best
    days = int(splits.at[best, "history_days"]) if best is not None else min(history_days)
    k = int(splits.at[best, "failures"]) if best is not None else 1
    fixes = repairs(records, pd.Timedelta(days=days), most=max(counts))
    if len(fixes) < min_repairs:
        raise ValueError(f"{len(fixes)} repairs in the records: at least {min_repairs} are needed to set a "
                         "burn-in from")
    prior = _counts(fixes)
    fleet = failures_per_unit_day(records)
    flagged = refault_hazard(fixes[prior >= k], fleet, windows)
    length_h = _length_hours(flagged, lift)
    burn_in = BurnIn(failures=k, window_s=days * SECONDS_PER_DAY, length_s=length_h * 3600.0) \
        if length_h > 0 else None
    others = refault_hazard(fixes[prior < k], fleet, windows) if k > 1 else None
    figure = _plot(flagged, others, lift, length_h, k, days)
    return BurnInDerivation(burn_in, splits, flagged, figure)


def _plot(flagged: pd.DataFrame, others: pd.DataFrame | None, lift: float, length_h: float, k: int,
          days: int) -> Figure:
    figure = Figure(figsize=(8, 5))
    ax = figure.subplots()
    curves = [(flagged, "after every repair" if k == 1 else f"after failure no. {k}+ within {days} days")]
    if others is not None:
        curves.append((others, f"after fewer than {k} failures within {days} days"))
    for frame, label in curves:
        ratio = np.maximum(frame["ratio"].to_numpy(), 1e-2)
        ax.step(frame["to_hours"], ratio, where="pre", label=label)
    ax.axhline(lift, color="k", linestyle="--", label=f"{lift:g} x the fleet's failure rate")
    if length_h > 0:
        ax.axvline(length_h, color="r", linestyle=":", label=f"burn-in: {length_h:g} h")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hours since the return to service (interval end)")
    ax.set_ylabel("refault hazard / the fleet's failure rate")
    ax.set_title("Refault hazard after a repair, against the fleet")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure


def main(trace_path: str | None = None) -> None:
    from foreshock.models.fleet.sources import load_infinitehbd
    from foreshock.shipped import trace

    derivation = derive_burn_in(load_infinitehbd(trace_path or trace("infinitehbd")))
    with pd.option_context("display.width", 120, "display.max_columns", 20):
        print(derivation.splits.round(4).to_string(index=False))
        print(derivation.hazard.round(6).to_string(index=False))
    b = derivation.burn_in
    print("burn-in: none pays" if b is None else f"burn-in: {b.failures} failures within "
          f"{b.window_s / SECONDS_PER_DAY:g} days -> {b.length_s / 3600:g} h")


if __name__ == "__main__":
    main(*sys.argv[1:2])
