"""Out-of-fold scores for the budget threshold: the training history cut into time blocks, each
scored by a model that never saw it.

A budget of one false alarm per 1,000 node-days, judged on one validation period of about a
thousand node-days, rests on one or two alarms: the threshold lands wherever that period's
strongest harmless transient happened to fall, and spends several times its budget on new data.
The budget threshold (:func:`foreshock.models.alerting.budget_threshold`) needs
more node-days scored out of sample, so the whole history before the test period serves:

- the validation period is the last block, scored by the model itself;
- the training period ``[start, val_start - H)`` is cut into ``folds - 1`` blocks of equal time,
  and block k is scored by a *fold model*: the same recipe, with the choices the model made on
  validation (prior weight, number of trees), fitted on the training and validation rows outside
  ``[block start - H, block end + H)``. The purge gaps keep every failure a block's rows look
  ahead to out of the fold model's labels, and every training label's failure out of the block.

Each model's margin is Platt-calibrated on the block it scores, as the model's own is on
validation, so thresholds on probabilities mean the same for all of them. Each block's alert
episodes are counted apart from the other blocks' (:func:`choose_thresholds`): no episode spans
two blocks scored by two models. Blocks before the last are scored by models trained partly on
later weeks; for a false-alarm rate that assumes only that healthy nodes behave alike across the
history, and the test period and unseen datasets check it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from foreshock.features.table import release_freed_memory
from foreshock.models.alerting import (
    DAY_MS,
    EVAL_COLUMNS,
    BudgetChoice,
    EvalRows,
    budget_threshold,
    candidates_of,
)
from foreshock.models.frame import compact_rows, concat_compact

__all__ = ["FOLDS", "Fold", "ScoredFold", "time_folds", "training_blocks", "fold_outside", "out_of_fold",
           "choose_thresholds"]

FOLDS = 4  # the validation period and three blocks of the training period

Scores = dict[str, np.ndarray]


@dataclass(frozen=True)
class Fold:
    """One time block ``[start_ms, end_ms)`` of seen nodes' rows and what scores it."""

    index: int
    start_ms: int
    end_ms: int
    scored_by: str  # "model" (the validation period) or "fold model"


@dataclass
class ScoredFold:
    """A fold's rows (the columns :class:`EvalRows` reads) and every predictor's scores on them."""

    fold: Fold
    rows: EvalRows
    scores: Scores

    def summary(self, thresholds: dict[str, float]) -> dict:
        """Per predictor, what the fold spends and catches at ``thresholds``."""
        out: dict = {"index": self.fold.index, "start_ms": self.fold.start_ms, "end_ms": self.fold.end_ms,
                     "scored_by": self.fold.scored_by, "node_days": self.rows.node_days,
                     "failures": len(self.rows.failures)}
        for p, thr in thresholds.items():
            alert = self.scores[p] >= thr
            out[p] = {"false_alarms": self.rows.episodes(alert)[1],
                      "caught": int(self.rows.caught(alert).sum())}
        return out


def time_folds(train: pd.DataFrame, val: pd.DataFrame, folds: int = FOLDS) -> list[Fold]:
    """``folds - 1`` equal time blocks over ``train``'s span, then ``val``'s span."""
    if folds < 1:
        raise ValueError(f"folds must be at least 1 (got {folds})")
    start, stop = int(train["ts"].min()), int(train["ts"].max()) + 1
    cuts = np.linspace(start, stop, folds).astype(np.int64)
    spans = zip(cuts[:-1], cuts[1:], strict=True)
    blocks = [Fold(i, int(lo), int(hi), "fold model") for i, (lo, hi) in enumerate(spans)]
    return [*blocks, Fold(folds - 1, int(val["ts"].min()), int(val["ts"].max()) + 1, "model")]


def fold_outside(rows: pd.DataFrame, fold: Fold, horizon_ms: int) -> np.ndarray:
    """Which of ``rows`` lie outside the fold and its purge gaps, ``[start - H, end + H)``: the rows
    a fold model may train on."""
    ts = rows["ts"].to_numpy(dtype=np.int64)
    return (ts < fold.start_ms - horizon_ms) | (ts >= fold.end_ms + horizon_ms)


def training_blocks(train: pd.DataFrame, folds: list[Fold]) -> Iterator[tuple[Fold, pd.DataFrame]]:
    """Each fold model's block of ``train`` (every fold of :func:`time_folds` but the validation
    one), in ``train``'s row order: a slice of it when ``train`` is in time order (as a feature
    table's rows are), not a copy."""
    ts = train["ts"].to_numpy(dtype=np.int64)
    in_time_order = bool(np.all(ts[1:] >= ts[:-1]))
    for fold in folds:
        if fold.scored_by == "model":
            continue
        if in_time_order:
            lo, hi = np.searchsorted(ts, [fold.start_ms, fold.end_ms])
            yield fold, train.iloc[lo:hi]
        else:
            yield fold, train.loc[(ts >= fold.start_ms) & (ts < fold.end_ms)]


def out_of_fold(
    folds: list[Fold],
    block_of: Callable[[Fold], pd.DataFrame],
    val: pd.DataFrame,
    score_val: Callable[[], Scores],
    fit_fold: Callable[[Fold], Callable[[pd.DataFrame], Scores]],
    *,
    cadence_ms: int,
    clear_ms: int,
) -> Iterator[ScoredFold]:
    """Every fold's rows with every predictor's out-of-fold scores, a fold at a time, as each is
    scored: a caller can put each away before the next fold model is fitted (on a fleet's month,
    the blocks scored so far are gigabytes beside the training rows that model reads).

    ``folds`` come from :func:`time_folds`; ``block_of(fold)`` gives a fold model's block of the
    training rows (:func:`training_blocks`). ``score_val()`` gives the model's and the baselines'
    scores on ``val`` (in its row order), asked for when the validation fold comes, the last;
    ``fit_fold(fold)`` fits the fold models on the training and validation rows outside the fold
    (:func:`fold_outside`) and returns how they score a block (in its row order). A block is asked
    for once its fold models are fitted: the fit and the block are never in memory together."""
    for fold in folds:
        if fold.scored_by == "model":
            block, scores = val, score_val()
        else:
            score = fit_fold(fold)
            block = block_of(fold)
            scores = score(block)
            del score
        scored = _scored_fold(fold, block, scores, cadence_ms, clear_ms)
        del block, scores
        release_freed_memory()
        yield scored
        del scored  # the caller has what it keeps of it


def _scored_fold(
    fold: Fold, block: pd.DataFrame, scores: Scores, cadence_ms: int, clear_ms: int
) -> ScoredFold:
    """``block``'s rows with their scores, holding only what the threshold counts: their episodes
    and catches (:meth:`EvalRows.counting_only`), never the alarms after a return."""
    columns = {c: block[c].array for c in EVAL_COLUMNS if c in block}
    columns.update({f"_score_{p}": s for p, s in scores.items()})
    kept = [compact_rows(pd.DataFrame(columns, copy=False))]
    del columns
    rows = EvalRows(concat_compact(kept, by_node_ts=True), cadence_ms, clear_ms)
    fold_scores = {p: rows.frame[f"_score_{p}"].to_numpy() for p in scores}
    return ScoredFold(fold, rows.counting_only(), fold_scores)


def choose_thresholds(
    scored: list[ScoredFold], budget_per_1000_node_days: float, confidence: float
) -> dict[str, BudgetChoice]:
    """Each predictor's budget threshold on the folds pooled, each fold's episodes counted apart
    (:func:`~foreshock.models.alerting.budget_threshold` judges them part by part)."""
    node_days = sum(len(f.rows.frame) * f.rows.cadence_ms for f in scored) / DAY_MS
    return {
        p: budget_threshold(lambda p=p: [(f.rows, f.scores[p]) for f in scored],
                            candidates_of(*(f.scores[p] for f in scored)), node_days,
                            budget_per_1000_node_days, confidence)
        for p in scored[0].scores
    }
