"""Model-report and goodput helpers behind notebooks/model_report.ipynb and notebooks/goodput.ipynb."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from foreshock.models.alerting import EvalRows
from foreshock.models.analysis import ettr
from foreshock.models.analysis import model_view as mv
from foreshock.models.artifact import RiskModel

H = 3_600_000


@pytest.fixture(scope="module")
def model() -> RiskModel:
    rng = np.random.default_rng(0)
    x = pd.DataFrame(rng.normal(size=(2000, 3)), columns=["ecc", "temp", "noise"])
    y = ((x["ecc"] > 1.0) | (x["temp"] > 1.5)).astype(int)
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_leaves": 7}, lgb.Dataset(x, y), 30)
    return RiskModel(booster, feature_names=["ecc", "temp", "noise"], feature_set_hash="h", threshold=0.5)


def _rows() -> EvalRows:
    """Two failures of node a (at 1 h and 3 h) and one of node b (at 2 h); rows every 10 min."""
    rows = []
    for node, fails in (("a", [H, 3 * H]), ("b", [2 * H])):
        for ts in range(0, 3 * H, 600_000):
            nxt = next((f for f in fails if f > ts), None)
            label = int(nxt is not None and nxt - ts <= H)
            rows.append(
                {
                    "node": node,
                    "ts": ts,
                    "label": label,
                    "failure_ts": nxt if label else np.nan,
                    "cause": "ecc" if node == "a" else "nic",
                    "detectable": node == "a",
                }
            )
    return EvalRows(pd.DataFrame(rows), 600_000)


def test_caught_and_missed_follow_the_alerting_definitions() -> None:
    rows = _rows()
    f = rows.frame
    score = np.zeros(len(f))
    # node a, failure at 3 h: alert from 2h10 on (first alert 50 min ahead); failure at 1 h: never
    score[((f["node"] == "a") & (f["ts"] >= 2 * H + 600_000)).to_numpy()] = 0.9
    score[((f["node"] == "a") & (f["ts"] == 1_800_000)).to_numpy()] = 0.3  # below the threshold
    score[((f["node"] == "b") & (f["ts"] == 5_400_000)).to_numpy()] = 0.4
    picked = mv.pick_caught_and_missed(rows, score, threshold=0.5)
    caught, missed = picked["caught"], picked["missed"]
    assert (caught["node"], caught["failure_ts"], caught["ts"]) == ("a", 3 * H, 2 * H + 600_000)
    # the missed example prefers a detectable failure (node a at 1 h) and takes its riskiest row
    assert (missed["node"], missed["failure_ts"], missed["ts"]) == ("a", H, 1_800_000)
    assert rows.at_threshold(score, 0.5)["caught"] == 1


def test_nothing_caught_gives_only_a_missed_example() -> None:
    rows = _rows()
    picked = mv.pick_caught_and_missed(rows, np.zeros(len(rows.frame)), threshold=0.5)
    assert set(picked) == {"missed"}


def test_explanation_shows_the_largest_contributions(model: RiskModel) -> None:
    row = pd.Series(
        {
            "ecc": 3.0,
            "temp": 0.0,
            "noise": 0.1,
            "node": "node0001",
            "ts": 0,
            "failure_ts": 1_800_000,
            "cause": "gpu_hbm3_memory",
        }
    )
    fig = mv.plot_explanation(model, row, "Caught", k=2)
    ax = fig.axes[0]
    assert ax.get_title() == "Caught: node0001, gpu_hbm3_memory, 30 min before the failure"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1].startswith("ecc = 3")  # the top bar is the largest |SHAP|
    contrib = model.contributions(row[model.feature_names].to_frame().T.astype(float))[0]
    heights = sorted((p.get_width() for p in ax.patches), key=abs)
    np.testing.assert_allclose(heights, sorted(contrib[:-1], key=abs)[-2:])


def test_recall_by_cause_table_and_figure() -> None:
    by = {
        "ecc": {"failures": 4, "caught": 3, "recall": 0.75},
        "nic": {"failures": 2, "caught": 0, "recall": 0.0},
    }
    metrics = {
        "model": {"recall_by_cause": by},
        "rules": {"recall_by_cause": {"ecc": {"failures": 4, "caught": 1, "recall": 0.25}}},
        "logistic": {"recall_by_cause": {}},
    }
    table = mv.recall_by_cause(metrics)
    assert list(table.index) == ["ecc", "nic"]
    assert table.loc["ecc", "model"] == 0.75 and table.loc["ecc", "rules"] == 0.25
    assert math.isnan(table.loc["nic", "rules"]) and table.loc["nic", "failures"] == 2
    assert mv.plot_recall_by_cause(metrics).axes[0].get_title().startswith("Recall by failure cause")


def test_load_report_from_a_train_folder(tmp_path: Path, model: RiskModel) -> None:
    model.save(tmp_path / "model")
    (tmp_path / "metrics.json").write_text(json.dumps({"model": {"pr_auc": 0.5}}))
    report = mv.load_report(tmp_path)
    assert report.model.feature_names == model.feature_names
    assert report.metrics["model"]["pr_auc"] == 0.5
    with pytest.raises(FileNotFoundError, match="pr_curves.png"):
        report.plot("pr_curves.png")
    with pytest.raises(ValueError, match="tracking URI"):
        mv.load_report("models:/foreshock-risk@champion")


def test_size_table_picks_the_nearest_recall() -> None:
    rows = []
    for g in (1024, 4096):
        for s, e in (("fixed", 0.90), ("young_daly", 0.92), ("oracle", 0.99)):
            rows.append({"gpus": g, "strategy": s, "ettr": e - g / 1e6, "recall": math.nan})
        for r in (0.0, 0.5, 1.0):
            rows.append({"gpus": g, "strategy": "foreshock", "ettr": 0.92 + 0.05 * r, "recall": r})
    table = pd.DataFrame(rows)
    wide = ettr.size_table(table, 0.6)
    assert wide.attrs["recall"] == 0.5
    assert list(wide.index) == [1024, 4096]
    assert wide.loc[1024, "foreshock"] == pytest.approx(0.945)
    assert wide.loc[4096, "fixed"] == pytest.approx(0.90 - 4096 / 1e6)
    assert ettr.plot_ettr_vs_size(table, 0.6).axes[0].get_title() == "ETTR against cluster size"
    with pytest.raises(ValueError, match="no foreshock rows"):
        ettr.size_table(table[table["strategy"] != "foreshock"], 0.5)
