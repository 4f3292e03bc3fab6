"""Judge the model and the baselines on the same rows, and write what an operator reads.

For each predictor (``model``, ``rules``, ``logistic``) and each part of the data: PR-AUC and
ROC-AUC per row, then the operating point at the threshold chosen for the false-alarm budget
(in training, out of fold; or by ``foreshock calibrate``): recall and precision, false alarms
per 1,000 node-days beside the budget, lead times, recall per failure cause and for detectable
vs undetectable failures (definitions in :mod:`foreshock.models.alerting`), and recall at a few
equal false-alarm rates. :func:`evaluate` applies a trained model and its stored baselines, with
their stored thresholds, to any other dataset, so the budget is tested where it was not tuned.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foreshock.models.alerting import (
    EQUAL_RATES,
    EVAL_COLUMNS,
    after_return,
    operating_point,
    rates_caught,
    sweep,
)
from foreshock.models.artifact import RiskModel
from foreshock.models.baselines import LogisticBaseline, rule_scores
from foreshock.models.frame import (
    FeatureBlock,
    LabelledData,
    LabelledStream,
    Scorer,
    combined_fingerprint,
    open_labelled,
    scores_in_blocks,
)
from foreshock.models.scored import ScoredRows, ScoreSpill, SpilledScores

__all__ = ["PREDICTORS", "SharedLogOdds", "predictor_metrics", "rule_block_scores", "scores_of", "scorers_of",
           "spill_scores", "thresholds_of", "budget_of", "clear_ms_of", "evaluate", "write_outputs"]

PREDICTORS = ("model", "rules", "logistic")


def predictor_metrics(
    scored: ScoredRows, predictor: str, threshold: float, budget_per_1000_node_days: float | None = None
) -> dict[str, Any]:
    """Ranking metrics per row of ``predictor``'s scores plus the operating point at ``threshold``
    and, with the budget the threshold was chosen for, the false alarms spent beside it
    (``budget_spent``: false alarms per 1,000 node-days over the budget), judged a node group at
    a time (:mod:`foreshock.models.scored`)."""
    ranking = scored.ranking(predictor)
    node_days = scored.node_days
    out: dict[str, Any] = {
        "rows": scored.rows,
        "positives": scored.positives,
        "base_rate": scored.positives / scored.rows if scored.rows else None,
        "node_days": node_days,
        "pr_auc": ranking.average_precision() if ranking else None,
        "roc_auc": ranking.roc_auc() if ranking else None,
    }
    candidates = scored.candidates(predictor)
    counts = [rows.threshold_counts(s, threshold) for rows, s in scored.parts(predictor)]
    out.update(operating_point(counts, threshold, scored.cadence_ms))
    if budget_per_1000_node_days is not None:
        out["budget_false_alarms_per_1000_node_days"] = budget_per_1000_node_days
        rate = out["false_alarms_per_1000_node_days"]
        out["budget_spent"] = rate / budget_per_1000_node_days if budget_per_1000_node_days else None
    points = sweep(lambda: scored.parts(predictor), candidates, max(EQUAL_RATES), node_days, scored.window)
    out["recall_at_false_alarm_rates"] = rates_caught(points, out["failures"])
    return out


class SharedLogOdds:
    """The model's and the logistic baseline's scorers of the same blocks, the baseline's log-odds
    of a block computed once for both when the baseline is the model's prior (recipe step 2):
    standardising a block's features costs about half what the trees do. ``score`` reuses the
    log-odds :meth:`margin` found for the same block (:func:`scores_in_blocks` hands every scorer
    the same block in turn); asked alone, it finds them itself."""

    def __init__(self, model: RiskModel, logistic: LogisticBaseline) -> None:
        self.model, self.logistic = model, logistic
        prior = model.prior
        self._is_prior = prior is logistic or (prior is not None and prior.to_json() == logistic.to_json())
        self._last: tuple[FeatureBlock, np.ndarray] | None = None

    def margin(self, block: FeatureBlock) -> np.ndarray:
        """:meth:`RiskModel.margin` of the block's rows."""
        log_odds = self.logistic.log_odds(block.x)
        self._last = (block, log_odds)
        return self.model.margin_of_matrix(block.x, log_odds if self._is_prior else None)

    def probability(self, block: FeatureBlock) -> np.ndarray:
        """:meth:`RiskModel.predict_proba` of the block's rows."""
        return self.model.calibrated(self.margin(block))

    def score(self, block: FeatureBlock) -> np.ndarray:
        """:meth:`LogisticBaseline.score` of the block's rows."""
        last, self._last = self._last, None
        log_odds = last[1] if last is not None and last[0] is block else self.logistic.log_odds(block.x)
        return self.logistic.probability(log_odds)


def rule_block_scores(block: FeatureBlock) -> np.ndarray:
    """:func:`~foreshock.models.baselines.rule_scores` of the block's rows: the rules read their
    evidence, not the features."""
    return rule_scores(block.rows)


def scorers_of(model: RiskModel, logistic: LogisticBaseline | None = None) -> dict[str, Scorer]:
    """The model's and the baselines' scorers, by predictor: the logistic regression stored with
    the model, or ``logistic``."""
    if logistic is None:
        logistic = LogisticBaseline.from_json(model.baselines["logistic"])
    shared = SharedLogOdds(model, logistic)
    return {"model": shared.probability, "rules": rule_block_scores, "logistic": shared.score}


def scores_of(model: RiskModel, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Scores of the model and of the baselines stored with it, for the rows of ``frame``, which
    holds their features (a block of rows at a time, :func:`~foreshock.models.frame.scores_in_blocks`)."""
    return scores_in_blocks(frame, scorers_of(model), model.feature_names)


def thresholds_of(model: RiskModel) -> dict[str, float]:
    """Each predictor's budget threshold, as the model records it (training or ``foreshock calibrate``)."""
    return {
        "model": model.threshold,
        "rules": float(model.baselines["rules"]["threshold"]),
        "logistic": float(model.baselines["logistic"]["threshold"]),
    }


def budget_of(model: RiskModel) -> float | None:
    """The false-alarm budget (per 1,000 node-days) the model's threshold was chosen for: by
    ``foreshock calibrate`` or in training (None for a model that recorded neither)."""
    budget = model.threshold_source.get("budget_false_alarms_per_1000_node_days")
    if budget is None:
        budget = model.metrics.get("training", {}).get("budget_false_alarms_per_1000_node_days")
    return None if budget is None else float(budget)


def clear_ms_of(model: RiskModel) -> int:
    """The quiet time that ends an alert episode, as the model's threshold was chosen with (models
    trained before it was recorded ended an episode at every dip)."""
    return int(model.metrics.get("training", {}).get("alert_clear_ms", 0))


def evaluate(
    model: RiskModel,
    data_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    data: Sequence[LabelledData] | None = None,
    feature_set: Any = None,
    dask_address: str | None = None,
    cadence_ms: int | None = None,
    tables: Sequence[str | Path] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Score every row of one or more other datasets with the model and its baselines; write
    ``metrics.json``, ``report.md`` and plots to ``out_dir``; return the metrics (``metrics.json``'s
    content).

    Each whole dataset is evaluation data (nothing of it was seen in training, by the caller's
    choice). Several datasets are judged as one pool (their nodes kept apart by the dataset's
    name), with each one's own figures under ``by_dataset``: at 1 or 2 false alarms per 1,000
    node-days a dataset of a thousand node-days allows one or two alarms, so which predictor
    leads there turns on a single alert, and a pool of several seeds is the fair comparison.
    ``data`` (one per folder) skips feature computation when the caller already has the frames.
    Otherwise each dataset's features come from its feature table in ``tables`` (one per folder,
    written by ``foreshock features``) or from the dataset's feature cache
    (:func:`foreshock.models.frame.feature_table`; computed on the Dask cluster at ``dask_address``
    when given), and are read and scored 32 Ki rows at a time; what the metrics read of each row
    waits on disk, under ``TMPDIR``, and is judged a node group at a time
    (:mod:`foreshock.models.scored`), so memory does not grow with the rows. ``cadence_ms`` defaults to the
    cadence the model was trained at; a finer one (the service scores every few seconds) measures
    lead times and false alarms closer to what an operator sees, since alerts can start between
    two training rows and a flapping score can open more episodes.
    """
    names = _dataset_names(data_dirs)
    for given, what in ((data, "labelled frames"), (tables, "feature tables")):
        if given is not None and len(given) != len(names):
            raise ValueError(f"{len(given)} {what} for {len(names)} dataset folders")
    cadence_ms = cadence_ms or int(model.metrics.get("training", {}).get("cadence_ms", 60_000))
    pooled = len(names) > 1
    with tempfile.TemporaryDirectory(prefix="foreshock-scored-") as folder:
        spill = ScoreSpill(folder, PREDICTORS, clear_ms_of(model))
        parts: list[_Scored] = []
        cadences = set()
        for i, (name, data_dir) in enumerate(zip(names, data_dirs, strict=True)):
            labelled = data[i] if data is not None else open_labelled(
                data_dir, model.horizon_minutes * 60_000, cadence_ms, feature_set,
                table=tables[i] if tables is not None else None, dask_address=dask_address, progress=progress,
            )
            cadences.add(labelled.cadence_ms)
            parts.append(_score_dataset(model, name, labelled, spill, len(names), progress))
            del labelled  # one dataset's features at a time
        if len(cadences) > 1:
            raise ValueError(f"the datasets' rows come at different cadences: {sorted(cadences)} ms")
        by_dataset = spill.seal(cadences.pop(), names)
        scored = SpilledScores.union([by_dataset[name] for name in names])
        thresholds, budget = thresholds_of(model), budget_of(model)
        steps, judged = len(PREDICTORS) * (1 + (len(names) if pooled else 0)), 0

        def judge(rows: SpilledScores, p: str) -> dict[str, Any]:
            nonlocal judged
            out = predictor_metrics(rows, p, thresholds[p], budget)
            judged += 1
            if progress is not None:
                progress("evaluate: judging the scores", judged, steps)
            return out

        if progress is not None:
            progress("evaluate: judging the scores", 0, steps)
        metrics: dict[str, Any] = {p: judge(scored, p) for p in PREDICTORS}
        if pooled:
            for p in PREDICTORS:
                metrics[p]["by_dataset"] = {name: judge(by_dataset[name], p) for name in names}
        fingerprints = [part.info["fingerprint"] for part in parts]
        metrics["_info"] = {
            "kind": "evaluate",
            "model_version": model.version,
            "feature_set_hash": model.feature_set_hash,
            "horizon_minutes": model.horizon_minutes,
            "datasets": [part.info for part in parts],
            "dataset_fingerprint": combined_fingerprint(fingerprints) if pooled else fingerprints[0],
            "cadence_ms": scored.cadence_ms,
            "alert_clear_ms": scored.clear_ms,
            "budget_false_alarms_per_1000_node_days": budget,
            "threshold_source": model.threshold_source,
        }
        write_outputs(
            out_dir, metrics, {"evaluation": scored}, model, title="Risk model evaluation",
            shap_frame=pd.concat([part.shap_rows for part in parts]),
        )
    return metrics


@dataclass
class _Scored:
    """One dataset of an evaluation, its rows spilled: a sample of its feature rows for the SHAP
    plot, and what it is."""

    shap_rows: pd.DataFrame
    info: dict[str, Any]


def _score_dataset(
    model: RiskModel,
    name: str,
    labelled: LabelledData | LabelledStream,
    spill: ScoreSpill,
    pool_size: int,
    progress: Callable[[str, int, int], None] | None = None,
) -> _Scored:
    """Score one dataset into ``spill`` (:func:`spill_scores`). Its share of the SHAP sample is
    ``SHAP_ROWS / pool_size`` rows, drawn from every chunk."""
    from foreshock.models.plots import SHAP_ROWS

    if labelled.feature_set_hash != model.feature_set_hash:
        raise ValueError(
            f"model was trained on feature set {model.feature_set_hash}, "
            f"dataset {name} has {labelled.feature_set_hash}"
        )
    sample = _Sample(SHAP_ROWS // pool_size)
    spill_scores(model, labelled, spill, name, each=lambda chunk: sample.add(chunk.x, model.feature_names),
                 progress=progress, title=f"evaluate: {name}")
    manifest = {k: labelled.manifest.get(k) for k in ("profile", "nodes", "seed", "start_ms", "end_ms")}
    return _Scored(sample.rows(), {"name": name, **manifest, "fingerprint": labelled.fingerprint})


def spill_scores(
    model: RiskModel,
    labelled: LabelledData | LabelledStream,
    spill: ScoreSpill,
    dataset: str = "",
    *,
    use_labels: bool = True,
    each: Callable[[FeatureBlock], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    title: str = "scoring",
) -> None:
    """Score ``labelled`` with the model and its baselines, a chunk (32 Ki rows of its feature
    table) at a time, and write to ``spill`` what the metrics read: the columns ``EvalRows``
    reads with each predictor's score beside them, as rows of ``dataset``. Without ``use_labels``
    every row is written as a negative. ``each`` sees every chunk once it is written."""
    scorers = scorers_of(model)
    for i, chunk in enumerate(labelled.chunks(), start=1):
        rows = chunk.rows
        if not use_labels:
            rows = rows.assign(label=np.zeros(len(rows), dtype=np.int8))
        spill.add(rows[[c for c in EVAL_COLUMNS if c in rows]].assign(
            after_return=after_return(rows), **scores_in_blocks(chunk, scorers)
        ), dataset=dataset)
        if each is not None:
            each(chunk)
        del chunk, rows
        if progress is not None:
            progress(title, i, labelled.chunk_count)


class _Sample:
    """A seeded uniform sample of ``size`` rows of frames seen one after another: each row draws a
    random key, and the ``size`` smallest keys so far stay."""

    def __init__(self, size: int, seed: int = 0):
        self.size = size
        self._rng = np.random.default_rng(seed)
        self._rows: pd.DataFrame | None = None
        self._keys = np.empty(0)

    def add(self, x: np.ndarray, columns: list[str]) -> None:
        """Draw from the rows of the matrix ``x``, whose columns are ``columns``; only the rows
        drawn are copied, not a day's features."""
        held = len(self._keys)
        keys = np.concatenate([self._keys, self._rng.random(len(x))])
        keep = np.argsort(keys, kind="stable")[: self.size]
        new = pd.DataFrame(x[keep[keep >= held] - held], columns=columns)
        if self._rows is None:
            self._rows = new
        else:  # the rows kept, in the order of their keys, as if both frames were one
            old = keep < held
            at = np.empty(len(keep), dtype=np.int64)
            at[old], at[~old] = np.arange(old.sum()), old.sum() + np.arange((~old).sum())
            self._rows = pd.concat([self._rows.iloc[keep[old]], new]).iloc[at]
        self._keys = keys[keep]

    def rows(self) -> pd.DataFrame:
        return self._rows if self._rows is not None else pd.DataFrame()


def _dataset_names(data_dirs: Sequence[str | Path]) -> list[str]:
    """Each folder's name, numbered when two folders share one (``a``, ``a-2``)."""
    if not data_dirs:
        raise ValueError("no dataset to evaluate on")
    names: list[str] = []
    for d in data_dirs:
        base = Path(d).resolve().name
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


def write_outputs(
    out_dir: str | Path,
    metrics: dict[str, Any],
    parts: dict[str, ScoredRows],
    model: RiskModel,
    title: str,
    shap_frame: pd.DataFrame,
) -> list[Path]:
    """``metrics.json``, the PNG plots and ``report.md`` in ``out_dir``; returns the paths written.

    ``parts`` maps a part name to its scored rows; plots use the first part, and SHAP values
    explain the rows of ``shap_frame``.
    """
    from foreshock.models.plots import write_plots
    from foreshock.models.report import write_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "metrics.json"
    path.write_text(json.dumps(metrics, indent=1, sort_keys=True, default=_json_default))
    name, scored = next(iter(parts.items()))
    plots = write_plots(out_dir, scored, PREDICTORS, metrics, model, shap_frame)
    report = write_report(out_dir, metrics, plots, title=title, plotted_part=name)
    return [path, report, *plots]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value)}")
