"""RiskModel: calibrated scores, SHAP contributions, top features, and the no-pickle saved form."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from foreshock.models.artifact import META_FILE, MODEL_FILE, RiskModel
from foreshock.models.baselines import LogisticBaseline
from foreshock.models.train import platt_calibration


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    x = pd.DataFrame(rng.normal(size=(3000, 4)), columns=["sbe", "temp", "noise_a", "noise_b"])
    y = (x["sbe"] + 0.5 * x["temp"] + rng.normal(scale=0.5, size=len(x)) > 1.8).astype(int).to_numpy()
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y), 30)
    m = RiskModel(
        booster,
        feature_names=list(x.columns),
        feature_set_hash="abc",
        threshold=0.4,
        metrics={"model": {"pr_auc": 0.5}},
    )
    m.calibration = platt_calibration(m.margin(x), y)
    return m, x, y


@pytest.fixture(scope="module")
def prior_model(model):
    """Trees boosted from half a logistic regression's log-odds, as ``train_on`` builds them."""
    _, x, y = model
    prior = LogisticBaseline(list(x.columns)).fit(x, y)
    init = 0.5 * prior.log_odds(prior.matrix(x))
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y, init_score=init), 30
    )
    m = RiskModel(
        booster, feature_names=list(x.columns), feature_set_hash="abc", threshold=0.4,
        prior=prior, prior_weight=0.5,
    )
    m.calibration = platt_calibration(m.margin(x), y)
    return m, x


def test_the_linear_prior_keeps_rising_past_the_trees_last_split(prior_model):
    m, x = prior_model
    rows = pd.DataFrame({"sbe": [4.0, 8.0, 16.0, np.nan], "temp": 0.0, "noise_a": 0.0, "noise_b": 0.0})
    trees = m.booster.predict(rows, raw_score=True)
    assert trees[0] == trees[1] == trees[2]  # past the largest training value a tree is flat
    margin = m.margin(rows)
    assert np.allclose(margin, trees + 0.5 * m.prior.log_odds(rows.to_numpy()))
    assert margin[0] < margin[1] < margin[2]
    contrib = m.contributions(rows)
    assert np.allclose(contrib.sum(axis=1), margin)
    sbe = m.feature_names.index("sbe")
    assert contrib[2, sbe] - contrib[1, sbe] == pytest.approx(margin[2] - margin[1])
    assert m.top_features(rows, k=1)[2][0][0] == "sbe"


def test_the_linear_prior_travels_with_the_saved_model(prior_model, tmp_path):
    m, x = prior_model
    m.save(tmp_path)
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert meta["linear_prior"]["weight"] == 0.5 and meta["linear_prior"]["feature_names"] == m.feature_names
    loaded = RiskModel.load(tmp_path)
    assert np.allclose(loaded.predict_proba(x), m.predict_proba(x))
    assert np.allclose(loaded.contributions(x.head(20)), m.contributions(x.head(20)))
    # a model saved before the prior existed (format 1) scores with its trees alone
    (tmp_path / META_FILE).write_text(json.dumps({**meta, "format": 1, "linear_prior": None}))
    old = RiskModel.load(tmp_path)
    assert old.prior is None and np.allclose(old.margin(x), m.booster.predict(x, raw_score=True))


def test_probabilities_are_calibrated_and_rank_like_the_margin(model):
    m, x, y = model
    p = m.predict_proba(x)
    assert ((p > 0) & (p < 1)).all()
    assert abs(p.mean() - y.mean()) < 0.01  # Platt on the same rows matches the base rate
    order = np.argsort(m.margin(x))
    assert np.all(np.diff(p[order]) >= 0)
    assert (m.alerts(x) == (p >= 0.4)).all()


def test_contributions_add_up_to_the_margin_and_top_features_follow_them(model):
    m, x, _ = model
    contrib = m.contributions(x.head(50))
    assert contrib.shape == (50, 5)
    assert np.allclose(contrib.sum(axis=1), m.margin(x.head(50)))
    top = m.top_features(x.head(3).assign(node="n0"), k=2)
    assert len(top) == 3 and all(len(r) == 2 for r in top)
    name, value, c = top[0][0]
    j = m.feature_names.index(name)
    assert value == pytest.approx(x.iloc[0, j]) and c == pytest.approx(contrib[0, j])
    assert abs(c) == pytest.approx(np.abs(contrib[0, :-1]).max())
    missing = m.top_features(x.head(1).assign(sbe=np.nan), k=4)[0]
    assert dict((n, v) for n, v, _ in missing)["sbe"] is None


def test_save_and_load_round_trip_without_pickles(model, tmp_path):
    m, x, _ = model
    m.save(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == sorted([META_FILE, MODEL_FILE])
    assert (tmp_path / "model" / MODEL_FILE).read_text().startswith("tree")
    meta = json.loads((tmp_path / "model" / META_FILE).read_text())
    assert meta["feature_set_hash"] == "abc" and meta["threshold"] == 0.4
    for where in (tmp_path / "model", tmp_path):  # the model folder, or train's --out folder
        loaded = RiskModel.load(where)
        assert np.allclose(loaded.predict_proba(x), m.predict_proba(x))
        assert loaded.feature_names == m.feature_names and loaded.metrics == m.metrics


def test_missing_or_mismatched_features_are_errors(model):
    m, x, _ = model
    with pytest.raises(KeyError):
        m.predict_proba(x.drop(columns=["temp"]))
    with pytest.raises(ValueError):
        m.predict_proba(x.to_numpy()[:, :3])
    with pytest.raises(ValueError):
        RiskModel(m.booster, feature_names=["a", "b", "c", "d"], feature_set_hash="x", threshold=0.5)
    assert np.allclose(m.predict_proba(x[list(reversed(x.columns))]), m.predict_proba(x))
