"""Training, evaluation and calibration read the feature table: ``foreshock features`` then
``train --features``, ``evaluate --features`` and ``calibrate --features`` give the figures of the
features computed in memory; without the flag
the features are computed once into the dataset's cache and reused; a table made from anything
else is refused. Thinning the far negatives keeps every row that matters and weights the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import foreshock.features.batch
import foreshock.models.baselines
import foreshock.models.frame
import foreshock.models.train
from foreshock.cli import app
from foreshock.features import DEFAULT_FEATURE_SET as FS
from foreshock.features.batch import compute_features, write_feature_table
from foreshock.features.table import FeatureTableError
from foreshock.models.artifact import RiskModel
from foreshock.models.baselines import LogisticBaseline, rule_scores
from foreshock.models.calibrate import calibrate
from foreshock.models.evaluate import evaluate
from foreshock.models.folds import time_folds
from foreshock.models.frame import (
    CACHE_DIR,
    CATEGORY_COLUMNS,
    TableOnDask,
    build_labelled,
    dataset_fingerprint,
    feature_table,
)
from foreshock.models.scored import GROUP_NODES
from foreshock.models.train import (
    FAR_FROM_FAILURE_MS,
    ROW,
    WEIGHT,
    _logistic_rows,
    booster_rows,
    fold_log_odds,
    fold_logistic_baselines,
    fold_logistic_rows,
    fold_training_rows,
    log_odds,
    thin_far_negatives,
    train_from_dataset,
    train_on,
)
from tests.fixtures.model_data import make_synthetic_cluster

HOUR = 3_600_000


def _without_time(metrics: dict) -> dict:
    metrics = json.loads(json.dumps(metrics))
    metrics["_info"].pop("trained_at_ms", None)
    return metrics


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return make_synthetic_cluster(tmp_path_factory.mktemp("tabled"), nodes=16, days=3.0, seed=3)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return make_synthetic_cluster(tmp_path_factory.mktemp("tabled-other"), nodes=8, days=2.0, seed=8)


@pytest.fixture(scope="module")
def tables(cluster, other, tmp_path_factory):
    out = {}
    for name, c in (("cluster", cluster), ("other", other)):
        path = tmp_path_factory.mktemp("tables") / name
        result = CliRunner().invoke(app, ["features", "--data", str(c.data_dir), "--out", str(path)])
        assert result.exit_code == 0, result.output
        out[name] = path
    return out


@pytest.fixture(scope="module")
def trained_in_memory(cluster, tmp_path_factory):
    """Today's path: the features computed in memory and handed to training."""
    out = tmp_path_factory.mktemp("in-memory")
    train_from_dataset(cluster.data_dir, out, features=compute_features(cluster.data_dir), feature_set=FS,
                       register=False)
    return out


def test_train_stopped_by_sigterm_exits_143_and_takes_its_temporary_folders_with_it(
    cluster, tables, tmp_path
):
    """A scheduler's time limit sends SIGTERM: the training rows and scored folds waiting on disk
    (gigabytes on a fleet's month) go with the process instead of filling TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ["train", "--data", str(cluster.data_dir), "--out", str(tmp_path / "out"),
            "--features", str(tables["cluster"]), "--no-register"]
    with (tmp_path / "stderr").open("w") as err:
        env = {**os.environ, "TMPDIR": str(tmp)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "foreshock", *argv], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
        deadline = time.monotonic() + 120
        while not list(tmp.glob("foreshock-folds-*")):  # fitting: the fold blocks are on disk
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "no fold folder within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "stderr").read_text()
    assert not list(tmp.glob("foreshock-*"))
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_train_and_evaluate_on_the_table_give_the_in_memory_metrics(
    cluster, other, tables, trained_in_memory, tmp_path
):
    out = tmp_path / "from-table"
    result = CliRunner().invoke(app, ["train", "--data", str(cluster.data_dir), "--out", str(out),
                                      "--features", str(tables["cluster"]), "--no-register"])
    assert result.exit_code == 0, result.output
    want = json.loads((trained_in_memory / "metrics.json").read_text())
    got = json.loads((out / "metrics.json").read_text())
    choice = got["_info"]["threshold_selection"]["model"]
    assert not choice["certified"]  # a small cluster's few node-days: the console says so
    assert (f"not certified: {choice['node_days']:,.0f} node-days out of fold bound its false alarms at "
            f"{choice['false_alarms_upper_bound_per_1000_node_days']:.2f}") in result.output
    assert want["model"]["positives"] > 0
    assert _without_time(got) == _without_time(want)

    model = RiskModel.load(trained_in_memory / "model")
    labelled = build_labelled(other.data_dir, model.horizon_minutes * 60_000,
                              features=compute_features(other.data_dir), feature_set=FS)
    in_memory = evaluate(model, [other.data_dir], tmp_path / "eval-in-memory", data=[labelled])
    result = CliRunner().invoke(app, ["evaluate", "--model", str(trained_in_memory), "--data",
                                      str(other.data_dir), "--out", str(tmp_path / "eval"),
                                      "--features", str(tables["other"])])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text()) == json.loads(json.dumps(in_memory))


def test_calibrate_on_the_table_sets_the_threshold_of_the_in_memory_rows_and_refuses_another(
    cluster, other, tables, trained_in_memory, tmp_path
):
    model = RiskModel.load(trained_in_memory / "model")
    labelled = build_labelled(other.data_dir, model.horizon_minutes * 60_000,
                              features=compute_features(other.data_dir), feature_set=FS)
    want = calibrate(model, labelled, 100.0, dataset=str(other.data_dir.resolve())).source
    argv = ["calibrate", "--model", str(trained_in_memory), "--data", str(other.data_dir), "--budget", "100",
            "--no-register", "--out", str(tmp_path / "calibrated")]
    result = CliRunner().invoke(app, [*argv, "--features", str(tables["other"])])
    assert result.exit_code == 0, result.output
    got = json.loads((tmp_path / "calibrated" / "calibration.json").read_text())["source"]
    assert got == json.loads(json.dumps(want)) and got["failures_excluded"] > 0
    result = CliRunner().invoke(app, [*argv, "--features", str(tables["cluster"])])
    assert result.exit_code == 2, result.output
    assert "does not match" in result.output and "dataset_fingerprint" in result.output


def test_evaluate_scores_from_disk_shows_each_phase_and_leaves_no_scratch(
    other, tables, trained_in_memory, tmp_path, monkeypatch
):
    """The scored rows wait under TMPDIR a node group a folder while they are judged, and go with
    the evaluation; both phases, scoring and judging, report their progress to the end."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: dict[str, list[tuple[int, int]]] = {}
    groups_while_judged = []

    def progress(label: str, done: int, total: int) -> None:
        seen.setdefault(label, []).append((done, total))
        if label.endswith("judging the scores"):
            groups_while_judged.append(len(list(scratch.glob("foreshock-scored-*/group-*.group"))))

    model = RiskModel.load(trained_in_memory / "model")
    evaluate(model, [other.data_dir], tmp_path / "eval", tables=[tables["other"]], progress=progress)
    scoring = seen[f"evaluate: {other.data_dir.name}"]
    assert scoring[-1][0] == scoring[-1][1] == len(scoring) > 0
    assert seen["evaluate: judging the scores"] == [(i, 3) for i in range(4)]  # a step per predictor
    assert groups_while_judged[0] == -(-8 // GROUP_NODES)  # 8 nodes
    assert not list(scratch.iterdir())


def test_from_a_table_the_frame_holds_no_feature_and_any_rows_read_theirs(cluster, tables):
    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    names = data.feature_names
    assert not set(names) & set(data.frame.columns) and len(data.days) >= 3
    in_memory = build_labelled(cluster.data_dir, HOUR, features=compute_features(cluster.data_dir),
                               feature_set=FS).frame.set_index(["node", "ts"])

    rows = data.frame.sample(frac=0.3, random_state=1)  # any order, across every day
    got = data.with_features(rows)
    assert got.index.equals(rows.index) and got[names].dtypes.eq(np.float32).all()
    want = in_memory.loc[pd.MultiIndex.from_frame(rows[["node", "ts"]]), names]
    np.testing.assert_array_equal(got[names].to_numpy(), want.to_numpy())

    scorers = {"first": lambda block: block.x[:, 0], "rows": lambda block: np.full(len(block), len(block))}
    scored = data.scores(rows, scorers)
    np.testing.assert_array_equal(scored["first"], want[names[0]].to_numpy())
    assert scored["rows"].max() < len(rows)  # a day at a time, never every row at once


def test_from_a_table_the_frame_is_compact_and_holds_the_in_memory_labels_and_evidence(cluster, tables):
    frame = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"]).frame
    in_memory = build_labelled(cluster.data_dir, HOUR, features=compute_features(cluster.data_dir),
                               feature_set=FS).frame
    assert all(isinstance(frame[c].dtype, pd.CategoricalDtype) for c in CATEGORY_COLUMNS)
    assert frame["_src"].dtype == np.int32 and frame["cause"].notna().any()
    columns = [c for c in frame.columns if c != "_src"]
    got = frame[columns].astype({c: object for c in CATEGORY_COLUMNS})
    pd.testing.assert_frame_equal(got, in_memory[columns])


def test_the_table_keeps_the_rules_evidence_so_reading_it_scans_no_raw_gpu_sample(cluster, tables, tmp_path,
                                                                                  monkeypatch):
    """``foreshock features`` keeps the rules' evidence with the table: a table's labelled rows get
    the evidence the raw telemetry gives without scanning it. A table kept without it, or with
    the evidence of other rules, has its evidence read from the raw telemetry."""
    bare = write_feature_table(cluster.data_dir, tmp_path / "bare", dataset_fingerprint=dataset_fingerprint(
        cluster.data_dir))
    scans = []
    scan = foreshock.models.baselines._gpu_increments
    monkeypatch.setattr(foreshock.models.baselines, "_gpu_increments", lambda *a: scans.append(a) or scan(*a))
    read_raw = build_labelled(cluster.data_dir, HOUR, table=bare.path).frame
    assert len(scans) == 1
    kept = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"]).frame
    assert len(scans) == 1 and (kept["rule_sbe_per_min"] > 0).any() and (kept["rule_critical"] > 0).any()
    pd.testing.assert_frame_equal(kept, read_raw)
    monkeypatch.setattr(foreshock.models.baselines, "_EVIDENCE_KEY", "other-rules")
    build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    assert len(scans) == 2


def test_feature_rows_read_a_table_day_at_a_time_in_the_frames_order(cluster, tables):
    """What LightGBM and the boosters read: the rows' features as ``with_features`` gives them,
    one table day in memory at a time, by block, slice (across days) or row."""
    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    rows = data.frame.iloc[::3]  # a part of the frame, in its order, across every day
    want = data.with_features(rows)[data.feature_names].to_numpy()
    got = data.feature_rows(rows)
    blocks = list(got.blocks())
    assert len(got) == len(rows) and len(blocks) == sum(stop > start for _, start, stop in data.days) > 1
    np.testing.assert_array_equal(np.concatenate(blocks), want)
    first_day = len(blocks[0])
    np.testing.assert_array_equal(got[first_day - 5 : first_day + 5], want[first_day - 5 : first_day + 5])
    assert got[first_day].dtype == np.float64
    np.testing.assert_array_equal(got[first_day], want[first_day])
    with pytest.raises(ValueError, match="frame's order"):
        data.feature_rows(rows.iloc[::-1])


@pytest.mark.parametrize("keep", [0, 1 << 30])
def test_feature_rows_read_each_day_once_when_they_fit_else_hold_one(cluster, tables, monkeypatch, keep):
    monkeypatch.setattr(foreshock.models.frame, "KEEP_FEATURE_BYTES", keep)
    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    reads = []
    read = data.feature_matrix
    monkeypatch.setattr(data, "feature_matrix", lambda rows: reads.append(len(rows)) or read(rows))
    got = data.feature_rows(data.frame.iloc[::2])
    first, second = [np.concatenate(list(got.blocks())) for _ in range(2)]
    np.testing.assert_array_equal(first, second)
    days = sum(stop > start for _, start, stop in data.days)
    passes = 1 if keep else 2
    assert len(reads) == passes * days and sum(reads) == passes * len(got)


def test_dask_workers_read_the_rows_of_the_frame_by_their_place_in_the_table(cluster, tables):
    """What each Dask partition holds (computed here, on the synchronous scheduler) is the asked
    rows' features, as the frame reads them, beside their own extra columns."""
    import dask

    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    names = data.feature_names
    rows = data.frame.sample(frac=0.3, random_state=2)  # any order, across every day
    extra = pd.DataFrame({"_label": np.arange(len(rows), dtype=np.int64)})
    with dask.config.set(scheduler="synchronous"):
        got = TableOnDask("tcp://unused:8786", data).rows(rows.index.to_numpy(), extra).compute()
    got = got.sort_values("_label", ignore_index=True)  # back to the asked order
    np.testing.assert_array_equal(got["_label"].to_numpy(), extra["_label"].to_numpy())
    np.testing.assert_array_equal(got[names].to_numpy(), data.with_features(rows)[names].to_numpy())


def test_without_a_table_the_features_are_computed_once_into_the_cache(other, tables, monkeypatch):
    first = feature_table(other.data_dir)
    assert first.path.parent.name == CACHE_DIR and first.identity.feature_set_hash == FS.hash
    written = pd.read_parquet(tables["other"] / first.partitions[0].path)
    pd.testing.assert_frame_equal(first.read(first.partitions[0]), written)

    def recompute(*args, **kwargs):
        raise AssertionError("the cached table was computed again")

    monkeypatch.setattr(foreshock.features.batch, "write_feature_table", recompute)
    again = feature_table(other.data_dir)
    assert again.path == first.path and again.identity == first.identity


def test_a_table_of_another_dataset_or_cadence_is_an_error(cluster, other, tables, tmp_path):
    for flags, wrong in (
        (["--features", str(tables["other"])], "dataset_fingerprint"),
        (["--features", str(tables["cluster"]), "--cadence", "5m"], "cadence_ms is 60000, expected 300000"),
    ):
        out = tmp_path / wrong.split()[0]
        result = CliRunner().invoke(app, ["train", "--data", str(cluster.data_dir), "--out", str(out),
                                          "--no-register", *flags])
        assert result.exit_code == 2, result.output
        assert "does not match" in result.output and wrong in result.output
        assert not (out / "metrics.json").exists()


def test_a_folder_that_is_no_dataset_is_a_clear_error(trained_in_memory, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["train", "--data", str(empty), "--out", str(tmp_path / "t"), "--no-register"],
                 ["evaluate", "--model", str(trained_in_memory), "--data", str(empty), "--out",
                  str(tmp_path / "e")],
                 ["calibrate", "--model", str(trained_in_memory), "--data", str(empty), "--budget", "1",
                  "--no-register"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert f"error: {empty} is not a dataset: no manifest.json" in result.output


def test_thinning_keeps_what_matters_and_weights_the_far_negatives(cluster, monkeypatch):
    frame = build_labelled(cluster.data_dir, HOUR, features=cluster.features).frame
    thinned = thin_far_negatives(frame, 0.25, seed=4)
    ahead = (frame["failure_ts"].astype("float64") - frame["ts"]).fillna(np.inf)
    behind = frame["since_return_ms"]
    far = (frame["label"] == 0) & (ahead > FAR_FROM_FAILURE_MS) & (behind > FAR_FROM_FAILURE_MS)
    assert far.sum() > 5_000 and (~far).sum() > 5_000
    kept_far = thinned.index.isin(frame.index[far])
    assert set(frame.index[~far]) <= set(thinned.index)  # positives and the hours around failures
    assert thinned.loc[~kept_far, WEIGHT].eq(1.0).all() and thinned.loc[kept_far, WEIGHT].eq(4.0).all()
    assert kept_far.sum() == pytest.approx(0.25 * far.sum(), rel=0.1)
    # the same rows are kept whatever else the frame holds (fold models, Dask workers)
    half = frame.iloc[: len(frame) // 2]
    in_half = [i for i in thinned.index if i in half.index]
    assert thin_far_negatives(half, 0.25, seed=4).index.tolist() == in_half
    assert thin_far_negatives(frame, 0.25, seed=5).index.tolist() != thinned.index.tolist()
    assert thin_far_negatives(frame, 1.0, seed=4) is frame
    monkeypatch.setattr(foreshock.models.train, "THIN_BLOCK_ROWS", 1_000)  # judged a block at a time
    pd.testing.assert_frame_equal(thin_far_negatives(frame, 0.25, seed=4), thinned)


FOLD_BOOSTER = dict(censor_ms=6 * HOUR, negative_rate=0.25, seed=4)


def _fold_periods(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """Training and validation rows of a labelled frame (with a gap between them), and the
    ``(rows, booster rows)`` periods the fold models draw from."""
    cut = frame["ts"] < frame["ts"].quantile(0.7)
    train, val = frame.loc[cut], frame.loc[~cut & (frame["ts"] > frame["ts"].quantile(0.75))]
    return train, val, [(p, booster_rows(p, **FOLD_BOOSTER)) for p in (train, val)]


def test_a_fold_trains_on_the_rows_a_copy_of_the_periods_outside_it_would_give(cluster):
    """The fold models' rows come from the periods' booster rows and labels, never from a copy of
    the rows outside the fold; they are the rows that copy would give, in the same order."""
    frame = build_labelled(cluster.data_dir, HOUR, features=cluster.features).frame
    train, val, periods = _fold_periods(frame)
    for fold in time_folds(train, val, 4)[:3]:
        trees = fold_training_rows(periods, fold, HOUR)
        logistic = fold_logistic_rows(periods, fold, HOUR, seed=4)
        ts = pd.concat([train, val])["ts"]
        copy = pd.concat([train, val]).loc[(ts < fold.start_ms - HOUR) | (ts >= fold.end_ms + HOUR)]
        assert 0 < len(copy) < len(train) + len(val) and logistic["label"].sum() > 0
        pd.testing.assert_frame_equal(trees, booster_rows(copy, **FOLD_BOOSTER))
        pd.testing.assert_frame_equal(logistic, _logistic_rows([(copy, None)], seed=4))
        assert (logistic["label"] == 0).sum() == 10 * logistic["label"].sum()  # a draw, not every row


def test_the_fold_baselines_are_those_fitted_one_at_a_time_and_read_each_table_day_once(
    cluster, tables, monkeypatch
):
    """Each fold model's draw of logistic rows spans nearly every table day: all folds' draws are
    read in one pass, and each baseline is the one its own rows alone would fit."""
    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    train, val, periods = _fold_periods(data.frame)
    folds = time_folds(train, val, 4)
    reads: list[str] = []
    read = foreshock.features.table._read_partition
    monkeypatch.setattr(foreshock.features.table, "_read_partition",
                        lambda path, columns: reads.append(str(path)) or read(path, columns))
    together = fold_logistic_baselines(data, periods, folds, seed=4)
    assert sorted(together) == [f.index for f in folds[:3]]
    assert len(reads) == len(set(reads)) > 1  # every partition read at most once
    for fold in folds[:3]:
        rows = fold_logistic_rows(periods, fold, HOUR, seed=4)
        alone = LogisticBaseline(data.feature_names, seed=4)
        picked = data.with_features(rows.iloc[alone.rows_fitted(len(rows))])
        alone.fit(picked, picked["label"].to_numpy())
        np.testing.assert_array_equal(together[fold.index].coef_, alone.coef_)
        assert together[fold.index].intercept_ == alone.intercept_


@pytest.mark.parametrize("source", ["table", "frame"])
def test_the_fold_priors_are_the_log_odds_of_each_folds_rows_alone(cluster, tables, source):
    """The fold models' priors, computed for all folds in one pass over the table, are to the bit
    the log-odds each fold's rows would get alone: the trees start from the same margins."""
    data = (build_labelled(cluster.data_dir, HOUR, table=tables["cluster"]) if source == "table"
            else build_labelled(cluster.data_dir, HOUR, features=cluster.features))
    train, val, periods = _fold_periods(data.frame)
    folds = time_folds(train, val, 4)
    baselines = fold_logistic_baselines(data, periods, folds, seed=4)
    priors = fold_log_odds(data, periods, folds, baselines)
    assert sorted(priors) == sorted(baselines)
    for index, prior in priors.items():
        rows = fold_training_rows(periods, folds[index], HOUR)
        np.testing.assert_array_equal(prior, log_odds(baselines[index], rows, data))


def test_validation_scores_are_those_the_trained_model_and_baselines_give(cluster, tables):
    """The validation scores of the metrics and the thresholds come from the margin and the
    prior's log-odds the candidates were judged by, not from reading the rows again: they are the
    scores the saved model, the rules and the logistic baseline give those rows."""
    data = build_labelled(cluster.data_dir, HOUR, table=tables["cluster"])
    model, _, evaluated = train_on(data, negative_rate=0.5)
    rows, scores = evaluated["val"].eval_rows, evaluated["val"].scores
    val = rows.frame.set_index(ROW)
    logistic = LogisticBaseline.from_json(model.baselines["logistic"])
    again = data.scores(val, {"model": lambda block: model.predict_proba(block.x),
                              "logistic": lambda block: logistic.probability(logistic.log_odds(block.x))})
    assert 0 < scores["model"].max() < 1 and len(np.unique(scores["logistic"])) > 1
    np.testing.assert_allclose(scores["model"], again["model"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(scores["logistic"], again["logistic"], rtol=1e-12, atol=0)
    np.testing.assert_array_equal(scores["rules"], rule_scores(val))


def test_training_states_its_subsampling(cluster, tmp_path):
    train_from_dataset(cluster.data_dir, tmp_path, features=cluster.features, register=False,
                       negative_rate=0.25, folds=1)
    info = json.loads((tmp_path / "metrics.json").read_text())["_info"]
    thinning = info["negative_subsampling"]
    assert thinning["rate"] == 0.25 and thinning["weight"] == 4.0
    assert thinning["far_from_failure_ms"] == FAR_FROM_FAILURE_MS
    assert info["train_rows_used"] < thinning["train_rows_represented"] <= info["rows"]["train"]


def test_a_cache_that_cannot_be_written_is_a_clear_error(tmp_path):
    small = make_synthetic_cluster(tmp_path / "data", nodes=2, days=1.0, seed=1)
    (small.data_dir / CACHE_DIR).write_text("not a folder")
    with pytest.raises(FeatureTableError, match="cannot write the feature cache .* pass it with --features"):
        feature_table(small.data_dir)


def test_compact_frames_join_a_column_at_a_time_into_the_sorted_concat():
    """Days of rows join in (node, ts) order, categories on their union (a day whose causes are
    all missing has categories of another dtype), a column of two dtypes in their common one, each
    column in memory of its own: the join frees a day's column once its rows are placed."""
    rng = np.random.default_rng(0)

    def day(start: int, nodes: list[str], causes: list) -> pd.DataFrame:
        n = len(nodes)
        return pd.DataFrame({
            "node": nodes, "ts": start + np.arange(n) * 60_000, "cause": causes,
            "score": rng.random(n), "logistic": rng.random(n),
            "last_event_ts": pd.array([None] * (n - 1) + [start], dtype="Int64"),
            "count": np.arange(n) if start == 0 else np.arange(n) + 0.5,  # int64, then float64
        })

    days = [day(0, ["n2", "n1", "n2"], ["hbm", None, "hbm"]), day(10**7, ["n3", "n1"], [None, None])]
    expected = pd.concat(days, ignore_index=True).sort_values(["node", "ts"], kind="stable")
    frames = [foreshock.models.frame.compact_rows(d) for d in days]
    assert all(f._mgr.nblocks == f.shape[1] for f in frames)
    joined = foreshock.models.frame.concat_compact(frames, by_node_ts=True)
    assert frames == []
    assert list(joined["node"].cat.categories) == ["n1", "n2", "n3"]
    assert list(joined["cause"].cat.categories) == ["hbm"]
    pd.testing.assert_frame_equal(
        joined.astype({"node": str, "cause": object}).fillna({"cause": "-"}),
        expected.reset_index(drop=True).fillna({"cause": "-"}),
    )
    unsorted = foreshock.models.frame.concat_compact([foreshock.models.frame.compact_rows(d) for d in days])
    assert list(unsorted["node"]) == ["n2", "n1", "n2", "n3", "n1"]


@pytest.mark.parametrize("parts_in_time_order", [True, False])
def test_parts_join_in_the_order_of_a_stable_sort_by_node_and_ts(parts_in_time_order, monkeypatch):
    """Day partitions read in turn are placed part by part; parts in any other order (here a later
    day first, and repeated instants) are sorted as a whole: both give the stable sort's rows."""
    rng = np.random.default_rng(1)
    days = []
    for d in range(5):
        n = 400
        days.append(pd.DataFrame({
            "node": rng.choice([f"n{i:02d}" for i in range(12)], n),
            "ts": d * 86_400_000 + np.sort(rng.integers(0, 86_400_000 // 60_000, n)) * 60_000,
            "row": np.arange(n) + 1000 * d,  # which input row it was
        }))
    days.insert(2, days[0].iloc[:0])  # a partition with no rows left
    if not parts_in_time_order:
        days = days[::-1]
    expected = pd.concat(days, ignore_index=True).sort_values(["node", "ts"], kind="stable")
    sorted_as_a_whole = []
    whole = foreshock.models.frame._sorted_places
    monkeypatch.setattr(foreshock.models.frame, "_sorted_places",
                        lambda *a: sorted_as_a_whole.append(1) or whole(*a))
    joined = foreshock.models.frame.concat_compact([foreshock.models.frame.compact_rows(d) for d in days],
                                                   by_node_ts=True)
    assert len(sorted_as_a_whole) == (not parts_in_time_order)
    np.testing.assert_array_equal(joined["row"].to_numpy(), expected["row"].to_numpy())
    assert list(joined["node"]) == list(expected["node"]) and joined["ts"].tolist() == expected["ts"].tolist()
