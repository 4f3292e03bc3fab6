"""Baselines: health-checker rules from raw telemetry and the JSON-only logistic regression."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from foreshock.models.baselines import LogisticBaseline, rule_inputs, rule_scores

MIN = 60_000


def _dataset(tmp_path, gpu: pd.DataFrame, xid: pd.DataFrame):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "xid").mkdir()
    half = len(gpu) // 2
    gpu.iloc[:half].to_parquet(tmp_path / "gpu" / "part-00000.parquet")
    gpu.iloc[half:].to_parquet(tmp_path / "gpu" / "part-00001.parquet")
    xid.to_parquet(tmp_path / "xid" / "part-00000.parquet")
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    return tmp_path


def test_rule_inputs_count_increases_across_parts_resets_and_windows(tmp_path):
    ts = np.arange(0, 40) * MIN
    sbe = np.arange(40, dtype=float) * 2 + 1000  # +2 per minute from a large starting count
    sbe[30:] = np.arange(10) * 2 + 2  # counter reset at minute 30 (it restarts from 0 and counts 2)
    gpu = pd.DataFrame(
        {
            "node": "n0",
            "ts": ts,
            "gpu": 0,
            "ecc_sbe_vol_total": sbe,
            "ecc_dbe_vol_total": np.where(ts >= 25 * MIN, 1.0, 0.0),
        }
    )
    xid = pd.DataFrame(
        {"node": ["n0", "n0"], "ts": [5 * MIN, 6 * MIN], "gpu": 0, "xid": [79, 13], "count": [1, 1]}
    )
    d = _dataset(tmp_path, gpu, xid)
    rows = pd.DataFrame({"node": "n0", "ts": np.array([0, 5, 14, 15, 20, 25, 34, 35]) * MIN})
    got = rule_inputs(d, rows, MIN, window_ms=10 * MIN).set_index(rows["ts"] // MIN)
    # the first reading is no increase; 2 per minute afterwards; the reset counts its new value
    assert got.loc[0, "rule_sbe_per_min"] == 0
    assert got.loc[20, "rule_sbe_per_min"] == 2.0
    assert got.loc[34, "rule_sbe_per_min"] == 2.0
    # xid 79 is critical, 13 is not; the window is (t - 10 min, t]
    assert got.loc[5, "rule_critical"] == 1 and got.loc[14, "rule_critical"] == 1
    assert got.loc[15, "rule_critical"] == 0 and got.loc[20, "rule_critical"] == 0
    # an uncorrectable ECC increase at minute 25 counts until minute 34
    assert got.loc[25, "rule_critical"] == 1 and got.loc[34, "rule_critical"] == 1
    assert got.loc[35, "rule_critical"] == 0
    scores = rule_scores(got)
    assert scores[got["rule_critical"].to_numpy() > 0].min() == 1.0
    assert scores[got["rule_critical"].to_numpy() == 0].max() < 1.0


def test_rule_inputs_are_the_same_however_the_parts_are_cut_into_row_groups(tmp_path):
    """The GPU table is read a row group at a time: each GPU's last count carries from one row
    group to the next, so an increase that straddles two is counted once, as in one piece."""
    minutes, nodes, gpus = 30, ["n0", "n1"], 2
    grid = np.meshgrid(np.arange(minutes) * MIN, np.arange(len(nodes)), np.arange(gpus), indexing="ij")
    ts, node, gpu = (a.ravel() for a in grid)
    rng = np.random.default_rng(3)
    telemetry = pd.DataFrame(
        {
            "node": np.array(nodes)[node],
            "ts": ts,
            "gpu": gpu,
            "ecc_sbe_vol_total": 500.0 + np.cumsum(rng.integers(0, 3, len(ts))),
            "ecc_dbe_vol_total": (ts >= 12 * MIN) & (node == 1) & (gpu == 0),
        }
    ).astype({"ecc_dbe_vol_total": float})
    ticks = np.arange(1, minutes + 1) * MIN
    rows = pd.DataFrame({"node": np.repeat(nodes, minutes), "ts": np.tile(ticks, len(nodes))})
    xid = pd.DataFrame({"node": ["n0"], "ts": [3 * MIN], "gpu": [0], "xid": [79], "count": [1]})
    evidence = []
    for rows_per_group in (len(telemetry), 7):
        d = tmp_path / f"groups-{rows_per_group}"
        for table, frame in (("gpu", telemetry), ("xid", xid)):
            (d / table).mkdir(parents=True)
            frame.to_parquet(d / table / "part-00000.parquet", row_group_size=rows_per_group)
        (d / "manifest.json").write_text(json.dumps({"schema_version": 1}))
        evidence.append(rule_inputs(d, rows, MIN, window_ms=10 * MIN))
    whole, cut = evidence
    assert whole["rule_sbe_per_min"].sum() > 0 and whole["rule_critical"].sum() > 1
    pd.testing.assert_frame_equal(cut, whole, check_exact=True)


def test_logistic_round_trips_through_json_and_ranks_the_signal():
    rng = np.random.default_rng(0)
    x = pd.DataFrame({"a": rng.normal(size=4000), "b": rng.normal(size=4000)})
    x.loc[::7, "b"] = np.nan
    y = (x["a"] + rng.normal(scale=0.5, size=len(x)) > 1.5).astype(int).to_numpy()
    lr = LogisticBaseline(["a", "b"]).fit(x, y)
    again = LogisticBaseline.from_json(json.loads(json.dumps(lr.to_json())))
    assert np.allclose(again.score(x), lr.score(x))
    assert abs(lr.coef_[0]) > 5 * abs(lr.coef_[1])
    assert np.isfinite(lr.score(x)).all()


def test_logistic_log_odds_do_not_depend_on_how_many_rows_are_scored_at_once(monkeypatch):
    """Rows are standardised a block at a time to bound memory; a row's log-odds must be the
    same whatever block it falls in (thresholds are compared bit for bit across runs). BLAS takes
    rows in groups, so block sizes are multiples of 8: a block of 7 rows rounds differently."""
    import foreshock.models.baselines as baselines

    rng = np.random.default_rng(1)
    x = pd.DataFrame(rng.normal(size=(5000, 101)).astype(np.float32), columns=[f"f{i}" for i in range(101)])
    x.iloc[::13, 7] = np.nan
    y = (x["f0"] > 1.0).astype(int).to_numpy()
    lr = LogisticBaseline(list(x.columns)).fit(x, y)
    monkeypatch.setattr(baselines, "_BLOCK_ROWS", len(x))
    whole = lr.frame_log_odds(x)
    for rows in (8, 64, 1000, 4096):
        monkeypatch.setattr(baselines, "_BLOCK_ROWS", rows)
        np.testing.assert_array_equal(lr.frame_log_odds(x), whole)


def test_logistic_fits_the_rows_it_names_so_a_caller_reads_only_their_features():
    rng = np.random.default_rng(2)
    x = pd.DataFrame({"a": rng.normal(size=3000), "b": rng.normal(size=3000)})
    y = (x["a"] + rng.normal(scale=0.5, size=len(x)) > 1.0).astype(int).to_numpy()
    lr = LogisticBaseline(["a", "b"], max_rows=500, seed=3)
    rows = lr.rows_fitted(len(x))
    assert len(rows) == len(set(rows)) == 500
    assert np.array_equal(LogisticBaseline(["a", "b"], max_rows=500).rows_fitted(400), np.arange(400))
    whole = lr.fit(x, y)
    named = LogisticBaseline(["a", "b"], max_rows=500, seed=3).fit(x.iloc[rows], y[rows])
    np.testing.assert_array_equal(named.coef_, whole.coef_)
    assert not np.array_equal(LogisticBaseline(["a", "b"], max_rows=500, seed=4).fit(x, y).coef_, whole.coef_)


def test_logistic_fit_to_its_iteration_budget_warns_no_one(monkeypatch):
    """lbfgs reaching ``max_iter`` unconverged is the recipe, not a fault: on a fleet's month it
    does, and scikit-learn's warning would be printed on every ``train``. Other warnings pass."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    fit = LogisticRegression.fit

    def unconverged(self, *args, **kwargs):
        fitted = fit(self, *args, **kwargs)
        warnings.warn("lbfgs failed to converge after 200 iteration(s)", ConvergenceWarning, stacklevel=2)
        warnings.warn("something else", RuntimeWarning, stacklevel=2)
        return fitted

    monkeypatch.setattr(LogisticRegression, "fit", unconverged)
    rng = np.random.default_rng(3)
    x = pd.DataFrame({"a": rng.normal(size=500), "b": rng.normal(size=500)})
    y = (x["a"] > 1.0).astype(int).to_numpy()
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        LogisticBaseline(["a", "b"]).fit(x, y)
    assert [w.category for w in heard] == [RuntimeWarning]


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")


def test_the_logistic_fit_its_log_odds_and_the_platt_map_run_blas_on_one_thread(monkeypatch):
    """Their sums must round alike on any number of cores (:func:`one_blas_thread`): a caller
    that lets BLAS use two threads still gets one inside each of them."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    import foreshock.models.baselines as baselines
    from foreshock.models.train import platt_calibration

    seen: list[tuple[str, int]] = []
    fit, standardised = LogisticRegression.fit, baselines.LogisticBaseline._standardised

    def recording_fit(self, *args, **kwargs):
        seen.append(("fit", _blas_threads()))
        return fit(self, *args, **kwargs)

    def recording_standardised(self, x):
        seen.append(("log_odds", _blas_threads()))
        return standardised(self, x)

    monkeypatch.setattr(LogisticRegression, "fit", recording_fit)
    monkeypatch.setattr(baselines.LogisticBaseline, "_standardised", recording_standardised)
    rng = np.random.default_rng(4)
    x = pd.DataFrame({"a": rng.normal(size=2000), "b": rng.normal(size=2000)})
    y = (x["a"] > 1.0).astype(int).to_numpy()
    with threadpool_limits(2, user_api="blas"):
        assert _blas_threads() == 2  # the caller's setting, which each step must override
        lr = LogisticBaseline(["a", "b"]).fit(x, y)
        platt_calibration(lr.frame_log_odds(x), y)
        assert _blas_threads() == 2  # and give back
    assert [step for step, _ in seen] == ["fit", "log_odds", "fit"]
    assert [threads for _, threads in seen] == [1, 1, 1]


def test_rule_evidence_sums_each_rows_window_of_its_own_nodes_buckets():
    from foreshock.models.baselines import RuleEvidence

    rng = np.random.default_rng(5)
    minute, window = 60_000, 600_000
    gpu = pd.DataFrame({"node": rng.choice(["a", "b", "c"], 300), "ts": rng.integers(0, 400, 300) * minute,
                        "uncorrectable": rng.integers(0, 2, 300).astype(float),
                        "sbe": rng.integers(0, 50, 300).astype(float)})
    xid = pd.DataFrame({"node": ["b", "b", "c"], "ts": [5 * minute, 7 * minute, 0],
                        "critical": [1.0, 1.0, 1.0]})
    evidence = RuleEvidence(gpu, xid, window)
    rows = pd.DataFrame({"node": rng.choice(["a", "b", "d"], 500), "ts": rng.integers(0, 420, 500) * minute})
    for _ in range(2):  # the sorted buckets are built once, then read by every block of rows
        got = evidence.of(rows)
    for (node, ts), critical, sbe in zip(rows.itertuples(index=False), got["rule_critical"],
                                         got["rule_sbe_per_min"], strict=True):
        g = gpu[(gpu["node"] == node) & (gpu["ts"] > ts - window) & (gpu["ts"] <= ts)]
        x = xid[(xid["node"] == node) & (xid["ts"] > ts - window) & (xid["ts"] <= ts)]
        assert critical == g["uncorrectable"].sum() + x["critical"].sum()
        assert sbe == np.float32(g["sbe"].sum() / 10)
