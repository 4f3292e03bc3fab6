"""The PNG plots of a training or evaluation report (matplotlib, headless).

- ``pr_curves.png``: precision-recall curves of the model and the baselines on the same rows.
- ``lead_time.png``: histogram of lead times (minutes from first alert to failure) of the
  failures each predictor caught at its budget threshold.
- ``importance_gain.png`` and ``importance_shap.png``: the model's top features by the trees'
  total split gain (the linear prior has none) and by mean |SHAP| on (a sample of) the scored
  rows (:meth:`~foreshock.models.artifact.RiskModel.contributions`: LightGBM's ``pred_contrib`` plus the
  linear prior's terms).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from foreshock.models.artifact import RiskModel  # noqa: E402
from foreshock.models.scored import ScoredRows  # noqa: E402

__all__ = ["SHAP_ROWS", "write_plots", "shap_importance"]

_TOP = 20
SHAP_ROWS = 20_000


def shap_importance(model: RiskModel, frame, max_rows: int = SHAP_ROWS, seed: int = 0) -> dict[str, float]:
    """Mean |SHAP contribution| per feature over at most ``max_rows`` rows (seeded sample)."""
    if len(frame) > max_rows:
        frame = frame.sample(max_rows, random_state=seed)
    contrib = np.abs(model.contributions(frame)[:, :-1]).mean(axis=0)
    return dict(zip(model.feature_names, (float(c) for c in contrib), strict=True))


def _on_pixels(x: np.ndarray, y: np.ndarray, pixels: int = 2_000) -> tuple[np.ndarray, np.ndarray]:
    """The points of a curve over [0, 1] in ``x`` (ordered in ``x``) that a plot ``pixels`` wide
    draws: in each column its first and last point and the first at its lowest and highest ``y``
    (min-max decimation), at most four a column. A curve has two corners per distinct score of a
    positive row: on a pooled month of a fleet that fails often, millions, and matplotlib keeps
    several copies of each."""
    column = np.round(x * pixels)
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[starts[1:], len(x)] - 1
    of = np.repeat(np.arange(len(starts)), ends - starts + 1)
    keep = np.zeros(len(x), dtype=bool)
    keep[starts] = keep[ends] = True
    for extreme in (np.minimum, np.maximum):
        at = np.flatnonzero(y == extreme.reduceat(y, starts)[of])
        keep[at[np.r_[True, of[at][1:] != of[at][:-1]]]] = True
    return x[keep], y[keep]


def _barh(path: Path, values: dict[str, float], title: str, xlabel: str) -> Path:
    top = sorted(values.items(), key=lambda kv: kv[1], reverse=True)[:_TOP][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(top) + 1.5))
    ax.barh([k for k, _ in top], [v for _, v in top], color="#4c72b0")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(
    out_dir: Path,
    scored: ScoredRows,
    predictors: Sequence[str],
    metrics: dict[str, Any],
    model: RiskModel,
    shap_frame: pd.DataFrame,
) -> list[Path]:
    """Write the four plots into ``out_dir`` and return their paths: the curves of ``predictors``
    on the ``scored`` rows; SHAP values explain ``shap_frame``'s rows."""
    paths = []
    fig, ax = plt.subplots(figsize=(6.5, 5))
    if 0 < scored.positives < scored.rows:
        for name in predictors:
            precision, recall = scored.ranking(name).precision_recall()
            ap = metrics[name].get("pr_auc")
            recall, precision = _on_pixels(recall, precision)
            ax.step(recall, precision, where="post", label=f"{name} (PR-AUC {ap:.3f})")
        ax.axhline(scored.positives / scored.rows, color="grey", linestyle=":", label="base rate")
    ax.set_xlabel("recall (rows)")
    ax.set_ylabel("precision (rows)")
    ax.set_title("Precision-recall, model vs baselines")
    ax.legend(loc="upper right")
    fig.tight_layout()
    paths.append(out_dir / "pr_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    horizon = model.horizon_minutes
    bins = np.linspace(0, horizon, 13)
    for name in predictors:
        leads = metrics[name].get("lead_minutes") or []
        if leads:
            ax.hist(leads, bins=bins, alpha=0.5, label=f"{name} (n={len(leads)})")
    ax.set_xlabel("lead time: minutes from first alert to failure")
    ax.set_ylabel("caught failures")
    ax.set_title("Lead time at the false-alarm budget")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "lead_time.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    gain = model.booster.feature_importance(importance_type="gain")
    paths.append(
        _barh(
            out_dir / "importance_gain.png",
            dict(zip(model.feature_names, map(float, gain), strict=True)),
            "Feature importance (trees' total gain)",
            "gain",
        )
    )
    paths.append(
        _barh(
            out_dir / "importance_shap.png",
            shap_importance(model, shap_frame),
            "Feature importance (mean |SHAP|, trees and linear prior)",
            "mean |contribution| (log-odds)",
        )
    )
    return paths
