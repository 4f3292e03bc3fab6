"""Training and evaluation end to end on the small synthetic cluster (no MLflow here)."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

import foreshock.models.train
from foreshock.models.artifact import RiskModel
from foreshock.models.baselines import LogisticBaseline
from foreshock.models.evaluate import SharedLogOdds, evaluate
from foreshock.models.frame import FEATURE_BLOCK_ROWS, FeatureBlock, FeatureRows, scores_in_blocks
from foreshock.models.train import (
    DEFAULT_PARAMS,
    MIN_PLATT_SLOPE,
    MIN_ROUNDS,
    PRIOR_WEIGHT,
    TAIL_QUANTILES,
    WEIGHT,
    choose_prior_weight,
    fit_booster,
    fit_with_prior,
    forced_bins_file,
    min_leaf_rows,
    monotone_directions,
    platt_calibration,
    tail_bin_bounds,
    train_from_dataset,
)

REQUIRED = (
    "pr_auc",
    "roc_auc",
    "recall_at_budget",
    "precision_at_budget",
    "false_alarms_per_1000_node_days",
    "median_lead_minutes",
    "recall_by_cause",
)


@pytest.fixture(scope="module")
def trained(synthetic_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    model = train_from_dataset(
        synthetic_cluster.data_dir, out, features=synthetic_cluster.features, register=False
    )
    return model, out, json.loads((out / "metrics.json").read_text())


def test_train_writes_report_plots_metrics_and_model(trained):
    model, out, metrics = trained
    for name in (
        "report.md",
        "metrics.json",
        "pr_curves.png",
        "lead_time.png",
        "importance_gain.png",
        "importance_shap.png",
        "model/model.txt",
        "model/risk_model.json",
    ):
        assert (out / name).stat().st_size > 0, name
    for predictor in ("model", "rules", "logistic"):
        assert all(k in metrics[predictor] for k in REQUIRED), predictor
        assert set(metrics[predictor]["by_split"]) == {"val", "test_unseen_nodes"}
    report = (out / "report.md").read_text()
    assert "| test | model |" in report and "| test | rules |" in report and "| test | logistic |" in report
    at = metrics["model"]["recall_at_false_alarm_rates"]
    assert set(at) == {"1", "2", "5", "10"} and at["10"]["caught"] >= at["1"]["caught"]
    assert "| model | " + f"{at['1']['recall']:.2f} ({at['1']['caught']}/{at['1']['failures']})" in report
    after = metrics["model"]["false_alarms_after_return"]
    assert 0 <= after <= metrics["model"]["false_alarms"]
    assert f"model {after} of {metrics['model']['false_alarms']}" in report
    assert model.version == "" and 0 < model.threshold <= 1


def test_the_same_data_and_seed_train_the_same_metrics_json(synthetic_cluster, trained, tmp_path):
    _, out, _ = trained
    train_from_dataset(synthetic_cluster.data_dir, tmp_path, features=synthetic_cluster.features,
                       register=False)
    again, first = (json.loads((d / "metrics.json").read_text()) for d in (tmp_path, out))
    assert again["_info"].pop("trained_at_ms") >= first["_info"].pop("trained_at_ms")  # when, not what
    assert again == first

    def trees(folder):  # the booster in LightGBM's text format, less the temporary file it was binned with
        return [line for line in (folder / "model" / "model.txt").read_text().splitlines()
                if not line.startswith("[forcedbins_filename:")]

    assert trees(tmp_path) == trees(out)


def test_a_fold_model_is_fitted_while_the_training_rows_and_the_scored_folds_wait_on_disk(
    synthetic_cluster, tmp_path, monkeypatch
):
    """On a fleet's month the training rows and the blocks scored so far are gigabytes: while a
    fold model is fitted, no scored fold is in memory, and of the training rows only what the fold
    models draw their rows by (features included when they are the frame's own columns); once the
    last is fitted they are let go before its block is read and scored."""
    import gc
    import weakref

    import foreshock.models.folds as folds
    from foreshock.models.folds import ScoredFold

    held: list[int] = []
    training_columns: list[list[str]] = []
    training_rows: list[weakref.ref] = []
    alive_when_scored: list[bool] = []
    fold_models, scored_fold = foreshock.models.train.fold_models, folds._scored_fold

    def counting(data, periods, *args, **kwargs):
        gc.collect()
        held.append(sum(isinstance(o, ScoredFold) for o in gc.get_objects()))
        training_columns.append(list(periods[0][0].columns))
        training_rows.append(weakref.ref(periods[0][0]))
        return fold_models(data, periods, *args, **kwargs)

    def building(fold, *args, **kwargs):
        gc.collect()
        alive_when_scored.append(training_rows[-1]() is not None)
        return scored_fold(fold, *args, **kwargs)

    monkeypatch.setattr(foreshock.models.train, "fold_models", counting)
    monkeypatch.setattr(folds, "_scored_fold", building)
    model = train_from_dataset(
        synthetic_cluster.data_dir, tmp_path, features=synthetic_cluster.features, register=False
    )
    assert held == [0, 0, 0]
    assert training_columns == [["node", "ts", "label", *model.feature_names]] * 3
    assert alive_when_scored == [True, True, False, False]  # the three fold models' blocks, validation


def test_leaf_rows_grow_with_the_training_rows(synthetic_cluster, tmp_path, monkeypatch):
    """Leaves never hold fewer than the floor, and past about five million rows they hold a share
    of them: rows a minute apart are not independent evidence. Training applies the rule and
    records what it used (the share raised here so the small cluster clears the floor)."""
    floor = DEFAULT_PARAMS["min_child_samples"]
    assert min_leaf_rows(10_000) == floor == min_leaf_rows(4_784_602) and min_leaf_rows(48_000_000) == 3_000
    monkeypatch.setattr(foreshock.models.train, "MIN_LEAF_SHARE", 1 / 40)
    data = synthetic_cluster
    train_from_dataset(data.data_dir, tmp_path, features=data.features, register=False)
    info = json.loads((tmp_path / "metrics.json").read_text())["_info"]
    used = info["lgb_params"]["min_child_samples"]
    assert used == round(info["train_rows_used"] / 40) and used > floor


def test_trees_are_boosted_from_the_weighted_logistic_baseline():
    """Where validation reaches past the training rows' range, a tree is flat past its last
    split and the linear prior keeps rising: the trees boosted from the weighted logistic
    baseline win on validation and are kept, and their margin is the trees plus the prior."""
    rng = np.random.default_rng(4)
    a = np.r_[rng.uniform(0, 1, 8000), rng.uniform(0, 2, 4000)]  # validation reaches past training
    x = pd.DataFrame({"a": a, "b": rng.normal(size=a.size)})
    y = (rng.random(len(x)) < 1 / (1 + np.exp(-(4 * x["a"] - 4)))).astype(int)
    frame = x.assign(label=y)
    train, val = frame.iloc[:8000], frame.iloc[8000:]
    prior = LogisticBaseline(["a", "b"]).fit(train, train["label"].to_numpy())
    params = {**DEFAULT_PARAMS, "min_child_samples": 50}
    choice = fit_with_prior(train, val, ["a", "b"], params, prior, PRIOR_WEIGHT)
    weight, judged = choice.weight, choice.judged
    assert weight == PRIOR_WEIGHT and judged[PRIOR_WEIGHT]["pr_auc"] > judged[0.0]["pr_auc"]
    trees = choice.booster.predict(val[["a", "b"]].to_numpy(np.float32), raw_score=True)  # float32, as binned
    margin = trees + PRIOR_WEIGHT * prior.frame_log_odds(val)
    np.testing.assert_array_equal(choice.val_margin, margin)  # what it was judged by is the model's margin
    np.testing.assert_array_equal(choice.val_log_odds, prior.frame_log_odds(val))
    kept_map = platt_calibration(margin, val["label"].to_numpy())
    assert np.allclose(kept_map, (judged[weight]["platt_slope"], judged[weight]["platt_intercept"]))


def test_early_stopping_judges_the_stop_rows_and_the_candidates_all_of_validation(monkeypatch):
    """Given ``stop`` (validation's positives and a weighted tenth of its negatives), the trees
    stop on those rows with their weights, and each candidate's PR-AUC and calibration are still
    those of every validation row."""
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(5)
    x = pd.DataFrame({"a": rng.uniform(0, 1, 12000), "b": rng.normal(size=12000)})
    frame = x.assign(label=(rng.random(len(x)) < 1 / (1 + np.exp(-(6 * x["a"] - 5)))).astype(int))
    train, val = frame.iloc[:8000], frame.iloc[8000:]
    tenth = (val["label"] == 1) | (np.arange(len(val)) % 10 == 0)
    stop = val.loc[tenth].assign(**{WEIGHT: np.where(val.loc[tenth, "label"] == 1, 1.0, 10.0)})
    prior = LogisticBaseline(["a", "b"]).fit(train, train["label"].to_numpy())
    calls = []
    fit = foreshock.models.train._fit_booster
    monkeypatch.setattr(foreshock.models.train, "_fit_booster", lambda *a: calls.append(a) or fit(*a))
    params = {**DEFAULT_PARAMS, "min_child_samples": 50}
    choice = fit_with_prior(train, val, ["a", "b"], params, prior, PRIOR_WEIGHT, stop=stop)
    booster, weight, judged = choice.booster, choice.weight, choice.judged
    assert len(calls) == 2
    for x_val, y_val, init, val_weight in ((c[2], c[3], c[6], c[9]) for c in calls):
        assert len(x_val) == len(y_val) == len(stop) < len(val) / 2
        assert np.array_equal(val_weight, stop[WEIGHT].to_numpy())
        if init is not None:  # the prior's log-odds of the stop rows
            assert np.allclose(init[1], PRIOR_WEIGHT * prior.frame_log_odds(stop))
    margin = booster.predict(val[["a", "b"]], raw_score=True) + weight * prior.frame_log_odds(val)
    assert judged[weight]["pr_auc"] == pytest.approx(average_precision_score(val["label"], margin))
    kept_map = platt_calibration(margin, val["label"].to_numpy())
    assert np.allclose(kept_map, (judged[weight]["platt_slope"], judged[weight]["platt_intercept"]))


def test_training_keeps_the_candidate_validation_chose_and_weight_0_trains_trees_alone(
    trained, synthetic_cluster, tmp_path
):
    """``train`` fits trees alone and trees on the prior, keeps the one :func:`choose_prior_weight`
    picks from their validation figures, and stores the prior it kept: the logistic baseline it
    is compared with. ``prior_weight=0`` fits trees alone."""
    model, _, metrics = trained
    info = metrics["_info"]
    candidates = {
        float(w): {"pr_auc": info["prior_val_pr_auc"][w], "platt_slope": info["prior_val_platt_slope"][w]}
        for w in info["prior_val_pr_auc"]
    }
    assert set(candidates) == {0.0, PRIOR_WEIGHT}
    assert model.prior_weight == info["prior_weight"] == choose_prior_weight(candidates)
    logistic = LogisticBaseline.from_json(model.baselines["logistic"])
    x = model.matrix(synthetic_cluster.features.head(300))
    trees = model.booster.predict(x, raw_score=True)
    assert np.allclose(model.margin(x), trees + model.prior_weight * logistic.log_odds(x))
    alone = train_from_dataset(
        synthetic_cluster.data_dir, tmp_path, features=synthetic_cluster.features, register=False,
        prior_weight=0.0,
    )
    assert alone.prior is None
    info = json.loads((tmp_path / "metrics.json").read_text())["_info"]
    assert info["prior_weight"] == 0 and set(info["prior_val_pr_auc"]) == {"0"}
    assert np.allclose(alone.margin(x), alone.booster.predict(x, raw_score=True))


def _with_prior(model: RiskModel) -> RiskModel:
    """``model``'s trees boosted from its logistic baseline (weight 0.5), whether or not training
    kept the prior: a model whose prior is that baseline."""
    return RiskModel(model.booster, feature_names=model.feature_names,
                     feature_set_hash=model.feature_set_hash, threshold=model.threshold,
                     calibration=model.calibration, baselines=model.baselines,
                     prior=LogisticBaseline.from_json(model.baselines["logistic"]), prior_weight=0.5)


def test_the_model_and_its_baseline_score_a_block_with_one_log_odds_as_each_alone(trained, synthetic_cluster):
    """Scoring rows, the model and the logistic baseline (its prior, or the same numbers read back
    from the model's JSON) share each block's log-odds: their scores are those each gives alone,
    and the baseline asked alone still scores."""
    model = _with_prior(trained[0])
    names = model.feature_names
    rows = synthetic_cluster.features.head(5000)
    for logistic in (model.prior, LogisticBaseline.from_json(model.baselines["logistic"])):
        shared = SharedLogOdds(model, logistic)
        got = scores_in_blocks(rows, {"model": shared.probability, "logistic": shared.score}, names)
        np.testing.assert_array_equal(got["model"], model.predict_proba(rows))
        np.testing.assert_array_equal(got["logistic"], logistic.score(rows))
        assert len(np.unique(got["logistic"])) > 100
        head = FeatureBlock.of(rows.iloc[:10], names)
        np.testing.assert_array_equal(shared.score(head), logistic.score(rows.iloc[:10]))


def test_a_model_scores_with_its_own_prior_beside_another_regression(trained, synthetic_cluster):
    """Log-odds are shared only with the model's own prior: beside another logistic regression,
    or with no prior at all, the model scores as it does alone."""
    with_prior = _with_prior(trained[0])
    rows = synthetic_cluster.features.head(2000)
    prior = with_prior.prior
    other = LogisticBaseline.from_json({**prior.to_json(), "intercept": prior.intercept_ + 3})
    for model in (with_prior, trained[0]):
        shared = SharedLogOdds(model, other)
        scorers = {"model": shared.probability, "logistic": shared.score}
        got = scores_in_blocks(rows, scorers, model.feature_names)
        np.testing.assert_array_equal(got["model"], model.predict_proba(rows))
        np.testing.assert_array_equal(got["logistic"], other.score(rows))


def test_a_prior_that_loses_on_validation_is_dropped():
    """Training keeps the trees on the prior only when they win on validation: a prior that
    points the wrong way (a logistic fit with its coefficients reversed) leaves the trees alone."""
    rng = np.random.default_rng(1)
    x = pd.DataFrame(rng.normal(size=(6000, 3)), columns=["a", "b", "c"])
    frame = x.assign(label=(x["a"] + rng.normal(scale=0.7, size=len(x)) > 1.5).astype(int))
    train, val = frame.iloc[:4000], frame.iloc[4000:]
    fitted = LogisticBaseline(["a", "b", "c"]).fit(train, train["label"].to_numpy())
    reversed_prior = LogisticBaseline.from_json({**fitted.to_json(), "coef": (-fitted.coef_).tolist()})
    params = {**DEFAULT_PARAMS, "min_child_samples": 50}
    choice = fit_with_prior(train, val, ["a", "b", "c"], params, reversed_prior, 1.0)
    booster, weight, judged = choice.booster, choice.weight, choice.judged
    assert weight == 0.0 and judged[0.0]["pr_auc"] > judged[1.0]["pr_auc"]
    assert judged[0.0]["platt_slope"] > 0.5 and booster.current_iteration() >= 1
    margin = booster.predict(val[["a", "b", "c"]], raw_score=True)
    kept_map = platt_calibration(margin, val["label"].to_numpy())
    assert np.allclose(kept_map, (judged[0.0]["platt_slope"], judged[0.0]["platt_intercept"]))


def test_a_prior_whose_margin_does_not_calibrate_is_dropped_even_when_it_ranks_better():
    """The demo's case: trees on an overfitted prior ranked validation a little better (PR-AUC
    0.048 against 0.045; 0.049 since the tail bins) but their Platt slope fell to its floor, so
    every node scored the base rate and the mitigator never acted (figures of `make demo`). Such
    a candidate is not eligible; trees alone always are."""
    floor = MIN_PLATT_SLOPE
    demo = {0.0: {"pr_auc": 0.0452, "platt_slope": 0.477}, 0.3: {"pr_auc": 0.0479, "platt_slope": floor}}
    assert choose_prior_weight(demo) == 0.0
    calibrated = {0.0: {"pr_auc": 0.266, "platt_slope": 0.9}, 0.3: {"pr_auc": 0.272, "platt_slope": 0.8}}
    assert choose_prior_weight(calibrated) == 0.3
    tie = {0.0: {"pr_auc": 0.27, "platt_slope": 1.0}, 0.3: {"pr_auc": 0.27, "platt_slope": 1.0}}
    assert choose_prior_weight(tie) == 0.0
    assert choose_prior_weight({0.0: {"pr_auc": 0.1, "platt_slope": MIN_PLATT_SLOPE}}) == 0.0


def test_tail_bins_let_a_split_fall_where_only_the_rarest_rows_are():
    """LightGBM's bins hold about equal rows, so with 63 of them nothing above the top 1.6 % of
    a feature can be split off (the plain booster's split); the forced tail bins put bounds at
    its 99.9th percentile and beyond, and a cause that shows only in the top 0.05 % (a GPU far
    hotter than its siblings) is split off with few healthy rows beside it."""
    rng = np.random.default_rng(2)
    x = pd.DataFrame({"spread": rng.normal(size=200_000)})
    cut = float(np.quantile(x["spread"], 0.9995))
    y = (x["spread"] > cut).to_numpy().astype(int)
    bounds = tail_bin_bounds(x)[0]["bin_upper_bound"]
    assert len(bounds) == 14 and min(bounds) < -2 and max(bounds) > cut
    params = {**DEFAULT_PARAMS, "num_leaves": 2, "min_child_samples": 20, "learning_rate": 0.5}
    booster = fit_booster(x, y, x, y, params)
    plain = lgb.train({**params, "verbose": -1}, lgb.Dataset(x, y), num_boost_round=1)
    first = [float(b.trees_to_dataframe()["threshold"].dropna().iloc[0]) for b in (booster, plain)]
    assert first[0] >= np.quantile(x["spread"], 0.999) and first[1] < np.quantile(x["spread"], 0.99)


def test_tail_bounds_read_a_block_at_a_time_are_numpys_quantiles_of_every_value():
    """Only each tail is kept as the blocks go by, yet the bounds are ``numpy.quantile``'s over
    all the finite float32 values, bit for bit: with non-finite values, ties, a column too short
    for its tails to part, and one with nothing finite."""
    rng = np.random.default_rng(5)
    n = 3 * FEATURE_BLOCK_ROWS + 123
    heavy = rng.standard_t(2, n)
    heavy[rng.random(n) < 0.2] = np.nan
    heavy[:50] = np.inf
    x = pd.DataFrame({
        "heavy": heavy,
        "ties": rng.integers(0, 5, n).astype(float),
        "rare": np.where(np.arange(n) % 40_000 == 0, rng.normal(size=n), np.nan),
        "none": np.full(n, np.nan),
    })
    qs = [*TAIL_QUANTILES, *(1.0 - q for q in TAIL_QUANTILES)]
    want = []
    for i, name in enumerate(x.columns):
        v = x[name].to_numpy(np.float32).astype(np.float64)
        v = v[np.isfinite(v)]
        if v.size:
            want.append({"feature": i, "bin_upper_bound": np.unique(np.quantile(v, qs)).tolist()})
    assert [b["feature"] for b in want] == [0, 1, 2]
    assert tail_bin_bounds(x) == want


def test_trees_bin_rows_read_in_blocks_as_they_bin_one_matrix():
    """LightGBM reads the rows a block at a time (FeatureRows) and grows the very trees it grows
    from the whole float32 matrix: its bin sample drawn from more rows than one block, a feature
    too rare for any leaf left out of the features each tree draws from."""
    rng = np.random.default_rng(6)
    n = 4 * FEATURE_BLOCK_ROWS + 7  # more rows than LightGBM samples to find its bins
    x = pd.DataFrame({"a": rng.normal(size=n), "b": rng.exponential(size=n), "c": rng.integers(0, 9, n),
                      "rare": np.where(rng.random(n) < 1e-4, 1.0, 0.0)})  # no leaf may split it off
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x["a"] + x["b"] - 5)))).astype(int).to_numpy()
    params = {**DEFAULT_PARAMS, "min_child_samples": 300, "random_state": 1, "verbose": -1}
    rows = FeatureRows(x, list(x.columns))
    assert len(list(rows.blocks())) == 5
    booster = fit_booster(rows, y, None, None, params, rounds=20)
    with forced_bins_file(tail_bin_bounds(x)) as bins:
        matrix = x.to_numpy(np.float32)
        whole = lgb.train({**params, "metric": "average_precision", "forcedbins_filename": bins},
                          lgb.Dataset(matrix, y, feature_name=list(x.columns)), num_boost_round=20)
    trees = [b.model_to_string().split("\nparameters:")[0] for b in (booster, whole)]
    assert trees[0] == trees[1] and "Tree=19" in trees[0]


def test_the_bin_sample_read_a_block_at_a_time_is_lightgbms_own_sample_read_a_row_at_a_time():
    """``train._Dataset`` overrides LightGBM's private ``Dataset.__sample``, which fetches each
    sampled row with a Python call; a LightGBM that renames it would silently go back to that."""
    rng = np.random.default_rng(8)
    n = 3 * FEATURE_BLOCK_ROWS + 5
    x = pd.DataFrame({"a": rng.normal(size=n), "zeros": np.where(rng.random(n) < 0.7, 0.0, 1.0),
                      "gaps": np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n))})
    rows = FeatureRows(x, list(x.columns))
    params = {"bin_construct_sample_cnt": 50_000, "seed": 3, "verbose": -1}
    dataset = foreshock.models.train._Dataset(rows, params=params)
    ours = dataset._Dataset__sample(seqs=[rows], total_nrow=n)
    theirs = lgb.Dataset._Dataset__sample(dataset, seqs=[rows], total_nrow=n)
    assert [len(v) for v in ours[0]] == [len(v) for v in theirs[0]] and len(ours[0][1]) < 0.5 * 50_000
    for ours_part, theirs_part in zip(ours, theirs, strict=True):
        for a, b in zip(ours_part, theirs_part, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def test_weighted_trees_stop_on_the_validation_rows_read_in_blocks_as_on_one_matrix():
    """With weighted training rows (thinned negatives), validation read a block at a time still
    judges every iteration by its average precision: the trees kept are those kept when
    LightGBM reads both periods as matrices."""
    rng = np.random.default_rng(7)
    n = 2 * FEATURE_BLOCK_ROWS
    x = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n)})
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x["a"] - 4)))).astype(int).to_numpy()
    weight = np.where(rng.random(n) < 0.5, 10.0, 1.0)
    train, val = slice(0, n // 2), slice(n // 2, n)
    params = {**DEFAULT_PARAMS, "min_child_samples": 50, "verbose": -1}
    x_train, x_val = FeatureRows(x.iloc[train], ["a", "b"]), FeatureRows(x.iloc[val], ["a", "b"])
    booster = fit_booster(x_train, y[train], x_val, y[val], params, weight=weight[train])
    history: list[float] = []
    with forced_bins_file(tail_bin_bounds(x.iloc[train])) as bins:
        lgb.train({**params, "metric": "average_precision", "forcedbins_filename": bins},
                  lgb.Dataset(x.iloc[train].to_numpy(np.float32), y[train], weight=weight[train]),
                  num_boost_round=foreshock.models.train.MAX_ROUNDS,
                  valid_sets=[lgb.Dataset(x.iloc[val].to_numpy(np.float32), y[val])],
                  callbacks=[foreshock.models.train._stop_after(history)])
    assert max(history) < 1.0
    assert booster.current_iteration() == foreshock.models.train._best_iteration(history) > MIN_ROUNDS


def test_trees_are_monotone_in_evidence_and_free_elsewhere():
    """Risk may not fall as errors grow: on rows where failures follow a middling ECC count
    more often than a large one (a training period's accident), the trees still rise with the
    count; a workload gauge stays free."""
    ecc, power = "ecc_sbe_vol_total__increase__10m", "power_usage__mean__30m"
    assert monotone_directions([ecc, power, "sm_clock__min__30m", "not_a_feature"]) == [1, 0, -1, 0]
    rng = np.random.default_rng(3)
    x = pd.DataFrame({ecc: rng.uniform(0, 100, 40_000), power: rng.uniform(300, 700, 40_000)})
    bump = np.exp(-(((x[ecc] - 40) / 10) ** 2)) + np.exp(-(((x[power] - 500) / 40) ** 2))
    y = (rng.random(len(x)) < 0.4 * bump / 2).astype(int)
    params = {**DEFAULT_PARAMS, "min_child_samples": 50, "monotone_constraints": monotone_directions(list(x))}
    booster = fit_booster(x, y, x, y, params)
    grid = np.linspace(0, 100, 101)
    along_ecc = booster.predict(pd.DataFrame({ecc: grid, power: 400.0}), raw_score=True)
    assert np.all(np.diff(along_ecc) >= 0) and along_ecc[40] > along_ecc[0]
    watts = np.linspace(300, 700, 101)
    along_power = booster.predict(pd.DataFrame({ecc: 0.0, power: watts}), raw_score=True)
    assert along_power[50] > along_power[0] and along_power[50] > along_power[-1]  # a bump, kept


def test_model_beats_rules_and_warns_ahead(trained):
    _, _, metrics = trained
    model, rules = metrics["model"], metrics["rules"]
    assert model["pr_auc"] > rules["pr_auc"]
    assert model["pr_auc"] > 5 * model["base_rate"]
    assert model["recall_at_budget"] > rules["recall_at_budget"]
    by = model["recall_by_detectability"]
    assert by["detectable"]["recall"] > by["undetectable"]["recall"]
    assert model["median_lead_minutes_detectable"] >= 15


def test_thresholds_are_chosen_out_of_fold_and_spent_beside_the_budget(trained):
    model, out, metrics = trained
    info = metrics["_info"]
    budget = info["budget_false_alarms_per_1000_node_days"]
    selection = info["threshold_selection"]
    folds = selection["folds"]
    assert [f["scored_by"] for f in folds] == ["fold model"] * 3 + ["model"]
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(folds, folds[1:], strict=False))
    for p in ("model", "rules", "logistic"):
        chosen = selection[p]
        assert chosen["threshold"] == metrics[p]["threshold"]
        assert chosen["node_days"] == pytest.approx(sum(f["node_days"] for f in folds))
        # the folds' alarms at the threshold add up to at most the most of any threshold above it
        assert sum(f[p]["false_alarms"] for f in folds) <= chosen["false_alarms"]
        assert chosen["certified"] == (chosen["false_alarms_upper_bound_per_1000_node_days"] <= budget)
        for part in ("test", "val", "test_unseen_nodes"):
            m = metrics[p] if part == "test" else metrics[p]["by_split"][part]
            assert m["budget_false_alarms_per_1000_node_days"] == budget
            assert m["budget_spent"] == pytest.approx(m["false_alarms_per_1000_node_days"] / budget)
    # the validation fold is scored by the model itself: its alarms are the val part's
    assert folds[-1]["model"]["false_alarms"] == metrics["model"]["by_split"]["val"]["false_alarms"]
    # 72 node-days cannot bound a rate of 1 per 1,000 node-days: no out-of-fold false alarm allowed
    assert selection["model"]["false_alarms"] == 0 and not selection["model"]["certified"]
    assert model.threshold_source["kind"] == "train" and model.threshold_source["folds"] == 4
    assert model.threshold_source["threshold"] == model.threshold
    report = (out / "report.md").read_text()
    assert "## False alarms against the budget" in report and "| 3 | model |" in report


def test_saved_model_reloads_and_evaluates_another_seed(trained, synthetic_cluster_other, tmp_path):
    model, out, _ = trained
    loaded = RiskModel.load(out)
    frame = synthetic_cluster_other.features.head(500)
    assert np.allclose(loaded.predict_proba(frame), model.predict_proba(frame))
    from foreshock.models.frame import build_labelled

    data = build_labelled(
        synthetic_cluster_other.data_dir, 3_600_000, features=synthetic_cluster_other.features
    )
    metrics = evaluate(loaded, [synthetic_cluster_other.data_dir], tmp_path, data=[data])
    assert (
        json.loads((tmp_path / "metrics.json").read_text())["model"]["pr_auc"] == metrics["model"]["pr_auc"]
    )
    assert (tmp_path / "report.md").exists() and (tmp_path / "pr_curves.png").exists()
    assert metrics["model"]["pr_auc"] > metrics["rules"]["pr_auc"]
    assert metrics["model"]["recall_at_budget"] > 0
    assert "by_dataset" not in metrics["model"]
    assert metrics["_info"]["dataset_fingerprint"] == data.fingerprint


def test_evaluate_pools_datasets_and_keeps_each_ones_figures(trained, synthetic_cluster_other, tmp_path):
    """Two datasets judged as one pool: the failures, node-days, alarms and catches add up, the
    nodes of one never merge with the other's (the same folder twice here, so every figure is
    exactly twice one evaluation), and each dataset's figures are those of its own evaluation."""
    model, _, _ = trained
    from foreshock.models.frame import build_labelled

    folder = synthetic_cluster_other.data_dir
    data = build_labelled(folder, 3_600_000, features=synthetic_cluster_other.features)
    one = evaluate(model, [folder], tmp_path / "one", data=[data])
    pooled = evaluate(model, [folder, folder], tmp_path / "pool", data=[data, data])
    name = folder.resolve().name
    for p in ("model", "rules", "logistic"):
        assert set(pooled[p]["by_dataset"]) == {name, f"{name}-2"}
        for key in ("failures", "caught", "false_alarms", "alert_episodes"):
            assert pooled[p][key] == 2 * one[p][key], (p, key)
        assert pooled[p]["node_days"] == pytest.approx(2 * one[p]["node_days"])
        assert pooled[p]["pr_auc"] == pytest.approx(one[p]["pr_auc"])
        for part in pooled[p]["by_dataset"].values():
            assert {k: part[k] for k in ("failures", "caught", "false_alarms", "pr_auc")} == {
                k: one[p][k] for k in ("failures", "caught", "false_alarms", "pr_auc")
            }
    assert [d["name"] for d in pooled["_info"]["datasets"]] == [name, f"{name}-2"]
    assert pooled["_info"]["dataset_fingerprint"] != data.fingerprint
    report = (tmp_path / "pool" / "report.md").read_text()
    assert f"| {name}-2 | model |" in report


def test_evaluate_refuses_another_feature_set(trained, synthetic_cluster_other, tmp_path):
    model, _, _ = trained
    from foreshock.models.frame import build_labelled

    other = synthetic_cluster_other.features.rename(columns={"noise_0": "noise_x"})
    other.attrs["feature_set_hash"] = "another-set"
    data = build_labelled(synthetic_cluster_other.data_dir, 3_600_000, features=other)
    with pytest.raises(ValueError, match="feature set"):
        evaluate(model, [synthetic_cluster_other.data_dir], tmp_path, data=[data])


@pytest.mark.parametrize("consume", [False, True])
def test_parts_cut_a_column_at_a_time_equal_the_rows_taken_by_mask(consume):
    from foreshock.models.frame import compact_rows
    from foreshock.models.train import cut_parts

    n = 12
    frame = compact_rows(pd.DataFrame({
        "node": list("abcd") * 3, "ts": np.arange(n) * 60_000, "label": np.tile([0, 1], 6),
        "cause": pd.Categorical(["gpu", None] * 6), "_src": np.arange(n, dtype=np.int32),
    }))
    masks = {"train": np.arange(n) < 5, "test": np.arange(n) >= 8, "held": np.zeros(n, dtype=bool)}
    moved = [c for c in frame.columns if not (consume and c == "_src")]  # _src stays in the frame alone
    expected = {name: frame.loc[mask, moved] for name, mask in masks.items()}
    parts = cut_parts(frame, masks, consume=consume)
    for name in masks:
        assert parts[name].index.dtype == np.int32  # positions, 4 bytes a row
        want = expected[name]
        pd.testing.assert_frame_equal(parts[name], want.set_axis(want.index.astype(np.int32)))
    assert list(frame.columns) == (["_src"] if consume else moved)


def test_validation_scores_fit_kept_are_placed_with_their_rows_not_scored_again():
    """score_parts takes the validation scores ``fit`` kept (in the rows' order, as the thresholds
    saw them) and sorts them with their rows; the other parts are scored."""
    from types import SimpleNamespace

    from foreshock.models.frame import LabelledData
    from foreshock.models.train import Fitted, score_parts

    minute = 60_000
    rng = np.random.default_rng(3)

    def part(nodes: list[str]) -> pd.DataFrame:  # 20 minutes of each node, in no order
        rows = pd.DataFrame({
            "node": pd.Categorical(np.repeat(nodes, 20), categories=["n0", "n1", "n2"]),
            "ts": np.tile(np.arange(20) * minute, len(nodes)),
            "label": np.zeros(20 * len(nodes), dtype=np.int8),
            "failure_ts": np.nan, "cause": None, "detectable": None,
            "rule_critical": np.float32(0), "rule_sbe_per_min": np.float32(0),
            "a": rng.random(20 * len(nodes)),
        })
        return rows.sample(frac=1.0, random_state=1)

    val = part(["n0", "n1"])
    parts = {"test": part(["n0", "n1"]), "val": val, "test_unseen_nodes": part(["n2"])}
    for name, offset in (("test", 0), ("val", 100), ("test_unseen_nodes", 200)):
        parts[name].index = parts[name].index + offset
    data = LabelledData(pd.concat(parts.values()), ["a"], "set", minute, 60 * minute, {}, "print")
    a = val["a"].to_numpy()
    kept = {"model": 2 * a, "rules": a + 5, "logistic": -a}
    # a model whose probability is its one feature, and a baseline whose score is 1 minus it
    model = SimpleNamespace(prior=None, matrix=lambda f: f[["a"]].to_numpy(),
                            margin_of_matrix=lambda x, prior_log_odds: x[:, 0], calibrated=lambda m: m)
    logistic = SimpleNamespace(log_odds=lambda x: x[:, 0], probability=lambda lo: 1 - lo)
    fitted = Fitted(model, logistic, {}, [], {}, {}, 0, 0, dict(kept))
    evaluated = score_parts(data, fitted, parts, minute, 0)
    rows, scores = evaluated["val"].eval_rows, evaluated["val"].scores
    a = rows.frame["a"].to_numpy()
    assert not np.array_equal(a, val["a"].to_numpy())  # sorted into (node, ts) order
    np.testing.assert_array_equal(scores["model"], 2 * a)
    np.testing.assert_array_equal(scores["rules"], a + 5)
    np.testing.assert_array_equal(scores["logistic"], -a)
    assert fitted.val_scores == {}  # taken out, not held beside the sorted copy
    test_rows, test_scores = evaluated["test"].eval_rows, evaluated["test"].scores
    np.testing.assert_array_equal(test_scores["model"], test_rows.frame["a"].to_numpy())
    np.testing.assert_array_equal(test_scores["logistic"], 1 - test_rows.frame["a"].to_numpy())


def test_shap_rows_are_the_rows_drawn_from_the_indexed_test_rows(monkeypatch):
    """``_shap_rows`` draws before it indexes the rows by their place (a gigabyte copied otherwise
    on a fleet's month): the same rows, in the same order, as indexing first."""
    from types import SimpleNamespace

    import foreshock.models.plots
    from foreshock.models.train import ROW, _shap_rows

    monkeypatch.setattr(foreshock.models.plots, "SHAP_ROWS", 10)
    frame = pd.DataFrame({ROW: np.arange(100, 130), "score": np.linspace(0, 1, 30)})
    data = SimpleNamespace(with_features=lambda rows: rows.assign(feature=rows["score"] * 2))
    got = _shap_rows(data, SimpleNamespace(frame=frame))
    want = frame.set_index(ROW).sample(10, random_state=0)
    pd.testing.assert_frame_equal(got, want.assign(feature=want["score"] * 2))
