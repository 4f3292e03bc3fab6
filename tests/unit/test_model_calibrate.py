"""Per-cluster threshold calibration on a cluster the model never saw (no MLflow here)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from foreshock.commands.calibrate import _summary
from foreshock.models.alerting import EvalRows, poisson_upper_bound
from foreshock.models.artifact import RiskModel
from foreshock.models.calibrate import calibrate
from foreshock.models.evaluate import PREDICTORS, budget_of, clear_ms_of, evaluate, scorers_of
from foreshock.models.frame import build_labelled
from foreshock.models.report import threshold_text
from foreshock.models.train import train_from_dataset

BUDGET = 100.0  # per 1,000 node-days: the other cluster's 32 node-days afford a few alarms


@pytest.fixture(scope="module")
def model(synthetic_cluster, tmp_path_factory) -> RiskModel:
    out = tmp_path_factory.mktemp("calibrate-train")
    return train_from_dataset(synthetic_cluster.data_dir, out, features=synthetic_cluster.features,
                              register=False)


@pytest.fixture(scope="module")
def other(synthetic_cluster_other):
    cluster = synthetic_cluster_other
    return build_labelled(cluster.data_dir, 3_600_000, features=cluster.features)


def test_unlabelled_calibration_counts_every_alert_and_keeps_its_bound_in_budget(model, other):
    result = calibrate(model, other, BUDGET, use_labels=False, dataset="other")
    new = result.model
    unlabelled = EvalRows(other.frame.assign(label=0), other.cadence_ms, clear_ms_of(model))
    episodes = unlabelled.episodes(new.predict_proba(unlabelled.frame) >= new.threshold)[0]
    choice = result.choices["model"]
    assert episodes <= choice.false_alarms and choice.certified
    assert poisson_upper_bound(choice.false_alarms, 0.9) / unlabelled.node_days * 1000 <= BUDGET
    assert result.source == new.threshold_source
    assert new.threshold_source["kind"] == "calibrate" and not new.threshold_source["labelled"]
    assert new.threshold_source["failures_excluded"] == 0
    assert new.threshold_source["previous_threshold"] == model.threshold
    assert new.threshold_source["dataset"] == "other" and budget_of(new) == BUDGET


def test_labels_exclude_the_true_alerts_so_the_threshold_can_only_fall(model, other):
    labelled = calibrate(model, other, BUDGET).model
    unlabelled = calibrate(model, other, BUDGET, use_labels=False).model
    assert labelled.threshold_source["labelled"] and labelled.threshold_source["failures_excluded"] > 0
    assert labelled.threshold <= unlabelled.threshold
    rows = EvalRows(other.frame, other.cadence_ms, clear_ms_of(model))
    caught = [rows.at_threshold(m.predict_proba(rows.frame), m.threshold)["caught"]
              for m in (labelled, unlabelled)]
    assert caught[0] >= caught[1]
    alerting = calibrate(model, other, BUDGET)
    assert alerting.alerting_rows == int(alerting.model.alerts(other.frame).sum()) > 0
    assert not [line for line in _summary(alerting, Path("other")) if "alerts on none" in line]


@pytest.mark.parametrize("use_labels", [True, False])
def test_rows_judged_a_node_group_at_a_time_choose_the_thresholds_of_every_row_held_at_once(
        model, other, monkeypatch, tmp_path, use_labels):
    """Groups of 3 nodes on disk, judged many thresholds a pass: each predictor's choice is the one
    of the rows held in memory and judged one threshold at a time, and calibration leaves nothing
    in ``TMPDIR``."""
    import foreshock.models.scored

    monkeypatch.setattr(foreshock.models.scored, "GROUP_NODES", 3)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    try:
        result = calibrate(model, other, BUDGET, use_labels=use_labels)
    finally:
        tempfile.tempdir = None
    assert list(tmp_path.iterdir()) == []
    frame = other.frame.sort_values(["node", "ts"], kind="stable")
    if not use_labels:
        frame = frame.assign(label=0)
    rows = EvalRows(frame, other.cadence_ms, clear_ms_of(model))
    scores = other.scores(frame, scorers_of(model))
    for p in PREDICTORS:
        assert result.choices[p] == rows.threshold_for_budget(scores[p], BUDGET, 0.9)
    assert result.source["failures_excluded"] == len(rows.failures)
    assert result.alerting_rows == int(np.count_nonzero(scores["model"] >= result.model.threshold))


def test_thresholds_near_1_are_printed_apart_from_1():
    assert threshold_text(0.9999995900493637) == "0.99999959"
    assert threshold_text(0.9953939) == "0.9954" and threshold_text(0.5) == "0.5"
    assert threshold_text(1.0000000000000002) == "1"


def test_only_thresholds_move_and_the_record_travels_with_the_saved_model(
    model, other, synthetic_cluster_other, tmp_path
):
    new = calibrate(model, other, BUDGET).model
    frame = other.frame.head(300)
    assert np.array_equal(new.predict_proba(frame), model.predict_proba(frame))
    assert new.baselines["logistic"]["coef"] == model.baselines["logistic"]["coef"]
    assert {new.baselines[b]["threshold"] for b in ("rules", "logistic")} != {
        model.baselines[b]["threshold"] for b in ("rules", "logistic")}
    loaded = RiskModel.load(new.save(tmp_path / "model"))
    assert loaded.threshold == new.threshold and loaded.threshold_source == new.threshold_source
    metrics = evaluate(loaded, [synthetic_cluster_other.data_dir], tmp_path / "eval", data=[other])
    assert metrics["model"]["threshold"] == new.threshold
    assert metrics["model"]["budget_false_alarms_per_1000_node_days"] == BUDGET
    assert metrics["_info"]["threshold_source"]["kind"] == "calibrate"
    assert "`foreshock calibrate`" in (tmp_path / "eval" / "report.md").read_text()


def test_a_threshold_the_rows_do_not_certify_may_rise_never_fall(model, other):
    """A budget of 1 per 1,000 node-days on the other cluster's 32 node-days: no choice is
    certified. A choice above the trained threshold is taken, one below it leaves the trained one;
    a certified choice is taken whichever way it goes."""
    choice = calibrate(model, other, 1.0).choices["model"]
    assert not choice.certified and choice.false_alarms == 0 and choice.threshold < 1.0
    high, low = model.with_threshold((choice.threshold + 1) / 2), model.with_threshold(choice.threshold / 2)
    kept, raised = calibrate(high, other, 1.0), calibrate(low, other, 1.0)
    assert kept.model.threshold == high.threshold and kept.source["kept_previous"]
    assert kept.source["threshold"] == high.threshold and kept.choices["model"] == choice
    assert any("which stays" in line for line in _summary(kept, Path("other")))
    assert raised.model.threshold == choice.threshold and not raised.source["kept_previous"]
    for result in (kept, raised):
        for b in ("rules", "logistic"):
            c = result.choices[b]
            assert not c.certified
            assert result.model.baselines[b]["threshold"] == result.thresholds[b] == max(
                c.threshold, model.baselines[b]["threshold"])
    certified = calibrate(high, other, BUDGET)
    assert certified.choices["model"].certified
    assert certified.model.threshold == certified.choices["model"].threshold < high.threshold


def test_calibration_refuses_data_of_another_feature_set(model, synthetic_cluster_other):
    features = synthetic_cluster_other.features.rename(columns={"noise_0": "noise_x"})
    features.attrs["feature_set_hash"] = "another-set"
    data = build_labelled(synthetic_cluster_other.data_dir, 3_600_000, features=features)
    with pytest.raises(ValueError, match="feature set"):
        calibrate(model, data, BUDGET)


def test_a_budget_no_alert_can_keep_gives_a_model_that_never_alerts(model, other):
    """Unlabelled data whose top score is itself an alert episode, and a budget of 0: the threshold
    sits above every score, a valid model that alerts on nothing, even on a probability of 1."""
    from foreshock.models.artifact import NEVER_ALERT

    result = calibrate(model, other, 0.0, use_labels=False)
    scores = result.model.predict_proba(other.frame)
    assert result.model.threshold > scores.max() and not result.model.alerts(other.frame).any()
    assert result.alerting_rows == 0
    assert "the model now alerts on none of these rows" in _summary(result, Path("other"))[-1]
    assert model.with_threshold(NEVER_ALERT).threshold == NEVER_ALERT > 1.0  # valid: it never alerts
    with pytest.raises(ValueError, match="not a probability"):
        model.with_threshold(1.5)
