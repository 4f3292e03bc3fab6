"""Judge the model and the baselines on the same rows, and write what an operator reads.

For each predictor (``model``, ``rules``, ``logistic``) and each part of the data: PR-AUC and
ROC-AUC per row, then the operating point at the threshold chosen on *validation* for the
false-alarm budget (recall and precision, false alarms per 1,000 node-days, lead times, recall
per failure cause and for detectable vs undetectable failures; definitions in
:mod:`models.alerting`), and recall at a few equal false-alarm rates. :func:`evaluate` applies a
trained model and its stored baselines, with their stored thresholds, to any other dataset, so
the budget is tested where it was not tuned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

from models.alerting import EvalRows
from models.artifact import RiskModel
from models.baselines import LogisticBaseline, rule_scores
from models.frame import LabelledData, build_labelled

__all__ = ["PREDICTORS", "predictor_metrics", "scores_of", "clear_ms_of", "evaluate", "write_outputs"]

PREDICTORS = ("model", "rules", "logistic")


def predictor_metrics(rows: EvalRows, score: np.ndarray, threshold: float) -> dict[str, Any]:
    """Ranking metrics per row plus the operating point at ``threshold`` (scores in ``rows`` order)."""
    y = rows.label
    both = 0 < y.sum() < y.size
    out: dict[str, Any] = {
        "rows": int(y.size),
        "positives": int(y.sum()),
        "base_rate": float(y.mean()) if y.size else None,
        "node_days": rows.node_days,
        "pr_auc": float(average_precision_score(y, score)) if both else None,
        "roc_auc": float(roc_auc_score(y, score)) if both else None,
    }
    out.update(rows.at_threshold(score, threshold))
    out["recall_at_false_alarm_rates"] = rows.recall_at_rates(score)
    return out


def scores_of(model: RiskModel, frame) -> dict[str, np.ndarray]:
    """Scores of the model and of the baselines stored with it, for ``frame``'s rows."""
    return {
        "model": model.predict_proba(frame),
        "rules": rule_scores(frame),
        "logistic": LogisticBaseline.from_json(model.baselines["logistic"]).score(frame),
    }


def thresholds_of(model: RiskModel) -> dict[str, float]:
    """Each predictor's budget threshold, as chosen on validation when the model was trained."""
    return {
        "model": model.threshold,
        "rules": float(model.baselines["rules"]["threshold"]),
        "logistic": float(model.baselines["logistic"]["threshold"]),
    }


def clear_ms_of(model: RiskModel) -> int:
    """The quiet time that ends an alert episode, as the model's threshold was chosen with (models
    trained before it was recorded ended an episode at every dip)."""
    return int(model.metrics.get("training", {}).get("alert_clear_ms", 0))


def evaluate(
    model: RiskModel,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    data: LabelledData | None = None,
    feature_set: Any = None,
    dask_address: str | None = None,
    cadence_ms: int | None = None,
) -> dict[str, Any]:
    """Score every row of another dataset with the model and its baselines; write ``metrics.json``,
    ``report.md`` and plots to ``out_dir``; return the metrics (``metrics.json``'s content).

    The whole dataset is the evaluation set (nothing of it was seen in training, by the caller's
    choice of dataset). ``data`` skips feature computation when the caller already has the frame;
    ``dask_address`` computes the features on that Dask cluster. ``cadence_ms`` defaults to the
    cadence the model was trained at; a finer one (the service scores every few seconds) measures
    lead times and false alarms closer to what an operator sees, since alerts can start between
    two training rows and a flapping score can open more episodes.
    """
    if data is None:
        cadence_ms = cadence_ms or int(model.metrics.get("training", {}).get("cadence_ms", 60_000))
        data = build_labelled(
            data_dir,
            model.horizon_minutes * 60_000,
            cadence_ms,
            feature_set=feature_set,
            dask_address=dask_address,
        )
    if data.feature_set_hash != model.feature_set_hash:
        raise ValueError(
            f"model was trained on feature set {model.feature_set_hash}, data has {data.feature_set_hash}"
        )
    rows = EvalRows(data.frame, data.cadence_ms, clear_ms_of(model))
    scores = scores_of(model, rows.frame)
    thresholds = thresholds_of(model)
    metrics: dict[str, Any] = {
        name: predictor_metrics(rows, scores[name], thresholds[name]) for name in PREDICTORS
    }
    metrics["_info"] = {
        "kind": "evaluate",
        "model_version": model.version,
        "feature_set_hash": model.feature_set_hash,
        "horizon_minutes": model.horizon_minutes,
        "dataset": {k: data.manifest.get(k) for k in ("profile", "nodes", "seed", "start_ms", "end_ms")},
        "dataset_fingerprint": data.fingerprint,
        "cadence_ms": data.cadence_ms,
        "alert_clear_ms": rows.clear_ms,
    }
    write_outputs(out_dir, metrics, {"evaluation": (rows, scores)}, model, title="Risk model evaluation")
    return metrics


def write_outputs(
    out_dir: str | Path,
    metrics: dict[str, Any],
    parts: dict[str, tuple[EvalRows, dict]],
    model: RiskModel,
    title: str,
) -> list[Path]:
    """``metrics.json``, the PNG plots and ``report.md`` in ``out_dir``; returns the paths written.

    ``parts`` maps a part name to its rows and per-predictor scores; plots use the first part.
    """
    from models.plots import write_plots
    from models.report import write_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.json"
    path.write_text(json.dumps(metrics, indent=1, sort_keys=True, default=_json_default))
    name, (rows, scores) = next(iter(parts.items()))
    plots = write_plots(out_dir, rows, scores, metrics, model)
    report = write_report(out_dir, metrics, plots, title=title, plotted_part=name)
    return [path, report, *plots]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value)}")
