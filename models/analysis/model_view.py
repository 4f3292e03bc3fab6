"""What a trained model sees: its training report, recall by cause and SHAP explanations.

:func:`load_report` opens either a ``foreshock train --out`` folder or a registered model
(``models:/foreshock-risk@champion``): both give the model, its ``metrics.json`` and the folder
holding the training report's plots (for a registered model, the run's artifacts downloaded from
MLflow). :func:`test_rows` rebuilds the rows of the run's test period from the dataset, so single
failures can be explained with the model's SHAP values (LightGBM ``pred_contrib`` for the trees,
plus the linear prior's exact terms: :meth:`foreshock.models.artifact.RiskModel.contributions`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from foreshock.models.alerting import EvalRows
from foreshock.models.artifact import RiskModel
from foreshock.models.evaluate import PREDICTORS, clear_ms_of, scores_of
from foreshock.models.frame import build_labelled

__all__ = [
    "ModelReport",
    "load_report",
    "test_rows",
    "recall_by_cause",
    "plot_recall_by_cause",
    "pick_caught_and_missed",
    "plot_explanation",
    "REPORT_PLOTS",
]

REPORT_PLOTS = ("pr_curves.png", "lead_time.png", "importance_gain.png", "importance_shap.png")
"""Plots every training report holds (written by :mod:`foreshock.models.plots`)."""


@dataclass(frozen=True)
class ModelReport:
    """A model with its training metrics and the folder of its training report."""

    model: RiskModel
    metrics: dict[str, Any]
    folder: Path

    def plot(self, name: str) -> Path:
        """Path of one of :data:`REPORT_PLOTS`."""
        path = self.folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing: was this folder written by foreshock train?")
        return path


def load_report(source: str | Path, tracking_uri: str | None = None) -> ModelReport:
    """Open a ``train`` output folder, or a ``models:/`` URI in the registry at ``tracking_uri``."""
    text = str(source)
    if not text.startswith("models:/"):
        folder = Path(text)
        return ModelReport(RiskModel.load(folder), json.loads((folder / "metrics.json").read_text()), folder)
    if tracking_uri is None:
        raise ValueError("a models:/ URI needs a tracking URI")
    import mlflow
    from mlflow.tracking import MlflowClient

    model = RiskModel.load(text, tracking_uri=tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    run_id = client.get_model_version(
        text.removeprefix("models:/").split("@")[0].split("/")[0], model.version
    ).run_id
    # One folder per run, written over by each download: reopening the champion must not pile up copies.
    folder = Path(tempfile.gettempdir()) / f"foreshock-report-{run_id}"
    mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path="", dst_path=str(folder), tracking_uri=tracking_uri
    )
    return ModelReport(model, json.loads((folder / "metrics.json").read_text()), folder)


def test_rows(report: ModelReport, data_dir: str | Path) -> tuple[EvalRows, dict[str, np.ndarray]]:
    """The labelled rows of the run's test period (``ts >= test_start``) and every predictor's scores.

    ``data_dir`` must be the dataset the model was trained on (its fingerprint is checked).
    """
    info = report.metrics["_info"]
    data = build_labelled(data_dir, report.model.horizon_minutes * 60_000, int(info["cadence_ms"]))
    if info.get("dataset_fingerprint") not in (None, data.fingerprint):
        raise ValueError(f"{data_dir} is not the dataset this model was trained on")
    frame = data.frame[data.frame["ts"] >= int(info["split"]["test_start_ms"])]
    frame = data.with_features(frame.sort_values(["node", "ts"], kind="stable"))
    rows = EvalRows(frame, data.cadence_ms, clear_ms_of(report.model))
    return rows, scores_of(report.model, rows.frame)


def recall_by_cause(metrics: dict[str, Any]) -> pd.DataFrame:
    """Recall at the budget per failure cause (rows) and predictor (columns), with failure counts."""
    causes = metrics["model"].get("recall_by_cause") or {}
    table = pd.DataFrame(
        {
            p: {c: v["recall"] for c, v in (metrics[p].get("recall_by_cause") or {}).items()}
            for p in PREDICTORS
        }
    )
    table["failures"] = pd.Series({c: v["failures"] for c, v in causes.items()})
    return table.sort_values(["failures", "model"], ascending=False)


def plot_recall_by_cause(
    metrics: dict[str, Any], title: str = "Recall by failure cause (test period, at the false-alarm budget)"
) -> Figure:
    """Grouped horizontal bars: for each cause, the recall of the model and of each baseline."""
    table = recall_by_cause(metrics)
    fig = Figure(figsize=(8, 0.45 * max(len(table), 1) + 1.6))
    ax = fig.subplots()
    y = np.arange(len(table))[::-1]
    height = 0.8 / len(PREDICTORS)
    for k, p in enumerate(PREDICTORS):
        ax.barh(y + (1 - k) * height, table[p].fillna(0.0), height=height, label=p, color=f"C{k}")
    counts = table["failures"].fillna(0).astype(int)
    ax.set_yticks(y, [f"{c} (n={n})" for c, n in zip(table.index, counts, strict=True)], fontsize=8)
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("recall (share of that cause's failures caught)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def pick_caught_and_missed(rows: EvalRows, score: np.ndarray, threshold: float) -> dict[str, pd.Series]:
    """One caught and one missed failure, each as the row to explain.

    Caught: the failure with the longest lead; its first alerting row. Missed: a detectable
    failure (if any, else any) that never alerted; its highest-scoring row before the failure.
    Keys present only for the kinds found (``"caught"``, ``"missed"``). Each row carries
    ``score`` and ``failure_ts``.
    """
    frame = rows.frame.assign(score=score)
    pos = frame[frame["label"] == 1]
    out: dict[str, pd.Series] = {}
    alerting = pos[pos["score"] >= threshold]
    if len(alerting):
        first = alerting.sort_values("ts").groupby(["node", "failure_ts"], sort=False).head(1)
        out["caught"] = first.loc[(first["failure_ts"] - first["ts"]).idxmax()]
    caught_keys = set(zip(alerting["node"], alerting["failure_ts"], strict=True))
    missed = pos[[k not in caught_keys for k in zip(pos["node"], pos["failure_ts"], strict=True)]]
    if len(missed):
        detectable = missed[missed["detectable"].fillna(False).astype(bool)]
        pool = detectable if len(detectable) else missed
        out["missed"] = pool.loc[pool["score"].idxmax()]
    return out


def plot_explanation(model: RiskModel, row: pd.Series, title: str, k: int = 10) -> Figure:
    """The ``k`` largest SHAP contributions (log-odds) of one row: red pushes risk up, blue down."""
    x = row[model.feature_names].to_frame().T.astype(float)
    contrib = model.contributions(x)[0]
    order = np.argsort(-np.abs(contrib[:-1]))[:k][::-1]
    fig = Figure(figsize=(8, 0.35 * k + 1.8))
    ax = fig.subplots()
    values = contrib[order]
    ax.barh(np.arange(len(order)), values, color=np.where(values > 0, "#c0392b", "#2c7fb8"))
    labels = [f"{model.feature_names[j]} = {x.iloc[0, j]:.3g}" for j in order]
    ax.set_yticks(np.arange(len(order)), labels, fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    lead = (int(row["failure_ts"]) - int(row["ts"])) / 60_000
    ax.set_xlabel(
        f"SHAP contribution (log-odds); bias {contrib[-1]:+.2f}, "
        f"P(fail) = {float(model.predict_proba(x)[0]):.3f}, threshold {model.threshold:.3f}"
    )
    ax.set_title(f"{title}: {row['node']}, {row['cause']}, {lead:.0f} min before the failure", fontsize=10)
    fig.tight_layout()
    return fig
