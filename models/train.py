"""Training: LightGBM with early stopping, calibration, a budget threshold and the baselines.

Recipe (each step on the time split of :mod:`foreshock.models.splits`, nothing shuffled):

1. The logistic baseline (:class:`foreshock.models.baselines.LogisticBaseline`), fitted on its own best
   training rows (10 negatives per positive, none censored). It is both the baseline the model
   is judged against and the model's *linear prior*.
2. LightGBM binary classifier on train rows, boosted from :data:`PRIOR_WEIGHT` times the
   baseline's log-odds (LightGBM ``init_score``) rather than from the base rate, when that beats
   trees alone on validation and its margin still calibrates (:func:`fit_with_prior`). A tree's score
   is flat past its last split, so harmless single-bit ECC bursts scored as high as foreshocks
   twice as strong; the linear part keeps rising with the count. Of the weights 0.1, 0.2, 0.3
   and 1.0, 0.3 had the best validation PR-AUC (llama3, 14 days: 0.274 against 0.263-0.271; 0
   gave 0.266); on pools of unseen seeds it took the failures caught at 1 false alarm per 1,000
   node-days from 175 to 253 on infinitehbd and from 337 to 359 on llama3 (models/README.md;
   measured before constraints.txt pinned the libraries).
   Small trees (see :data:`DEFAULT_PARAMS`; the rows per leaf grow with the training rows,
   :func:`min_leaf_rows`), monotone in every evidence feature (:func:`monotone_directions`),
   binned with bounds in the tails (:func:`tail_bin_bounds`), and the iterations kept are
   those with the best validation average precision, at least :data:`MIN_ROUNDS` of them (a
   noisy validation curve used to stop after ~7 trees). Every negative is kept and left
   unweighted by default: subsampling to 10 per positive and ``scale_pos_weight =
   sqrt(neg/pos)`` both lowered validation PR-AUC (the negatives are what teach the trees that
   workload swings and false-alarm transients are harmless).
   ``train --negative-rate`` thins the negatives far from any failure, weighted, for very large
   frames (:func:`thin_far_negatives`).
   Training leaves out the negatives that precede a failure by less than ``censor_ms`` (default
   :data:`CENSOR_MS`, 6 h: the longest foreshock in the reference profiles). A node whose fault is
   building hours ahead is not healthy, and teaching the trees that it is taught them to stay
   quiet until the last minutes. Chosen on validation (llama3, 14 days; 0, 6, 12 or 24 h) by the
   failures warned at least 15 min ahead; with the 20-30 min windows it took those from 28 to
   31, and those warned 30 min ahead from 13 to 22, at the same row PR-AUC. Only training rows
   are censored; calibration, the threshold and every metric see all rows, so the probability
   still means "fails within H".
3. Platt calibration of the margin (trees plus prior) on validation rows (a monotone map:
   ranking unchanged).
4. The alert threshold, for the budget (default 1 false alarm per 1,000 node-days; alert
   episodes clear after 30 quiet minutes): on the validation period and ``folds - 1`` blocks of
   the training period, each scored by a model that never saw it (:mod:`foreshock.models.folds`),
   the lowest threshold at and above which a 90 % upper bound on the rate of false-alarm
   episodes stays within the budget (:func:`foreshock.models.alerting.budget_threshold`).
   The same procedure, on the same folds, sets the baselines' thresholds, so every predictor
   spends the same budget.
5. Metrics of model and baselines on validation, test, and test restricted to held-out nodes.

With a Dask scheduler address, step 2 runs through ``lightgbm.dask`` on that cluster: a fixed
number of rounds, then the best iteration is chosen on validation (early stopping after the fact,
since ``lightgbm.dask`` cannot stop early); the rest is identical.
"""

from __future__ import annotations

import json
import math
import pickle
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

from foreshock.features.default_set import RISK_DIRECTIONS
from foreshock.features.table import release_freed_memory
from foreshock.models.alerting import ALERT_CLEAR_MS, BUDGET_CONFIDENCE, BudgetChoice, EvalRows
from foreshock.models.artifact import RiskModel
from foreshock.models.baselines import LogisticBaseline, one_blas_thread, rule_scores
from foreshock.models.evaluate import (
    PREDICTORS,
    SharedLogOdds,
    predictor_metrics,
    rule_block_scores,
    scorers_of,
    write_outputs,
)
from foreshock.models.folds import (
    FOLDS,
    Fold,
    choose_thresholds,
    fold_outside,
    out_of_fold,
    time_folds,
    training_blocks,
)
from foreshock.models.frame import (
    FeatureBlock,
    FeatureRows,
    LabelledData,
    Scorer,
    TableOnDask,
    build_labelled,
    concat_compact,
)
from foreshock.models.ranking import average_precision
from foreshock.models.scored import HeldScores
from foreshock.models.splits import make_split

__all__ = [
    "DEFAULT_PARAMS",
    "min_leaf_rows",
    "monotone_directions",
    "tail_bin_bounds",
    "forced_bins_file",
    "CENSOR_MS",
    "train_from_dataset",
    "train_on",
    "fit",
    "Fitted",
    "score_parts",
    "training_metrics",
    "model_card",
    "censor_before_failures",
    "thin_far_negatives",
    "booster_rows",
    "fit_booster",
    "fit_with_prior",
    "fit_logistic_baseline",
    "PriorChoice",
    "log_odds",
    "fold_log_odds",
    "fold_logistic_baselines",
    "fold_logistic_rows",
    "fold_models",
    "fold_training_rows",
    "choose_prior_weight",
    "platt_calibration",
]

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "binary",
    # ~250 failure episodes, most of them with no precursor at all: small, heavily populated
    # leaves and half the features per tree, or the trees learn the workload gauges of the
    # training period's failing nodes (chosen on validation, see models/README.md)
    "learning_rate": 0.05,
    "num_leaves": 4,
    "max_bin": 63,
    "min_child_samples": 300,  # the floor: train_on raises it with the rows (min_leaf_rows)
    "colsample_bytree": 0.5,
    "reg_lambda": 1.0,
    "n_jobs": 1,  # OpenMP threads spin: on a shared, busy machine one thread is the fast choice
    "verbose": -1,
    # every evidence feature is monotone (monotone_directions): "intermediate" keeps more of the
    # trees' freedom than "basic" at the same guarantee
    "monotone_constraints_method": "intermediate",
}
MAX_ROUNDS = 1000
MIN_ROUNDS = 50
EARLY_STOPPING_ROUNDS = 40
# the logistic baseline keeps its own best recipe (10 negatives per positive: validation PR-AUC
# 0.177 against 0.158 on every negative, llama3 512 nodes), so the model is judged against it
LOGISTIC_NEGATIVES_PER_POSITIVE = 10.0
CENSOR_MS = 6 * 3_600_000
# thin_far_negatives: a negative this far from any failure (ahead) and any repair (behind) is
# "far", and the trees may see a share of such rows, weighted (train --negative-rate)
FAR_FROM_FAILURE_MS = 24 * 3_600_000
THIN_BLOCK_ROWS = 1 << 20  # thin_far_negatives judges the rows a block at a time
WEIGHT = "_weight"
ROW = "_row"  # an evaluated row's place in the labelled frame (score_parts)
PRIOR_WEIGHT = 0.3
# Platt's slope is kept at least this (a monotone map); a margin that needs the floor does not
# calibrate, and fit_with_prior does not choose it
MIN_PLATT_SLOPE = 1e-6
DASK_ROUNDS = 200
# a leaf holds at least this share of the training rows, and never fewer than the 300 of
# DEFAULT_PARAMS (five hours of one node at one row a minute). A rare cause must be able to have
# a leaf of its own: in the 14-day llama3 training period, 195 rows of four thermal foreshocks
# show a GPU-temperature spread above 10 degrees, beside 137 healthy rows; the 2,392 rows of the
# rule before (1 in 2,000) could not hold them apart. Small leaves once learned noise (500 rows,
# unconstrained trees, raised 7 false alarms in 974 node-days on another seed); what 300-row
# leaves under the monotone constraints (:func:`monotone_directions`) spend is in models/README.md
MIN_LEAF_SHARE = 1 / 16_000


# LightGBM bins each feature into max_bin bins holding about as many rows each, so the top bin
# of a gauge whose evidence lives in its rarest rows starts where the healthy rows end: on the
# 14-day llama3 set the highest split the GPU-temperature spread allowed was 6.5 degrees, under
# the harmless thermal transients (up to 14 degrees) and far under the foreshocks. (Integer counts
# bin by their distinct values and were not cut short: single-bit ECC's top bin starts past 390
# errors in 10 min.) Bounds forced at these quantiles of the training rows, in both tails, let a
# split fall there.
TAIL_QUANTILES = (1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)


def tail_bin_bounds(x: pd.DataFrame | FeatureRows, names: list[str] | None = None) -> list[dict[str, Any]]:
    """LightGBM's forced bins (``forcedbins_filename``'s content): for every feature of ``x``
    (a frame's ``names``, default all its columns, or :class:`~foreshock.models.frame.FeatureRows`)
    with a finite value, bin bounds at :data:`TAIL_QUANTILES` of its float32 values and at their
    mirror images (1 - q), as ``numpy.quantile`` gives them. LightGBM fills the rest of
    ``max_bin`` as usual. ``x`` is read a block at a time: only each feature's values in the
    outer :data:`TAIL_QUANTILES` share of either tail are kept (:class:`_Tails`)."""
    rows = _feature_rows(x, names)
    qs = [*TAIL_QUANTILES, *(1.0 - q for q in TAIL_QUANTILES)]
    tails = [_Tails(int((len(rows) - 1) * max(TAIL_QUANTILES)) + 2) for _ in rows.names]
    for block in rows.blocks():
        for j, tail in enumerate(tails):
            tail.add(block[:, j].astype(np.float64))
    return [
        {"feature": i, "bin_upper_bound": np.unique([tail.quantile(q) for q in qs]).tolist()}
        for i, tail in enumerate(tails)
        if tail.count
    ]


class _Tails:
    """The ``keep`` smallest and largest finite values seen of one feature, and how many finite
    values there were: enough for ``numpy.quantile``'s (linear) quantiles within ``keep - 2``
    order statistics of either end, bit for bit, without holding every value."""

    def __init__(self, keep: int) -> None:
        self.keep, self.count = keep, 0
        self.low = self.high = np.empty(0)

    def add(self, values: np.ndarray) -> None:
        values = values[np.isfinite(values)]
        self.count += values.size
        k = self.keep
        if self.low.size >= k:  # a value past the k-th kept one cannot enter
            values_low, values_high = values[values <= self.low[k - 1]], values[values >= self.high[-k]]
        else:
            values_low = values_high = values
        self.low = np.sort(np.concatenate([self.low, values_low]))[:k]
        self.high = np.sort(np.concatenate([self.high, values_high]))[-k:]

    def _order_statistic(self, i: int) -> float:
        return float(self.low[i] if i < self.low.size else self.high[i - (self.count - self.high.size)])

    def quantile(self, q: float) -> float:
        at = (self.count - 1) * q  # numpy's 'linear' method
        below = math.floor(at)
        a = self._order_statistic(min(below, self.count - 1))
        b = self._order_statistic(min(below + 1, self.count - 1))
        gamma = at - below
        return b - (b - a) * (1 - gamma) if gamma >= 0.5 else a + (b - a) * gamma


@contextmanager
def forced_bins_file(bins: list[dict[str, Any]]) -> Iterator[str]:
    """The path of a temporary file holding ``bins`` (:func:`tail_bin_bounds`): LightGBM's
    ``forcedbins_filename``, which it reads when it bins a dataset."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "forced_bins.json"
        path.write_text(json.dumps(bins))
        yield str(path)


def monotone_directions(names: list[str]) -> list[int]:
    """LightGBM's ``monotone_constraints`` for these columns: each default feature's
    :func:`foreshock.features.default_set.risk_direction`, 0 (free) for any other column.

    A tree may not lower a node's risk for more errors, a hotter GPU or a slower clock, so
    leaves small enough to hold one failure cause (the thermal foreshocks of a training period
    are a few hours of rows) cannot turn a chance dip in a count into lower risk."""
    return [RISK_DIRECTIONS.get(n, 0) for n in names]


def min_leaf_rows(training_rows: int) -> int:
    """LightGBM's ``min_child_samples`` for this many training rows (see :data:`MIN_LEAF_SHARE`)."""
    return max(int(DEFAULT_PARAMS["min_child_samples"]), round(training_rows * MIN_LEAF_SHARE))


def _trim(booster: lgb.Booster, iterations: int) -> lgb.Booster:
    return lgb.Booster(model_str=booster.model_to_string(num_iteration=iterations))


def _best_iteration(history: list[float]) -> int:
    """1-based iteration with the highest validation AP among those at or after
    :data:`MIN_ROUNDS` (among all when fewer were run)."""
    first = min(MIN_ROUNDS, len(history)) - 1
    return first + int(np.argmax(history[first:])) + 1


def _stop_after(history: list[float]):
    """LightGBM callback: stop once :data:`MIN_ROUNDS` are done and the best iteration is
    :data:`EARLY_STOPPING_ROUNDS` old (so validation noise cannot stop training after a handful
    of trees)."""

    def callback(env: lgb.callback.CallbackEnv) -> None:
        history.append(env.evaluation_result_list[0][2])
        done = env.iteration + 1
        if done >= MIN_ROUNDS and done - _best_iteration(history) >= EARLY_STOPPING_ROUNDS:
            raise lgb.callback.EarlyStopException(done - 1, env.evaluation_result_list)

    callback.order = 30  # type: ignore[attr-defined]
    return callback


_BOOSTER_FITTED: ContextVar[Callable[[], None] | None] = ContextVar("booster_fitted", default=None)


@contextmanager
def _counting_boosters(progress: Callable[[str, int, int], None] | None, total: int) -> Iterator[None]:
    """Tell ``progress`` of each tree model :func:`fit_booster` finishes inside the block (the
    recipe fits ``total``: the prior's candidates, then a model per threshold fold)."""
    if progress is None:
        yield
        return
    done = 0

    def one() -> None:
        nonlocal done
        done += 1
        progress("train: tree models", done, max(total, done))

    progress("train: tree models", 0, total)
    token = _BOOSTER_FITTED.set(one)
    try:
        yield
    finally:
        _BOOSTER_FITTED.reset(token)


def fit_booster(
    x_train: pd.DataFrame | FeatureRows,
    y_train: np.ndarray,
    x_val: pd.DataFrame | FeatureRows | None,
    y_val: np.ndarray | None,
    params: dict[str, Any],
    dask_address: str | None = None,
    init: tuple[np.ndarray, np.ndarray | None] | None = None,
    rounds: int | None = None,
    weight: np.ndarray | None = None,
    names: list[str] | None = None,
    val_weight: np.ndarray | None = None,
    bins: list[dict[str, Any]] | None = None,
) -> lgb.Booster:
    """Fit, then keep the iterations with the best validation average precision (at least
    :data:`MIN_ROUNDS` of them); returns a booster holding only those iterations. With
    ``rounds``, exactly that many iterations and no validation (``x_val``, ``y_val`` unused):
    a fold model (:mod:`foreshock.models.folds`) grows as many trees as the model did.

    ``init`` is the log-odds the trees start from on the training and validation rows
    (LightGBM's ``init_score``; validation is judged on it plus the trees). Without it LightGBM
    starts from the training base rate. ``weight`` and ``val_weight``: each training and validation
    row's weight (:func:`thin_far_negatives`). ``x_train`` and ``x_val``: the rows' features, as
    :class:`~foreshock.models.frame.FeatureRows` or a frame whose ``names`` columns are features
    (default: every column). ``bins``: LightGBM's forced bins (default :func:`tail_bin_bounds`
    of ``x_train``; each costs a pass over the rows' features, and the recipe's models share one).

    LightGBM bins the rows as it reads them, a block of float32 rows at a time
    (:class:`~foreshock.models.frame.FeatureRows`): no step holds a matrix of every row. With a
    :class:`~foreshock.models.frame.TableOnDask` address the trees grow through ``lightgbm.dask``
    on rows the workers read from the feature table themselves (:func:`_rows_on_workers`)."""
    train = _feature_rows(x_train, names)
    val = None if x_val is None else _feature_rows(x_val, train.names)
    bins = tail_bin_bounds(train) if bins is None else bins
    booster = _fit_booster(
        train, y_train, val, y_val, params, dask_address, init, rounds, weight, val_weight, bins
    )
    fitted = _BOOSTER_FITTED.get()
    if fitted is not None:
        fitted()
    return booster


def _fit_booster(
    x_train: FeatureRows,
    y_train: np.ndarray,
    x_val: FeatureRows | None,
    y_val: np.ndarray | None,
    params: dict[str, Any],
    dask_address: str | None = None,
    init: tuple[np.ndarray, np.ndarray | None] | None = None,
    rounds: int | None = None,
    weight: np.ndarray | None = None,
    val_weight: np.ndarray | None = None,
    bins: list[dict[str, Any]] | None = None,
) -> lgb.Booster:
    init_train, init_val = init if init is not None else (None, None)
    names = x_train.names
    if dask_address is None:
        history: list[float] = []
        judged = rounds is None
        with forced_bins_file(bins) as path:
            booster = lgb.train(
                {**params, "metric": "average_precision", "forcedbins_filename": path},
                _Dataset(x_train, y_train, weight=weight, init_score=init_train, feature_name=names),
                num_boost_round=MAX_ROUNDS if judged else rounds,
                valid_sets=[_Dataset(x_val, y_val, weight=_valid_weight(y_val, weight, val_weight),
                                     init_score=init_val, feature_name=names)]
                if judged
                else [],
                callbacks=[_stop_after(history)] if judged else [],
            )
        if judged:
            return _trim(booster, _best_iteration(history))
        booster.free_dataset()  # the rows binned for training (a byte per feature a row): scoring needs none
        return booster
    from distributed import Client
    from lightgbm.dask import DaskLGBMClassifier

    with Client(dask_address) as client:
        train = _rows_on_workers(client, dask_address, x_train, y_train, weight, init_train)
        local = {k: v for k, v in params.items() if k != "n_jobs"}  # lightgbm.dask sets threads per worker
        local.setdefault("n_estimators", DASK_ROUNDS)
        if rounds is not None:
            local["n_estimators"] = rounds
        # each worker builds its own bins: the bounds file must be at the same path on every one
        path = str(Path(tempfile.gettempdir()) / f"foreshock-forced-bins-{uuid.uuid4().hex}.json")
        client.run(_write_text, path, json.dumps(bins))
        try:
            clf = DaskLGBMClassifier(client=client, forcedbins_filename=path, **local)
            clf.fit(
                train[names],
                train["_label"],
                sample_weight=None if weight is None else train["_weight"],
                init_score=None if init_train is None else train["_init"],
            )
        finally:
            client.run(_remove, path)
        booster = clf.booster_
    if rounds is not None:
        return booster
    start = 0.0 if init_val is None else init_val
    curve = [
        average_precision(y_val, start + predict_blocks(booster, x_val, num_iteration=k), val_weight)
        for k in range(1, booster.current_iteration() + 1)
    ]
    return _trim(booster, _best_iteration(curve))


class _Dataset(lgb.Dataset):
    """A ``lightgbm.Dataset`` that hands the library every parameter when it bins rows read a
    batch at a time (a ``lightgbm.Sequence``), as it does for one matrix. Its own ``get_params``
    keeps only the dataset-level ones there, and the bins then differ: ``feature_pre_filter``
    judges which features a leaf could ever split by the default ``min_data_in_leaf`` instead of
    ours, keeps features the trees cannot use, and ``colsample_bytree`` draws among those."""

    def get_params(self) -> dict[str, Any]:
        return dict(self.params or {})

    def _Dataset__sample(
        self, seqs: list[lgb.Sequence], total_nrow: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """LightGBM's sample of the rows it sets the bins by (``lightgbm.Dataset.__sample``, which
        this overrides): the same rows, read a block at a time (:meth:`FeatureRows.take`), where
        the library asks for them a row at a time (200,000 Python calls a fit by default). Each
        feature's sampled values, leaving out zeros, and the sampled rows they come from."""
        (features,) = seqs  # _fit_booster hands LightGBM one FeatureRows
        sampled = features.take(self._create_sample_indices(total_nrow=total_nrow))
        rows = np.arange(len(sampled), dtype=np.int32)
        kept = [(np.abs(column) > lgb.basic.ZERO_THRESHOLD) | np.isnan(column) for column in sampled.T]
        return [column[k] for column, k in zip(sampled.T, kept, strict=True)], [rows[k] for k in kept]


def _valid_weight(
    y_val: np.ndarray | None, weight: np.ndarray | None, val_weight: np.ndarray | None
) -> np.ndarray | None:
    """The validation rows' weights when the training rows are weighted: twice ``val_weight``
    (1 for every row without it), which leaves average precision as it is. A validation set
    LightGBM bins by reference to weighted training rows, read a batch at a time, starts with every
    weight 0 (its average precision is then 1 whatever the trees), and LightGBM takes weights of 1
    for none at all."""
    if y_val is None or (weight is None and val_weight is None):
        return None
    return 2.0 * (np.ones(len(y_val)) if val_weight is None else val_weight)


def _feature_rows(x: pd.DataFrame | FeatureRows, names: list[str] | None) -> FeatureRows:
    """``x`` as :class:`~foreshock.models.frame.FeatureRows`: a frame's ``names`` columns
    (default: all) are its features."""
    return x if isinstance(x, FeatureRows) else FeatureRows(x, list(x.columns) if names is None else names)


def predict_blocks(booster: lgb.Booster, x: FeatureRows, **kwargs: Any) -> np.ndarray:
    """``booster``'s raw scores of ``x``, a block of rows at a time (no matrix of every row)."""
    scores = [booster.predict(block, raw_score=True, **kwargs) for block in x.blocks()]
    return np.concatenate(scores) if scores else np.empty(0)


def _rows_on_workers(
    client: Any,
    address: str,
    x: FeatureRows,
    y: np.ndarray,
    weight: np.ndarray | None,
    init: np.ndarray | None,
) -> Any:
    """The training rows as a Dask DataFrame with ``_label`` (and ``_weight``, ``_init``) columns.
    With a :class:`~foreshock.models.frame.TableOnDask` address the workers read the features from
    the feature table, a day per partition; only each row's position, label, weight and init score
    leave this process. Otherwise (features given as a frame) the frame is sent, a part per worker."""
    import dask.dataframe as dd

    extra = pd.DataFrame({"_label": y})
    if weight is not None:
        extra["_weight"] = weight
    if init is not None:
        extra["_init"] = init
    if isinstance(address, TableOnDask):
        return address.rows(x.rows.index.to_numpy(), extra)
    workers = max(1, len(client.scheduler_info()["workers"]))
    features = pd.DataFrame(np.concatenate(list(x.blocks())), columns=x.names)
    return dd.from_pandas(pd.concat([features, extra], axis=1), npartitions=workers)


def _write_text(path: str, text: str) -> None:
    Path(path).write_text(text)


def _remove(path: str) -> None:
    Path(path).unlink(missing_ok=True)


@dataclass(frozen=True)
class PriorChoice:
    """What :func:`fit_with_prior` kept, and what it judged the candidates by on validation."""

    booster: lgb.Booster
    weight: float
    judged: dict[float, dict[str, float]]  # per candidate weight: validation pr_auc and Platt map
    val_margin: np.ndarray  # the kept candidate's margin of every validation row, in val's order
    val_log_odds: np.ndarray  # the prior's log-odds of every validation row, in val's order
    bins: list[dict[str, Any]]  # the forced bins both candidates were binned with


def fit_with_prior(
    train: pd.DataFrame,
    val: pd.DataFrame,
    names: list[str],
    params: dict[str, Any],
    prior: LogisticBaseline,
    prior_weight: float,
    dask_address: str | None = None,
    data: LabelledData | None = None,
    stop: pd.DataFrame | None = None,
    bins: list[dict[str, Any]] | None = None,
) -> PriorChoice:
    """Fit trees alone and, when ``prior_weight`` > 0, trees boosted from ``prior_weight`` times
    ``prior``'s log-odds; keep the one whose margin has the higher validation average precision
    (a tie keeps the trees alone), among those whose margin calibrates (Platt slope above
    :data:`MIN_PLATT_SLOPE`). Returns the booster, its weight, per candidate its validation
    ``pr_auc`` and Platt map (``platt_slope``, ``platt_intercept``: the kept candidate's map is
    the model's calibration), and the validation margin and prior log-odds it judged by, which
    are the model's and the logistic baseline's validation scores before their maps. ``train``
    and ``val`` are rows of ``data``, whose features it reads a block at a time (without
    ``data``: frames whose ``names`` columns are the features); validation's once before the
    trees and once after, for every candidate at once. ``bins``: the forced bins (default:
    :func:`tail_bin_bounds` of the training rows).

    ``stop``: the rows of ``val`` that early stopping judges after every tree (default: all of
    them), with their weights (:func:`thin_far_negatives`): LightGBM sorts them for their average
    precision after each tree, which on a fleet's month of validation rows takes several times as
    long as growing the tree. The candidates are judged and calibrated on all of ``val``.

    Why both: the prior helps where the logistic regression generalises (llama3, 512 nodes, 14
    days: validation PR-AUC 0.272 against 0.266) and hurts where it overfits a short training
    period: on the demo's 48 nodes and 2 days its 10 highest-scored validation rows are all
    negatives. Why calibration too: there the trees built on it can still rank validation a
    little better (PR-AUC 0.049 against 0.045 with the libraries of ``constraints.txt``) while
    their Platt slope falls to its floor, so every probability is the base rate, every node
    scores the same and the mitigator never acts."""
    y_train, y_val = train["label"].to_numpy(), val["label"].to_numpy()
    row_weight = train[WEIGHT].to_numpy() if WEIGHT in train else None
    weights = sorted({0.0, max(prior_weight, 0.0)})
    stop = val if stop is None else stop
    x_train, x_stop = FeatureRows(train, names, data), FeatureRows(stop, names, data)
    y_stop, at = stop["label"].to_numpy(), val.index.get_indexer(stop.index)
    stop_weight = stop[WEIGHT].to_numpy() if WEIGHT in stop else None
    bins = tail_bin_bounds(x_train) if bins is None else bins
    linear_val = log_odds(prior, val, data)
    linear_train = log_odds(prior, train, data) if weights[-1] else None
    fitted: dict[float, lgb.Booster] = {}
    for weight in weights:
        init = None if weight == 0 else (weight * linear_train, weight * linear_val[at])
        fitted[weight] = fit_booster(
            x_train, y_train, x_stop, y_stop, params, dask_address, init=init, weight=row_weight,
            val_weight=stop_weight, bins=bins,
        )
    del linear_train
    margins = tree_margins(fitted, val, names, data)
    judged: dict[float, dict[str, float]] = {}
    for weight, margin in margins.items():
        if weight:
            margin += weight * linear_val
        slope, intercept = platt_calibration(margin, y_val)
        judged[weight] = {
            "pr_auc": average_precision(y_val, margin),
            "platt_slope": slope,
            "platt_intercept": intercept,
        }
    best = choose_prior_weight(judged)
    return PriorChoice(fitted[best], best, judged, margins[best], linear_val, bins)


def tree_margins(
    boosters: dict[Any, lgb.Booster], rows: pd.DataFrame, names: list[str], data: LabelledData | None
) -> dict[Any, np.ndarray]:
    """Each booster's raw scores of ``rows``, float64: rows of ``data``, their features read once
    for all of them a table partition at a time, or (without ``data``) a frame holding its
    ``names`` features."""
    if data is None:
        x = FeatureRows(rows, names)
        return {key: predict_blocks(booster, x) for key, booster in boosters.items()}

    def trees(booster: lgb.Booster) -> Scorer:
        def raw(block: FeatureBlock) -> np.ndarray:
            return booster.predict(block.x, raw_score=True)

        return raw

    return data.scores(rows, {key: trees(booster) for key, booster in boosters.items()})


def log_odds(prior: LogisticBaseline, rows: pd.DataFrame, data: LabelledData | None) -> np.ndarray:
    """``prior``'s log-odds of ``rows``: rows of ``data``, their features read a day at a time, or
    (without ``data``) a frame holding its features."""
    if data is None:
        return prior.frame_log_odds(rows)
    return data.scores(rows, {"prior": _log_odds_scorer(prior)})["prior"]


def _log_odds_scorer(prior: LogisticBaseline) -> Scorer:
    return lambda block: prior.log_odds(block.x)


def choose_prior_weight(judged: dict[float, dict[str, float]]) -> float:
    """The weight of the candidate :func:`fit_with_prior` keeps: the highest validation
    ``pr_auc`` among trees alone (weight 0, always eligible) and the candidates whose
    ``platt_slope`` is above the floor; a tie keeps the smaller weight."""
    eligible = [w for w in sorted(judged) if w == 0 or judged[w]["platt_slope"] > MIN_PLATT_SLOPE]
    return max(eligible, key=lambda w: judged[w]["pr_auc"])


def platt_calibration(margin: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` with ``P = sigmoid(a * margin + b)`` fitted on validation; ``a`` kept positive so
    the map stays monotone even for a model with no skill."""
    with one_blas_thread():  # the map rounds alike on any number of cores
        lr = LogisticRegression(C=1e6, max_iter=1000).fit(margin.reshape(-1, 1), y)
    return max(float(lr.coef_[0, 0]), MIN_PLATT_SLOPE), float(lr.intercept_[0])


def censor_before_failures(frame: pd.DataFrame, censor_ms: int) -> pd.DataFrame:
    """``frame`` without its negatives that lie at most ``censor_ms`` before the node's next
    failure (the ambiguous zone of a foreshock still building up); positives are all kept."""
    if censor_ms <= 0:
        return frame
    ahead = frame["failure_ts"].astype("float64").to_numpy() - frame["ts"].to_numpy(dtype="float64")
    ambiguous = (frame["label"].to_numpy() == 0) & (np.nan_to_num(ahead, nan=np.inf) <= censor_ms)
    return frame.loc[~ambiguous]


def thin_far_negatives(
    rows: pd.DataFrame, rate: float, seed: int, far_ms: int = FAR_FROM_FAILURE_MS
) -> pd.DataFrame:
    """``rows`` keeping a ``rate`` share of the negatives far from any failure (none within
    ``far_ms`` ahead, no return to service within ``far_ms`` behind), each kept one weighted
    ``1 / rate`` in the :data:`WEIGHT` column (1 elsewhere), so the weighted rows still stand for
    every healthy hour. Every other row is kept: positives, the hours before a failure, the hours
    after a repair. Which rows are kept depends only on (node, ts, seed), whatever else the frame
    holds, so fold models and Dask workers thin alike. ``rate`` >= 1 returns ``rows`` unchanged."""
    if rate >= 1.0:
        return rows
    if rate <= 0.0:
        raise ValueError(f"negative_rate must be in (0, 1] (got {rate})")
    far, keep = np.empty(len(rows), dtype=bool), np.empty(len(rows), dtype=bool)
    key = f"{seed % 10**16:016d}"  # pandas' row hash is stable across runs and processes
    for lo in range(0, len(rows), THIN_BLOCK_ROWS):  # the masks' temporaries take 80 bytes a row
        block = rows.iloc[lo:lo + THIN_BLOCK_ROWS]
        ahead = block["failure_ts"].astype("float64").to_numpy() - block["ts"].to_numpy(dtype=np.float64)
        at = slice(lo, lo + len(block))
        far[at] = (
            (block["label"].to_numpy() == 0)
            & (np.nan_to_num(ahead, nan=np.inf) > far_ms)
            & (block["since_return_ms"].to_numpy(dtype=np.int64) > far_ms)
        )
        draw = pd.util.hash_pandas_object(block[["node", "ts"]], index=False, hash_key=key).to_numpy()
        keep[at] = ~far[at] | (draw / 2.0**64 < rate)
    return rows.loc[keep].assign(**{WEIGHT: np.where(far[keep], 1.0 / rate, 1.0)})


def booster_rows(train: pd.DataFrame, *, censor_ms: int, negative_rate: float, seed: int) -> pd.DataFrame:
    """The rows the trees are fitted on: far negatives thinned to ``negative_rate``
    (:func:`thin_far_negatives`), then censored (:func:`censor_before_failures`). Each row's fate
    is its own, so a fold's rows are these rows outside the fold, and the censored copy is of the
    few rows kept, not of every training row."""
    rows = censor_before_failures(thin_far_negatives(train, negative_rate, seed), censor_ms)
    if not rows.index.is_monotonic_increasing:  # FeatureRows reads a table in the frame's order
        rows = rows.sort_index(kind="stable")
    return rows


def _represented(rows: pd.DataFrame) -> int:
    """How many rows ``rows`` stand for: its weights' sum (its length when unweighted)."""
    return round(float(rows[WEIGHT].sum())) if WEIGHT in rows else len(rows)


@dataclass(frozen=True)
class Fitted:
    """What :func:`fit` produced: the complete model and what the metrics report about the fit."""

    model: RiskModel
    logistic: LogisticBaseline
    selection: dict[str, BudgetChoice]  # per predictor: the budget threshold, chosen out of fold
    folds: list[dict[str, Any]]  # per fold: its span, node-days, and each predictor's alarms and catches
    candidates: dict[float, dict[str, float]]  # per prior weight: validation pr_auc and Platt map
    params: dict[str, Any]  # the LightGBM parameters used
    train_rows_used: int
    train_rows_represented: int = 0  # the rows the used ones stand for (thin_far_negatives' weights)
    # every predictor's scores on the validation rows, in their order, as the thresholds saw them:
    # score_parts takes them out rather than score the same rows with the same model again
    val_scores: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def thresholds(self) -> dict[str, float]:
        """Per predictor, the threshold that spends the budget."""
        return {p: c.threshold for p, c in self.selection.items()}


def fit(
    data: LabelledData,
    train: pd.DataFrame,
    val: pd.DataFrame,
    *,
    budget_per_1000_node_days: float = 1.0,
    params: dict[str, Any] | None = None,
    dask_address: str | None = None,
    censor_ms: int = CENSOR_MS,
    clear_ms: int = ALERT_CLEAR_MS,
    seed: int = 0,
    prior_weight: float = PRIOR_WEIGHT,
    folds: int = FOLDS,
    budget_confidence: float = BUDGET_CONFIDENCE,
    negative_rate: float = 1.0,
) -> Fitted:
    """Fit the logistic baseline, the trees (with or without the prior), the calibration and
    every predictor's threshold on the training and validation rows (recipe steps 1-4); the
    thresholds on ``folds`` time blocks scored out of fold (:mod:`foreshock.models.folds`).
    The trees see a ``negative_rate`` share of the negatives far from any failure, weighted
    (:func:`thin_far_negatives`). Once the logistic baseline is fitted, ``fit`` keeps of
    ``train`` only what the fold models draw their rows by (:func:`_drawn_by`), each fold model's
    block of it waiting on disk until its fold models are fitted, and once the last is fitted,
    before its block is read, it lets go of that too: a caller that hands ``train`` over
    (``parts.pop("train")``) frees the training rows, most rows of a fleet's month, while the
    trees are fitted."""
    names = data.feature_names
    for name, part in (("train", train), ("val", val)):
        if part["label"].sum() == 0:
            raise ValueError(f"the {name} period holds no failure: use more nodes or days, or a higher rate")
    rows = booster_rows(train, censor_ms=censor_ms, negative_rate=negative_rate, seed=seed)
    used, represented = len(rows), _represented(rows)
    logistic = fit_logistic_baseline(data, train, seed)
    fold_list = time_folds(train, val, folds)
    with tempfile.TemporaryDirectory(prefix="foreshock-folds-") as folder:
        # the fold models' blocks of the training rows wait on disk, each read back when its fold
        # is scored; until then the training rows are only what the fold models draw rows by
        blocks = {fold: _to_disk(block, Path(folder) / f"block-{fold.index}.pkl")
                  for fold, block in training_blocks(train, fold_list)}
        train = _drawn_by(data, train)
        release_freed_memory()
        params = {
            **DEFAULT_PARAMS,
            "min_child_samples": min_leaf_rows(represented),
            "monotone_constraints": monotone_directions(names),
            "random_state": seed,
            **(params or {}),
        }
        choice = fit_with_prior(
            rows, val, names, params, logistic, prior_weight, dask_address, data=data,
            stop=thin_far_negatives(val, negative_rate, seed),
        )
        booster, weight, candidates, bins = choice.booster, choice.weight, choice.judged, choice.bins
        judged_by = {"margin": choice.val_margin, "log_odds": choice.val_log_odds}  # score_val takes them
        del choice
        kept = candidates[weight]
        unthresholded = RiskModel(
            booster,
            feature_names=names,
            feature_set_hash=data.feature_set_hash,
            threshold=1.0,
            horizon_minutes=data.horizon_ms // 60_000,
            calibration=(kept["platt_slope"], kept["platt_intercept"]),
            prior=logistic,
            prior_weight=weight,
        )
        val_rows = booster_rows(val, censor_ms=censor_ms, negative_rate=negative_rate, seed=seed)
        periods = [(train, rows), (val, val_rows)]
        del train, rows, val_rows  # periods holds them until the last fold model is fitted

        fold_baselines = fold_logistic_baselines(data, periods, fold_list, seed)
        fold_priors = fold_log_odds(data, periods, fold_list, fold_baselines) if weight > 0 else {}

        def fit_fold(fold: Fold) -> Callable[[pd.DataFrame], dict[str, np.ndarray]]:
            score = fold_models(
                data, periods, fold, params, fold_baselines.pop(fold.index),
                fold_priors.pop(fold.index, None), rounds=booster.current_iteration(), prior_weight=weight,
                dask_address=dask_address, bins=bins,
            )
            if fold == fold_list[-2]:  # the last fold model (validation, the last fold, is the model's)
                periods.clear()  # the training rows go before its block is read
                release_freed_memory()
            return score

        val_scores: dict[str, np.ndarray] = {}

        def score_val() -> dict[str, np.ndarray]:  # the scores the candidates were judged by
            val_scores.update(model=unthresholded.calibrated(judged_by.pop("margin")), rules=rule_scores(val),
                              logistic=logistic.probability(judged_by.pop("log_odds")))
            return val_scores

        waiting = []  # each scored fold waits on disk while the next fold model is fitted
        for scored_fold in out_of_fold(fold_list, lambda fold: _from_disk(blocks[fold]), val, score_val,
                                       fit_fold, cadence_ms=data.cadence_ms, clear_ms=clear_ms):
            waiting.append(_to_disk(scored_fold, Path(folder) / f"fold-{scored_fold.fold.index}.pkl"))
            del scored_fold
        scored = [_from_disk(path) for path in waiting]
    selection = choose_thresholds(scored, budget_per_1000_node_days, budget_confidence)
    thresholds = {p: c.threshold for p, c in selection.items()}
    baselines = {
        "rules": {"threshold": thresholds["rules"]},
        "logistic": {**logistic.to_json(), "threshold": thresholds["logistic"]},
    }
    source = {"kind": "train", "dataset_fingerprint": data.fingerprint, "folds": folds,
              **selection["model"].to_json()}
    model = unthresholded.with_threshold(thresholds["model"], baselines=baselines, source=source)
    summaries = [f.summary(thresholds) for f in scored]
    return Fitted(model, logistic, selection, summaries, candidates, params, used, represented, val_scores)


def cut_parts(
    frame: pd.DataFrame, masks: dict[str, np.ndarray], consume: bool = False
) -> dict[str, pd.DataFrame]:
    """``frame.loc[mask]`` for each part, cut a column at a time. With ``consume``, every column of
    ``frame`` but ``_src`` is moved into the parts, dropped from ``frame`` once cut, so that the
    rows are held once and a column, not twice, while they are cut; ``_src`` (each row's place in
    its table day) stays in ``frame`` alone, where :class:`LabelledData` looks it up. A part's
    index, the rows' positions in ``frame``, is int32 when they fit: 4 bytes a row less on a
    fleet's month."""
    columns: dict[str, dict[str, Any]] = {name: {} for name in masks}
    for col in [c for c in frame.columns if not (consume and c == "_src")]:
        values = frame[col].array  # a Series cut by a mask would keep the whole column alive
        for name, mask in masks.items():
            columns[name][col] = values[mask]
        del values
        if consume:
            del frame[col]
    return {name: pd.DataFrame(cols, index=_positions(frame.index[masks[name]]), copy=False)
            for name, cols in columns.items()}


def _positions(index: pd.Index) -> pd.Index:
    """An integer index as int32 when every value fits (positions of a frame under 2**31 rows)."""
    if index.dtype.kind != "i" or (len(index) and (index.min() < 0 or index.max() >= 2**31)):
        return index
    return index.astype(np.int32)


def fold_training_rows(
    periods: list[tuple[pd.DataFrame, pd.DataFrame]], fold: Fold, horizon_ms: int
) -> pd.DataFrame:
    """A fold model's trees' rows out of the ``(rows, their booster_rows)`` periods: those
    :func:`booster_rows` gives of the periods' rows outside the fold
    (:func:`foreshock.models.folds.fold_outside`), taken from the periods' booster rows: the rows
    outside a fold are nearly every row of both periods, never copied."""
    trees = pd.concat([r.loc[fold_outside(r, fold, horizon_ms)] for _, r in periods])
    return trees.sort_index(kind="stable")


def fold_logistic_rows(
    periods: list[tuple[pd.DataFrame, pd.DataFrame]], fold: Fold, horizon_ms: int, seed: int
) -> pd.DataFrame:
    """A fold model's logistic baseline's rows: those :func:`_logistic_rows` gives of the periods'
    rows outside the fold, drawn from their labels."""
    return _logistic_rows([(rows, fold_outside(rows, fold, horizon_ms)) for rows, _ in periods], seed)


def fold_logistic_baselines(
    data: LabelledData, periods: list[tuple[pd.DataFrame, pd.DataFrame]], folds: list[Fold], seed: int
) -> dict[int, LogisticBaseline]:
    """Every fold model's logistic baseline (by fold index; the validation fold's model is the
    trained one), fitted on its rows (:func:`fold_logistic_rows`) before the first fold's trees:
    each fold's draw spans nearly every table day, and the draws of all folds are read in one pass
    (:func:`_fit_logistics`)."""
    folds = [fold for fold in folds if fold.scored_by != "model"]
    rows = [fold_logistic_rows(periods, fold, data.horizon_ms, seed) for fold in folds]
    fitted = _fit_logistics(data, rows, seed)
    return {fold.index: baseline for fold, baseline in zip(folds, fitted, strict=True)}


def _drawn_by(data: LabelledData, train: pd.DataFrame) -> pd.DataFrame:
    """The columns of the training rows a fold model draws its logistic baseline's rows by
    (:func:`fold_training_rows`): node, time and label, and the features when they are the
    frame's own rather than a table's. A third of a row's bytes: the rest of every training row
    waits on disk in the folds' blocks."""
    columns = ["node", "ts", "label"]
    if data.table is None:
        columns += data.feature_names
    return train[columns]


def _logistic_rows(periods: list[tuple[pd.DataFrame, np.ndarray | None]], seed: int) -> pd.DataFrame:
    """The logistic baseline's own best training rows (see the module docstring) out of the
    ``(frame, kept)`` periods' kept rows (every row when ``kept`` is None), taken in turn: every
    positive and a seeded draw of :data:`LOGISTIC_NEGATIVES_PER_POSITIVE` negatives per positive,
    in (node, ts) order. It draws places in the kept rows' labels: the negatives are nearly every
    row, and a fold's kept rows nearly every row of both periods, never copied whole. The draw
    (pandas' sample: a permutation of every negative, eight bytes each) is the largest thing held
    here, so the negatives' places are int32 and the kept rows' places are found only for the
    rows drawn."""
    label = np.concatenate([_kept(frame["label"].to_numpy(), kept) for frame, kept in periods])
    sizes = [len(frame) if kept is None else int(np.count_nonzero(kept)) for frame, kept in periods]
    pos = np.flatnonzero(label == 1)
    n = int(LOGISTIC_NEGATIVES_PER_POSITIVE * len(pos))
    if len(label) - len(pos) <= n:
        return pd.concat([frame if kept is None else frame.loc[kept] for frame, kept in periods])
    neg = _places_of_zeros(label)
    del label
    drawn = pd.Series(neg, copy=False).sample(n, random_state=seed).to_numpy()  # DataFrame.sample's draw
    del neg
    drawn = np.concatenate([pos, drawn])
    bounds = np.cumsum([0, *sizes])
    rows = pd.concat([
        frame.iloc[_kept_places(kept, drawn[(drawn >= lo) & (drawn < hi)] - lo)]
        for (frame, kept), lo, hi in zip(periods, bounds[:-1], bounds[1:], strict=True)
    ])
    return rows.sort_values(["node", "ts"], kind="stable")


def _kept(values: np.ndarray, kept: np.ndarray | None) -> np.ndarray:
    return values if kept is None else values[kept]


def _kept_places(kept: np.ndarray | None, at: np.ndarray) -> np.ndarray:
    """The places in a frame of its ``at``-th kept rows."""
    return at if kept is None else np.flatnonzero(kept)[at]


def _places_of_zeros(label: np.ndarray, block: int = 1 << 24) -> np.ndarray:
    """``np.flatnonzero(label == 0)``, int32 when the places fit, found a block at a time: not an
    int64 place per row."""
    out = np.empty(len(label) - np.count_nonzero(label), dtype=np.int32 if len(label) < 2**31 else np.int64)
    at = 0
    for lo in range(0, len(label), block):
        piece = lo + np.flatnonzero(label[lo : lo + block] == 0)
        out[at : at + len(piece)] = piece
        at += len(piece)
    return out


def fold_log_odds(
    data: LabelledData,
    periods: list[tuple[pd.DataFrame, pd.DataFrame]],
    folds: list[Fold],
    baselines: dict[int, LogisticBaseline],
) -> dict[int, np.ndarray]:
    """Each fold model's prior: its logistic baseline's log-odds of its trees' rows
    (:func:`fold_training_rows`, in their order), what :func:`log_odds` gives them, with each table
    partition read once for all folds (:meth:`LabelledData.subset_scores`): each fold's rows are
    nearly every booster row of both periods; they are read by their place and time alone, unless
    the features are the rows' own columns."""
    rows = pd.concat([booster if data.table is None else booster[["ts"]] for _, booster in periods])
    rows = rows.sort_index(kind="stable")
    subsets = {
        fold.index: (fold_outside(rows, fold, data.horizon_ms), _log_odds_scorer(baselines[fold.index]))
        for fold in folds if fold.index in baselines
    }
    return data.subset_scores(rows, subsets)


def fit_logistic_baseline(data: LabelledData, train: pd.DataFrame, seed: int) -> LogisticBaseline:
    """The logistic baseline of the training rows ``train`` (rows of ``data``): its own best
    sample of them (:func:`_logistic_rows`), the model's prior."""
    return _fit_logistics(data, [_logistic_rows([(train, None)], seed)], seed)[0]


def _fit_logistics(data: LabelledData, row_sets: list[pd.DataFrame], seed: int) -> list[LogisticBaseline]:
    """A logistic baseline fitted on each of ``row_sets`` (rows of ``data``: :func:`_logistic_rows`),
    reading the features of the rows each fits on alone (:meth:`LogisticBaseline.rows_fitted`),
    every table day once for all of them."""
    baselines = [LogisticBaseline(data.feature_names, seed=seed) for _ in row_sets]
    drawn = [rows.iloc[b.rows_fitted(len(rows))] for b, rows in zip(baselines, row_sets, strict=True)]
    return [baseline.fit(rows, rows["label"].to_numpy())
            for baseline, rows in zip(baselines, data.with_features_of(drawn), strict=True)]


def fold_models(
    data: LabelledData,
    periods: list[tuple[pd.DataFrame, pd.DataFrame]],
    fold: Fold,
    params: dict[str, Any],
    logistic: LogisticBaseline,
    prior: np.ndarray | None,
    *,
    rounds: int,
    prior_weight: float,
    dask_address: str | None = None,
    bins: list[dict[str, Any]] | None = None,
) -> Callable[[pd.DataFrame], dict[str, np.ndarray]]:
    """A fold's models (:mod:`foreshock.models.folds`): the recipe's trees on the ``periods``' rows
    outside ``fold`` (:func:`fold_training_rows`) and the fold's ``logistic`` baseline
    (:func:`fold_logistic_baselines`), whose log-odds of those rows (:func:`fold_log_odds`; None
    when ``prior_weight`` is 0) the trees start from, with the model's own choices (``rounds`` trees,
    ``prior_weight``, and the forced ``bins`` it was binned with: the training rows' tails, which
    spares a pass over each fold's rows). Returns how they score a block: every predictor's scores
    on it, in its row order, the trees' margin Platt-calibrated on the block itself. The training
    rows are let go before it returns."""
    names = data.feature_names
    rows = fold_training_rows(periods, fold, data.horizon_ms)
    init = (prior_weight * prior, None) if prior is not None else None
    weight = rows[WEIGHT].to_numpy() if WEIGHT in rows else None
    booster = fit_booster(data.feature_rows(rows), rows["label"].to_numpy(), None, None, params, dask_address,
                          init=init, rounds=rounds, weight=weight, bins=bins)
    del rows, init, weight

    def as_model(calibration: tuple[float, float]) -> RiskModel:
        return RiskModel(booster, feature_names=names, feature_set_hash="fold", threshold=1.0,
                         calibration=calibration, prior=logistic, prior_weight=prior_weight)

    def score(block: pd.DataFrame) -> dict[str, np.ndarray]:
        shared = SharedLogOdds(as_model((1.0, 0.0)), logistic)
        scorers = {"model": shared.margin, "rules": rule_block_scores, "logistic": shared.score}
        scores = data.scores(block, scorers)
        margin = scores["model"]
        calibrated = as_model(platt_calibration(margin, block["label"].to_numpy())).calibrated(margin)
        return {**scores, "model": calibrated}

    return score


def score_parts(
    data: LabelledData, fitted: Fitted, parts: dict[str, pd.DataFrame], cadence_ms: int, clear_ms: int
) -> dict[str, HeldScores]:
    """Every predictor's scores on validation, test and the held-out nodes' test rows (rows of
    ``data``), a table partition at a time; on validation, the scores :func:`fit` kept
    (:attr:`Fitted.val_scores`, taken out of ``fitted``). Each part's rows keep their place in
    ``data`` (:data:`ROW`). Takes the parts out of ``parts``: each is sorted into EvalRows'
    (node, ts) order with its scores a column at a time (:func:`concat_compact`), never held
    twice."""
    scorers = scorers_of(fitted.model, fitted.logistic)
    evaluated: dict[str, HeldScores] = {}
    for part in ("test", "val", "test_unseen_nodes"):
        frame = parts.pop(part)
        if part == "val" and fitted.val_scores:
            scores = {p: fitted.val_scores.pop(p) for p in PREDICTORS}
        else:
            scores = data.scores(frame, {p: scorers[p] for p in PREDICTORS})
        columns = {c: frame[c].array for c in frame.columns}
        columns.update({f"_score_{p}": s for p, s in scores.items()}, **{ROW: frame.index.to_numpy()})
        held = [pd.DataFrame(columns, copy=False)]
        del frame, columns, scores
        rows = EvalRows(concat_compact(held, by_node_ts=True), cadence_ms, clear_ms)
        evaluated[part] = HeldScores(rows, {p: rows.frame[f"_score_{p}"].to_numpy() for p in PREDICTORS})
    return evaluated


def training_metrics(
    data: LabelledData,
    fitted: Fitted,
    evaluated: dict[str, HeldScores],
    split: Any,
    rows_per_part: dict[str, int],
    *,
    budget_per_1000_node_days: float,
    censor_ms: int,
    clear_ms: int,
    distributed: bool,
    negative_rate: float = 1.0,
) -> dict[str, Any]:
    """``metrics.json``: each predictor's figures on test (``by_split``: the other parts), and
    ``_info``: what was trained on and how."""
    metrics: dict[str, Any] = {}
    for p in PREDICTORS:
        per_part = {
            part: predictor_metrics(held, p, fitted.thresholds[p], budget_per_1000_node_days)
            for part, held in evaluated.items()
            if held.rows
        }
        metrics[p] = {**per_part["test"], "by_split": {k: v for k, v in per_part.items() if k != "test"}}
    candidates = fitted.candidates
    metrics["_info"] = {
        "kind": "train",
        "trained_at_ms": int(time.time() * 1000),  # the model's age: the risk service exports it
        "feature_set_hash": data.feature_set_hash,
        "features": len(data.feature_names),
        "horizon_minutes": data.horizon_ms // 60_000,
        "cadence_ms": data.cadence_ms,
        "budget_false_alarms_per_1000_node_days": budget_per_1000_node_days,
        "threshold_selection": {
            **{p: c.to_json() for p, c in fitted.selection.items()},
            "folds": fitted.folds,
        },
        "dataset": {k: data.manifest.get(k) for k in ("profile", "nodes", "seed", "start_ms", "end_ms")},
        "dataset_fingerprint": data.fingerprint,
        "rows": rows_per_part,
        "train_rows_used": fitted.train_rows_used,
        "negative_subsampling": {  # thin_far_negatives: the trees' rows and what they stand for
            "rate": negative_rate,
            "weight": 1.0 / negative_rate,
            "far_from_failure_ms": FAR_FROM_FAILURE_MS,
            "train_rows_represented": fitted.train_rows_represented,
        },
        "censor_ms": censor_ms,
        "alert_clear_ms": clear_ms,
        "prior_weight": fitted.model.prior_weight,
        "prior_val_pr_auc": {f"{w:g}": c["pr_auc"] for w, c in candidates.items()},
        "prior_val_platt_slope": {f"{w:g}": c["platt_slope"] for w, c in candidates.items()},
        "best_iteration": fitted.model.booster.current_iteration(),
        "lgb_params": fitted.params,
        "distributed": distributed,
        "split": split.describe(),
    }
    return metrics


def model_card(metrics: dict[str, Any]) -> dict[str, Any]:
    """The part of ``metrics.json`` a saved model carries: each predictor's test figures and how
    the model was trained."""
    card: dict[str, Any] = {
        p: {k: v for k, v in metrics[p].items() if k not in ("lead_minutes", "by_split")} for p in PREDICTORS
    }
    info = metrics["_info"]
    card["training"] = {
        k: info[k]
        for k in (
            "cadence_ms",
            "dataset_fingerprint",
            "budget_false_alarms_per_1000_node_days",
            "alert_clear_ms",
            "prior_weight",
            "best_iteration",
            "trained_at_ms",
        )
    }
    return card


def train_on(
    data: LabelledData,
    *,
    budget_per_1000_node_days: float = 1.0,
    params: dict[str, Any] | None = None,
    dask_address: str | None = None,
    censor_ms: int = CENSOR_MS,
    clear_ms: int = ALERT_CLEAR_MS,
    seed: int = 0,
    holdout_fraction: float = 0.15,
    prior_weight: float = PRIOR_WEIGHT,
    folds: int = FOLDS,
    budget_confidence: float = BUDGET_CONFIDENCE,
    negative_rate: float = 1.0,
) -> tuple[RiskModel, dict[str, Any], dict[str, HeldScores]]:
    """Split, :func:`fit`, score every part and assemble the metrics. Returns the model (its
    ``metrics`` holding :func:`model_card`), the metrics (``metrics.json`` content) and, per
    evaluated part, its rows and every predictor's scores.

    From a feature table, ``data.frame`` keeps only each row's place in its table day once the
    parts are cut: they hold the rows from then on, and a fleet's month is 85 M rows, 4 GB a copy."""
    frame = data.frame
    split = make_split(frame, data.horizon_ms, holdout_fraction=holdout_fraction)
    masks = split.masks(frame)
    parts = cut_parts(frame, masks, consume=data.table is not None)
    rows_per_part = {name: int(mask.sum()) for name, mask in masks.items()}
    del masks
    if data.table is not None:
        data.frame = frame[["_src"]]
    del frame
    with _on_disk(parts, ("test", "test_unseen_nodes")):
        fitted = fit(
            data,
            parts.pop("train"),  # fit lets go of the training rows once the folds are scored
            parts["val"],
            budget_per_1000_node_days=budget_per_1000_node_days,
            params=params,
            dask_address=dask_address,
            censor_ms=censor_ms,
            clear_ms=clear_ms,
            seed=seed,
            prior_weight=prior_weight,
            folds=folds,
            budget_confidence=budget_confidence,
            negative_rate=negative_rate,
        )
    evaluated = score_parts(data, fitted, parts, data.cadence_ms, clear_ms)
    metrics = training_metrics(
        data,
        fitted,
        evaluated,
        split,
        rows_per_part,
        budget_per_1000_node_days=budget_per_1000_node_days,
        censor_ms=censor_ms,
        clear_ms=clear_ms,
        distributed=dask_address is not None,
        negative_rate=negative_rate,
    )
    fitted.model.metrics = model_card(metrics)
    return fitted.model, metrics, evaluated


@contextmanager
def _on_disk(parts: dict[str, pd.DataFrame], names: tuple[str, ...]) -> Iterator[None]:
    """Hold ``parts``' ``names`` in a temporary folder while the block runs, then put them back:
    the test rows, a fifth of a fleet's month, wait on disk while the models are fitted."""
    with tempfile.TemporaryDirectory(prefix="foreshock-parts-") as folder:
        waiting = {name: _to_disk(parts.pop(name), Path(folder) / f"{name}.pkl") for name in names}
        release_freed_memory()
        yield
        for name, path in waiting.items():
            parts[name] = _from_disk(path)


def _to_disk(obj: Any, path: Path) -> Path:
    """Pickle ``obj`` to ``path`` (a temporary file this process reads back) and return the path."""
    with path.open("wb") as file:
        pickle.dump(obj, file, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _from_disk(path: Path) -> Any:
    """What :func:`_to_disk` put at ``path``."""
    with path.open("rb") as file:
        return pickle.load(file)


def train_from_dataset(
    data_dir: str | Path,
    out_dir: str | Path,
    horizon_minutes: int = 60,
    tracking_uri: str | None = None,
    dask_address: str | None = None,
    *,
    register: bool = True,
    cadence_ms: int = 60_000,
    budget_per_1000_node_days: float = 1.0,
    feature_set: Any = None,
    features: pd.DataFrame | None = None,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    censor_ms: int = CENSOR_MS,
    clear_ms: int = ALERT_CLEAR_MS,
    prior_weight: float = PRIOR_WEIGHT,
    folds: int = FOLDS,
    budget_confidence: float = BUDGET_CONFIDENCE,
    table: str | Path | None = None,
    negative_rate: float = 1.0,
    progress: Callable[[str, int, int], None] | None = None,
) -> RiskModel:
    """Train on a dataset folder; write ``out_dir/model/``, ``metrics.json``, ``report.md`` and
    plots; log the run to MLflow and register the model (unless ``register=False``).

    The features come from ``features`` (a frame), the feature table ``table`` (``foreshock
    features`` wrote it from this dataset) or the dataset's feature cache
    (:func:`foreshock.models.frame.feature_table`). With ``dask_address`` and a table or the
    cache, the trees grow through ``lightgbm.dask`` on rows the workers read from the table.
    ``tracking_uri`` defaults to the embedded store ``sqlite:///<data_dir>/mlflow.db``. The returned
    model's ``version`` is its registry version when registered. ``progress(label, done, total)``
    hears of the features, each tree model fitted, and the outputs.
    """
    out_dir = Path(out_dir)
    data = build_labelled(
        data_dir,
        horizon_minutes * 60_000,
        cadence_ms,
        feature_set=feature_set,
        features=features,
        dask_address=dask_address,
        table=table,
        progress=progress,
    )
    if dask_address is not None and data.table is not None:
        dask_address = TableOnDask(dask_address, data)
    with _counting_boosters(progress, (2 if prior_weight > 0 else 1) + max(0, folds - 1)):
        model, metrics, evaluated = train_on(
            data,
            budget_per_1000_node_days=budget_per_1000_node_days,
            params=params,
            dask_address=dask_address,
            seed=seed,
            censor_ms=censor_ms,
            clear_ms=clear_ms,
            prior_weight=prior_weight,
            folds=folds,
            budget_confidence=budget_confidence,
            negative_rate=negative_rate,
        )
    if register:
        from foreshock.models.registry import log_and_register, sqlite_uri

        tracking_uri = tracking_uri or sqlite_uri(data_dir)
        test_rows = evaluated["test"].eval_rows
        test = test_rows.frame.set_index(ROW)
        registration = log_and_register(
            model,
            tracking_uri=tracking_uri,
            params={
                "horizon_minutes": horizon_minutes,
                "cadence_ms": cadence_ms,
                "seed": seed,
                "censor_ms": censor_ms,
                "alert_clear_ms": clear_ms,
                "prior_weight": model.prior_weight,
                "budget_false_alarms_per_1000_node_days": budget_per_1000_node_days,
                "budget_confidence": budget_confidence,
                "threshold_folds": folds,
                "best_iteration": metrics["_info"]["best_iteration"],
                "distributed": dask_address is not None,
                **{f"lgb_{k}": v for k, v in metrics["_info"]["lgb_params"].items()},
            },
            metrics=_flat_metrics(metrics),
            dataset_fingerprint=data.fingerprint,
            score_on_test=lambda m: average_precision(
                test_rows.label, data.scores(test, {"m": lambda block: m.predict_proba(block.x)})["m"]
            ),
        )
        model.version = registration.version
        metrics["_info"]["registry"] = {
            "version": registration.version,
            "promoted": registration.promoted,
            "previous_champion": registration.previous_champion,
        }
    model.save(out_dir / "model")
    written = write_outputs(out_dir, metrics, evaluated, model, title="Risk model training",
                            shap_frame=_shap_rows(data, evaluated["test"].eval_rows))
    if register:
        from foreshock.models.registry import log_artifacts

        log_artifacts(tracking_uri, registration.run_id, written)
    return model


def _shap_rows(data: LabelledData, rows: EvalRows) -> pd.DataFrame:
    """The rows :func:`foreshock.models.plots.shap_importance` explains, with their features: drawn
    before they are indexed by their place in ``data``, which copies every row drawn from (a
    gigabyte of a fleet's month of test rows and their scores)."""
    from foreshock.models.plots import SHAP_ROWS

    frame = rows.frame
    if len(frame) > SHAP_ROWS:
        frame = frame.sample(SHAP_ROWS, random_state=0)
    return data.with_features(frame.set_index(ROW))


def _flat_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """``<predictor>.<part>.<metric>`` for every numeric scalar (MLflow metric names), and the
    recall at each equal false-alarm rate as ``...recall_at_false_alarm_rate_<rate>``."""
    out: dict[str, float] = {}
    for p in PREDICTORS:
        for part, m in {"test": metrics[p], **metrics[p]["by_split"]}.items():
            for key, value in m.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[f"{p}.{part}.{key}"] = float(value)
            for rate, at in m.get("recall_at_false_alarm_rates", {}).items():
                if at["recall"] is not None:
                    out[f"{p}.{part}.recall_at_false_alarm_rate_{rate}"] = float(at["recall"])
    return out
