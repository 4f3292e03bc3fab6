"""How well a node's own failure history ranks the nodes that fail next: the one predictive figure
Foreshock can measure on real records (no telemetry needed).

Every day at midnight (a *cutoff*), every unit in service is a sample: its history up to the
cutoff gives the scores, and the label says whether it fails within the horizon after it. The
split is by time: a logistic regression on the history features is fitted on the cutoffs whose
horizon ends before ``train_fraction`` of the records' span, and every scorer is judged on the
cutoffs after it. Scorers: ``failures, last 30 days``, ``days since return`` (fewer = riskier),
and ``logistic regression`` on both and the failures of the last 7 days and ever.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score, roc_curve

from foreshock.models.fleet.sources import load_infinitehbd
from foreshock.models.fleet.survival import Analysis

__all__ = ["FEATURES", "history_samples", "lift_at", "history_ranking"]

FEATURES: Final = ("failures_7d", "failures_30d", "failures_ever", "days_since_return")
_NEVER_RETURNED_DAYS: Final = 10_000.0  # a unit never repaired: its history starts long before
_DAY: Final = pd.Timedelta(days=1)


def _ns(times: pd.Series) -> np.ndarray:
    """UTC times as integer nanoseconds since the epoch."""
    naive = times.dt.tz_convert("UTC").dt.tz_localize(None)
    return naive.to_numpy().astype("datetime64[ns]").astype(np.int64)


def history_samples(records: pd.DataFrame, horizons: Sequence[int] = (1, 7)) -> pd.DataFrame:
    """One row per (daily cutoff, unit in service then): ``cutoff, unit``, the history
    :data:`FEATURES` (``days_since_return`` is days since the unit's last return from repair),
    and ``fails_within_{h}d`` per horizon (a failure in ``(cutoff, cutoff + h days]``). Cutoffs
    run from the first midnight after the records start to the last one a horizon before they end.
    """
    start, end = records["install_time"].min(), records["end_time"].max()
    cutoffs = pd.date_range(start.ceil("D"), end - max(horizons) * _DAY, freq="D")
    c = cutoffs.tz_convert("UTC").tz_localize(None).to_numpy().astype(np.int64)
    day = _DAY.value
    parts = []
    for unit, rows in records.groupby("unit", sort=True):
        fails = np.sort(_ns(rows.loc[~rows["censored"], "end_time"]))
        down = rows.loc[~rows["censored"]]
        down_from, down_to = _ns(down["end_time"]), _ns(down["repaired_time"].fillna(end))
        first, last = _ns(rows["install_time"]).min(), _ns(rows["end_time"]).max()
        up = (c >= first) & (c < last)
        for lo, hi in zip(down_from, down_to, strict=True):
            up &= ~((c >= lo) & (c < hi))
        if not up.any():
            continue
        t = c[up]
        before = np.searchsorted(fails, t, side="right")
        returns = np.sort(down_to)
        since = np.full(t.size, _NEVER_RETURNED_DAYS)
        if returns.size:
            last_return = np.searchsorted(returns, t, side="right") - 1
            back = last_return >= 0
            since[back] = (t[back] - returns[last_return[back]]) / day
        part = {
            "cutoff": t, "unit": unit,
            "failures_7d": before - np.searchsorted(fails, t - 7 * day, side="right"),
            "failures_30d": before - np.searchsorted(fails, t - 30 * day, side="right"),
            "failures_ever": before, "days_since_return": since,
        }
        for h in horizons:
            part[f"fails_within_{h}d"] = np.searchsorted(fails, t + h * day, side="right") > before
        parts.append(pd.DataFrame(part))
    out = pd.concat(parts, ignore_index=True)
    out["cutoff"] = pd.to_datetime(out["cutoff"], utc=True)
    return out.sort_values(["cutoff", "unit"], kind="stable").reset_index(drop=True)


def lift_at(scores: np.ndarray, labels: np.ndarray, top: float) -> tuple[float, float]:
    """(precision, lift) of the ``top`` share of samples by score, ties broken at random in
    expectation: the tied group at the cut contributes its positive rate times the places left."""
    labels = np.asarray(labels, dtype=bool)
    k = max(1, int(round(top * len(scores))))
    order = np.argsort(-scores, kind="stable")
    cut = scores[order[k - 1]]
    above = scores > cut
    tied = scores == cut
    positives = labels[above].sum() + labels[tied].mean() * (k - above.sum())
    precision = positives / k
    return float(precision), float(precision / labels.mean())


def _scorers(train: pd.DataFrame, horizon: int) -> dict[str, object]:
    target = train[f"fails_within_{horizon}d"]
    x = _design(train)
    model = LogisticRegression(max_iter=1000).fit(x, target) if target.any() and not target.all() else None
    return {
        "failures, last 30 days": lambda s: s["failures_30d"].to_numpy(dtype=float),
        "days since return": lambda s: -s["days_since_return"].to_numpy(dtype=float),
        "logistic regression": (lambda s: model.predict_proba(_design(s))[:, 1]) if model else None,
    }


def _design(samples: pd.DataFrame) -> np.ndarray:
    """The features on scales a linear model can use (counts as log1p, days since return as log)."""
    return np.column_stack([np.log1p(samples[f].to_numpy(dtype=float)) for f in FEATURES])


def history_ranking(
    records: pd.DataFrame,
    horizons: Sequence[int] = (1, 7),
    *,
    train_fraction: float = 0.6,
    top: float = 0.05,
    title: str = "Ranking nodes by their own history (held-out later period)",
) -> Analysis:
    """AUC and lift of each history scorer for each horizon (days), on the later period.

    Frame: one row per horizon and scorer: ``horizon_days, scorer, train_samples,
    test_samples, positives, base_rate, auc, precision_top, lift_top`` (``top`` of the samples;
    random ranking: AUC 0.5, lift 1). The figure draws the ROC curves.
    """
    samples = history_samples(records, horizons)
    start, end = records["install_time"].min(), records["end_time"].max()
    split = start + train_fraction * (end - start)
    rows = []
    figure = Figure(figsize=(5 * len(horizons), 4.5))
    axes = np.atleast_1d(figure.subplots(1, len(horizons)))
    for ax, h in zip(axes, horizons, strict=True):
        train = samples[samples["cutoff"] + h * _DAY <= split]
        test = samples[samples["cutoff"] >= split]
        labels = test[f"fails_within_{h}d"].to_numpy()
        for name, score in _scorers(train, h).items():
            if score is None:
                continue
            s = score(test)
            precision, lift = lift_at(s, labels, top)
            auc = roc_auc_score(labels, s)
            rows.append({"horizon_days": h, "scorer": name, "train_samples": len(train),
                         "test_samples": len(test), "positives": int(labels.sum()),
                         "base_rate": float(labels.mean()), "auc": float(auc),
                         "precision_top": precision, "lift_top": lift})
            fpr, tpr, _ = roc_curve(labels, s)
            ax.plot(fpr, tpr, label=f"{name} (AUC {auc:.2f})")
        ax.plot([0, 1], [0, 1], "k:", label="random")
        ax.set_title(f"fails within {h} day{'s' if h > 1 else ''}")
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("true-positive rate")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return Analysis(pd.DataFrame(rows), figure)


def main(path: str) -> None:
    table = history_ranking(load_infinitehbd(path)).frame
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main(sys.argv[1])
