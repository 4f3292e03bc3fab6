"""Scored rows judged a node group at a time from disk give the figures of every row held at once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import foreshock.models.scored
from foreshock.models.alerting import EvalRows, after_return, candidates_of_sorted, sweep
from foreshock.models.evaluate import PREDICTORS, predictor_metrics
from foreshock.models.scored import HeldScores, ScoreSpill, spilled_candidates

MIN = 60_000
DAY = 1440


def _scored_rows(nodes: int = 12, days: int = 3, seed: int = 0) -> pd.DataFrame:
    """``nodes`` x ``days`` at a row a minute, a few rows missing (a node down); each node fails
    now and then (the hour before positive, with a cause and a detectability, some of it right
    after a return); scores that rise before failures, with false spikes and ties."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(nodes):
        minutes = np.arange(days * DAY)
        minutes = minutes[rng.random(minutes.size) > 0.01]
        label = np.zeros(minutes.size, dtype=np.int8)
        failure_ts = np.full(minutes.size, np.nan)
        cause = np.full(minutes.size, None, dtype=object)
        detectable = np.full(minutes.size, None, dtype=object)
        since_return = np.full(minutes.size, 10**9, dtype=np.int64)
        for f in rng.choice(np.arange(120, days * DAY), size=rng.integers(1, 4), replace=False):
            hour = (minutes >= f - 60) & (minutes < f)
            label[hour], failure_ts[hour] = 1, f * MIN
            cause[hour] = rng.choice(["gpu", "link", "hbm"])
            detectable[hour] = bool(rng.random() < 0.6)
            back = (minutes >= f + 30) & (minutes < f + 120)
            since_return[back] = (minutes[back] - f - 30) * MIN
        base = rng.random(minutes.size) ** 3
        frames.append(pd.DataFrame({
            "node": f"n{i:02d}", "ts": minutes * MIN, "label": label, "failure_ts": failure_ts,
            "cause": cause, "detectable": detectable, "since_return_ms": since_return,
            "model": np.where(label == 1, base + rng.random(minutes.size) * 0.6, base),
            "rules": np.round(base * 4) / 4,  # four distinct scores: ties everywhere
            "logistic": np.where(label == 1, np.maximum(base, rng.random(minutes.size)), base),
        }))
    frame = pd.concat(frames, ignore_index=True)
    return frame.assign(after_return=after_return(frame)).drop(columns="since_return_ms")


def _partitions(frame: pd.DataFrame, group_size: int, rng: np.random.Generator) -> list[pd.DataFrame]:
    """The rows as a feature table holds them: a node group's day each, by day then group, each in
    (ts, node) order."""
    group = frame["node"].str[1:].astype(int) // group_size
    day = frame["ts"] // (DAY * MIN)
    parts = [part.sort_values(["ts", "node"]) for _, part in frame.groupby([day, group], sort=True)]
    return [parts[i] for i in rng.permutation(len(parts))]


def _held(frame: pd.DataFrame) -> HeldScores:
    rows = EvalRows(frame, MIN)
    return HeldScores(rows, {p: rows.frame[p].to_numpy() for p in PREDICTORS})


@pytest.mark.parametrize(("group_size", "group_nodes"), [(1, 5), (5, 16), (5, 3)])
def test_rows_spilled_by_node_group_give_the_figures_of_every_row_held_at_once(
        tmp_path, monkeypatch, group_size, group_nodes):
    monkeypatch.setattr(foreshock.models.scored, "GROUP_NODES", group_nodes)
    frame = _scored_rows()
    spill = ScoreSpill(tmp_path / "spill", PREDICTORS, clear_ms=30 * MIN)
    for part in _partitions(frame, group_size, np.random.default_rng(1)):
        spill.add(part, dataset="a")
    spilled = spill.seal(MIN, ["a"])["a"]
    assert len(spilled.files) == -(-12 // group_nodes)  # a file per group of nodes, their days together
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == sorted(p.name for p in spilled.files)
    assert spilled.rows == len(frame)
    held = _held(frame)
    for p in PREDICTORS:
        threshold = float(np.quantile(frame[p], 0.97))
        got = predictor_metrics(spilled, p, threshold, 1.0)
        want = predictor_metrics(held, p, threshold, 1.0)
        assert got == want, p
        assert got["caught"] >= 2 and got["false_alarms"] >= 1  # leads to order, alarms to count
        assert got["median_lead_minutes_ci95"] is not None  # drawn by position: the failures' order
        for scored in (spilled, held):  # ranked once: the metrics and the plots both read it
            assert scored.ranking(p) is scored.ranking(p)


def test_datasets_spilled_together_keep_their_nodes_apart_and_their_own_figures(tmp_path):
    first, second = _scored_rows(seed=0), _scored_rows(seed=1)  # the same node names
    spill = ScoreSpill(tmp_path / "spill", PREDICTORS, clear_ms=30 * MIN)
    for name, frame in (("a", first), ("b", second)):
        for part in _partitions(frame, 4, np.random.default_rng(2)):
            spill.add(part, dataset=name)
    by_dataset = spill.seal(MIN, ["a", "b", "c"])
    pooled = pd.concat([first.assign(node="a/" + first["node"]), second.assign(node="b/" + second["node"])],
                       ignore_index=True)
    for p in PREDICTORS:
        assert predictor_metrics(by_dataset["b"], p, 0.9) == predictor_metrics(_held(second), p, 0.9)
        nothing = predictor_metrics(by_dataset["c"], p, 0.9)  # a dataset with no row
        assert (nothing["rows"], nothing["failures"], nothing["pr_auc"]) == (0, 0, None)
        assert nothing["alert_episodes"] == 0 and nothing["recall_at_budget"] is None
        union = type(by_dataset["a"]).union([by_dataset["a"], by_dataset["b"]])
        assert predictor_metrics(union, p, 0.9) == predictor_metrics(_held(pooled), p, 0.9)


def test_a_sweep_judging_many_thresholds_per_pass_stops_where_one_at_a_time_does():
    held = _held(_scored_rows())
    score = held.scores["model"]
    candidates = np.unique(score)[::-1][:600]
    one = sweep(lambda: held.parts("model"), candidates, 2_000.0, 36.0)
    assert 25 < len(one) < len(candidates)  # it stopped
    for window in (7, 32, 1000):
        assert sweep(lambda: held.parts("model"), candidates, 2_000.0, 36.0, window) == one


@pytest.mark.parametrize("bucket_values", [8, 1_000, 1 << 22])
def test_candidates_counted_a_bucket_of_distinct_scores_at_a_time_are_those_of_every_score_sorted(
        tmp_path, bucket_values):
    rng = np.random.default_rng(4)
    shared = rng.random(300)  # scores tied across groups count once
    cases = {
        "distinct": [rng.random(500) for _ in range(7)],
        "tied across groups": [np.r_[rng.choice(shared, 400), rng.random(100)] for _ in range(6)],
        "few distinct": [np.round(rng.random(300), 2) for _ in range(5)],  # every one a candidate
        "no rows": [],
    }
    for name, groups in cases.items():
        rows = sum(g.size for g in groups)
        want = candidates_of_sorted(np.sort(np.concatenate([np.empty(0), *groups])))
        got = spilled_candidates(lambda groups=groups: iter(groups), rows, tmp_path, bucket_values)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert not list(tmp_path.iterdir())  # the buckets' files are gone
