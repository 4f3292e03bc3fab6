"""Per-cluster threshold calibration: the budget threshold set on a new cluster's own telemetry,
without retraining (``foreshock calibrate``).

Not the probability's calibration (the Platt map stays as trained): a model trained on one
cluster meets other workloads, other counter backgrounds and other harmless transients on
another, and its threshold spends its false-alarm budget differently there. The operator scores
the new cluster's recent telemetry with the model and sets the threshold by the rule training
uses (:func:`foreshock.models.alerting.budget_threshold`: the lowest threshold at
and above which an upper confidence bound on false-alarm episodes stays within the budget):

- **unlabelled** telemetry (no failure recorded in its node events, or ``use_labels=False``):
  every alert episode counts as a false alarm. That over-counts (a true alert is spent as if
  false), so the threshold can only be stricter than labels would make it;
- **labelled** telemetry (its node events record failures): episodes that reach a failure within
  the horizon are true alerts and are not counted.

A threshold the new cluster's rows do not certify (too few node-days for the bound to fit the
budget: the lowest threshold with no alarm on them) may rise above the trained one, never fall
below it: that no alarm fell in a few days of a cluster says little of its strongest harmless
transients, which another week may bring, while an alarm in them is evidence enough that the
trained threshold is too low.

Only thresholds move: the model's, and the baselines' (so ``foreshock evaluate`` still compares
like with like). The model records where its threshold came from (``threshold_source``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from foreshock.models.alerting import BUDGET_CONFIDENCE, BudgetChoice, budget_threshold
from foreshock.models.artifact import RiskModel
from foreshock.models.evaluate import PREDICTORS, clear_ms_of, spill_scores, thresholds_of
from foreshock.models.frame import LabelledData, LabelledStream
from foreshock.models.scored import ScoredRows, ScoreSpill

__all__ = ["Calibration", "calibrate"]


@dataclass(frozen=True)
class Calibration:
    """The recalibrated model, what its ``threshold_source`` records, each predictor's choice, and
    how many of the calibration rows the model's new threshold alerts on: none when the data's top
    score is itself an alarm the budget cannot afford, a threshold that silences the model
    (unlabelled rows of a short history whose top scores are failures do that), which the operator
    must hear."""

    model: RiskModel
    source: dict[str, Any]
    choices: dict[str, BudgetChoice]
    alerting_rows: int
    thresholds: dict[str, float]
    """Each predictor's threshold now: its choice, or the trained one where that is higher and the
    choice is not certified."""


def calibrate(
    model: RiskModel,
    data: LabelledData | LabelledStream,
    budget_per_1000_node_days: float,
    *,
    confidence: float = BUDGET_CONFIDENCE,
    use_labels: bool = True,
    dataset: str = "",
    progress: Callable[[str, int, int], None] | None = None,
) -> Calibration:
    """Set ``model``'s and its baselines' thresholds for the budget on ``data``'s rows (named
    ``dataset`` in the record). Raises ``ValueError`` when ``data`` was computed with another
    feature set than the model's.

    The rows are scored a chunk at a time and wait on disk, under ``TMPDIR``, a node group at a
    time (:mod:`foreshock.models.scored`), as :func:`~foreshock.models.evaluate.evaluate`'s do:
    a cluster's month calibrates in the memory of a day's."""
    if data.feature_set_hash != model.feature_set_hash:
        raise ValueError(f"model was trained on feature set {model.feature_set_hash}, "
                         f"the calibration data has {data.feature_set_hash}")
    with tempfile.TemporaryDirectory(prefix="foreshock-scored-") as folder:
        spill = ScoreSpill(folder, PREDICTORS, clear_ms_of(model))
        spill_scores(model, data, spill, use_labels=use_labels, progress=progress, title="calibrate: scoring")
        scored = spill.seal(data.cadence_ms, [""])[""]
        choices = {p: _budget_choice(scored, p, budget_per_1000_node_days, confidence) for p in PREDICTORS}
        trained = thresholds_of(model)
        applied = {p: _applied(choices[p], trained[p]) for p in PREDICTORS}
        threshold = applied["model"]
        failures = alerting = 0
        for rows, score in scored.parts("model"):
            failures += len(rows.failures)
            alerting += int(np.count_nonzero(score >= threshold))
    baselines = {b: {**model.baselines[b], "threshold": applied[b]} for b in ("rules", "logistic")}
    source = {
        "kind": "calibrate",
        "labelled": failures > 0,  # without labels, or with none recorded, every episode is counted
        "failures_excluded": failures,
        "dataset": dataset,
        "dataset_fingerprint": data.fingerprint,
        "from_version": model.version,
        "previous_threshold": model.threshold,
        **choices["model"].to_json(),
        "threshold": threshold,
        "kept_previous": threshold != choices["model"].threshold,
    }
    return Calibration(model.with_threshold(threshold, baselines, source), source, choices, alerting, applied)


def _applied(choice: BudgetChoice, trained: float) -> float:
    """The threshold calibration gives a predictor: its choice on the new rows when they certify
    it or it is the higher, else the trained one (see the module docstring)."""
    return choice.threshold if choice.certified else max(choice.threshold, trained)


def _budget_choice(scored: ScoredRows, predictor: str, budget: float, confidence: float) -> BudgetChoice:
    """The budget threshold of ``predictor``'s scores on ``scored``'s rows, judged a node group at
    a time."""
    return budget_threshold(lambda: scored.parts(predictor), scored.candidates(predictor), scored.node_days,
                            budget, confidence, scored.window)
