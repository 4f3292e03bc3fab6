"""Tests that catch leakage: shuffled labels fall to the base rate; a future-reading feature fails."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.models.baselines import rule_inputs
from foreshock.models.frame import build_labelled
from foreshock.models.leakage import LeakageError, assert_point_in_time, point_in_time_violations
from foreshock.models.train import train_on
from tests.fixtures.model_data import MINUTE, START_MS


def test_shuffled_labels_fall_to_the_base_rate(synthetic_cluster):
    data = build_labelled(synthetic_cluster.data_dir, 3_600_000, features=synthetic_cluster.features)
    _, real, _ = train_on(data)
    cols = ["label", "failure_ts", "cause", "detectable"]
    perm = np.random.default_rng(1).permutation(len(data.frame))
    shuffled = data.frame[cols].iloc[perm].reset_index(drop=True)
    data.frame = pd.concat([data.frame.drop(columns=cols), shuffled], axis=1)
    _, noise, _ = train_on(data)
    base = noise["model"]["base_rate"]
    assert real["model"]["pr_auc"] > 5 * real["model"]["base_rate"]
    assert noise["model"]["pr_auc"] < 1.5 * base
    assert abs(noise["model"]["roc_auc"] - 0.5) < 0.06


def _causal(data_dir) -> pd.DataFrame:
    """Features that only read telemetry at or before each row (the rules' evidence on a grid)."""
    nodes = [f"node{i:04d}" for i in range(24)]
    ticks = START_MS + np.arange(0, 3 * 1440, 5, dtype=np.int64) * MINUTE
    rows = pd.DataFrame({"node": np.repeat(nodes, len(ticks)), "ts": np.tile(ticks, len(nodes))})
    return pd.concat([rows, rule_inputs(data_dir, rows, MINUTE)], axis=1)


def _future_reading(data_dir) -> pd.DataFrame:
    """The same plus one feature that peeks 30 minutes ahead (a forward shift)."""
    f = _causal(data_dir)
    return f.assign(sbe_next_30m=f.groupby("node")["rule_sbe_per_min"].shift(-6))


def test_future_reading_feature_is_caught(synthetic_cluster, tmp_path):
    cutoff = START_MS + 36 * 60 * MINUTE
    assert point_in_time_violations(_causal, synthetic_cluster.data_dir, tmp_path / "a", cutoff) == {}
    bad = point_in_time_violations(_future_reading, synthetic_cluster.data_dir, tmp_path / "b", cutoff)
    assert set(bad) == {"sbe_next_30m"}
    with pytest.raises(LeakageError, match="sbe_next_30m"):
        assert_point_in_time(_future_reading, synthetic_cluster.data_dir, tmp_path / "c", [cutoff])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A tiny real simulator dataset (8 nodes, 12 h, failures forced often)."""
    from typer.testing import CliRunner

    from foreshock.cli import app

    out = tmp_path_factory.mktemp("sim") / "data"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--profile",
            "llama3",
            "--nodes",
            "8",
            "--duration",
            "12h",
            "--interval",
            "60s",
            "--seed",
            "5",
            "--rate-multiplier",
            "3000",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_the_feature_engine_passes_and_an_injected_future_feature_fails(simulated, tmp_path):
    from foreshock.features.batch import compute_features
    from foreshock.ingest.dataset import read_events, read_manifest

    def engine(d):
        return compute_features(d, cadence_ms=60_000)

    def engine_plus_future(d):
        f = engine(d).sort_values(["node", "ts"])
        return f.assign(xid_fatal_next_10m=f.groupby("node")["xid_fatal__count__1h"].shift(-10))

    failures = read_events(simulated).query("event == 'failed'")
    assert len(failures) > 0
    start = read_manifest(simulated)["start_ms"]
    # cut just before a failure: its fatal Xid lies after the cut
    cutoff = int(failures["ts"].iloc[len(failures) // 2]) - 60_000
    assert cutoff > start
    assert point_in_time_violations(engine, simulated, tmp_path / "a", cutoff) == {}
    bad = point_in_time_violations(engine_plus_future, simulated, tmp_path / "b", cutoff)
    assert "xid_fatal_next_10m" in bad
