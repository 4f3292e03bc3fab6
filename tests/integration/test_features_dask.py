"""The batch engine on simulator output: the feature table written by a real LocalCluster (several
worker processes, each writing its own partitions) holds the pandas engine's rows; the online
engine replaying the same dataset in time order, node events included, gives the same rows; the
CLI writes the table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.batch import compute_features, read_frames, write_feature_table
from foreshock.features.online import OnlineFeatureEngine
from foreshock.features.table import FeatureTable
from foreshock.ingest.contract import RETURN_EVENTS
from foreshock.ingest.dataset import read_events, read_ground_truth
from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

pytestmark = pytest.mark.integration

PROFILE = Path(__file__).resolve().parents[2] / "datasets" / "profiles" / "llama3.toml"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """6 nodes x 8 GPUs for 4 simulated hours, failure rate raised so precursors show."""
    out = tmp_path_factory.mktemp("sim") / "data"
    sim = Simulator(
        load_profile(PROFILE),
        nodes=6,
        duration_ms=4 * 3_600_000,
        interval_ms=30_000,
        seed=10,  # two failures, one of them repaired within the 4 hours
        rate_multiplier=400.0,
    )
    write_dataset(sim, out)
    return out


@pytest.fixture(scope="module")
def pandas_table(dataset) -> pd.DataFrame:
    return compute_features(dataset)


def test_dask_workers_write_the_table_of_the_pandas_engine(dataset, pandas_table, tmp_path):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        before = set(client.run(lambda: __import__("os").getpid()).values())
        table = write_feature_table(
            dataset, tmp_path / "table", dataset_fingerprint="x", client=client, nodes_per_group=2
        )
        assert len(before) == 2
    assert table.meta["passes"] == 2  # one pass per worker, each over its own peer groups
    assert table.read_all()["node"].nunique() == 6
    pd.testing.assert_frame_equal(table.read_all(), _float32(pandas_table))


def _float32(table: pd.DataFrame) -> pd.DataFrame:
    return table.astype({n: np.float32 for n in DEFAULT_FEATURE_SET.names})


def test_groups_of_nodes_read_separately_give_the_same_table(dataset, pandas_table):
    pd.testing.assert_frame_equal(compute_features(dataset, nodes_per_group=4), pandas_table)


def test_table_shape_and_precursors_show(dataset, pandas_table):
    assert list(pandas_table.columns) == ["node", "ts", *DEFAULT_FEATURE_SET.names]
    assert (pandas_table["ts"] % 60_000 == 0).all()
    assert not pandas_table.duplicated(["node", "ts"]).any()
    assert pandas_table["gpu_temp__mean__30m"].between(10, 120).all()
    truth = read_ground_truth(dataset)
    assert len(truth), "the raised failure rate should inject failures"
    signals = [c for c in pandas_table.columns if "increase" in c or "__count__" in c]
    assert (pandas_table[signals].fillna(0).to_numpy() > 0).any()


def test_online_replay_of_the_dataset_equals_batch(dataset, pandas_table):
    frames = read_frames(dataset, DEFAULT_FEATURE_SET)
    frames["events"] = read_events(dataset)  # where windows start afresh
    assert frames["events"]["event"].isin(RETURN_EVENTS).any(), "no node came back: nothing cut"
    engine = OnlineFeatureEngine(tolerance_ms=0)
    ticks = np.sort(pandas_table["ts"].unique())
    start = min(int(f["ts"].min()) for f in frames.values() if len(f))
    checked = 0
    for lo in range(start, int(ticks[-1]), 5 * 60_000):  # 5-minute micro-batches, in time order
        engine.update_frames({k: f[(f["ts"] >= lo) & (f["ts"] < lo + 5 * 60_000)] for k, f in frames.items()})
        t = (lo // 60_000 + 5) * 60_000
        if t in set(ticks[::17]):
            want = pandas_table[pandas_table["ts"] == t].reset_index(drop=True)
            got = engine.features_at(t)
            assert got["node"].tolist() == want["node"].tolist()
            a, b = (
                got[DEFAULT_FEATURE_SET.names].to_numpy(float),
                want[DEFAULT_FEATURE_SET.names].to_numpy(float),
            )
            assert np.isclose(a, b, rtol=1e-9, atol=0, equal_nan=True).all()
            checked += 1
    assert checked >= 2 and engine.late_records == 0


def test_cli_writes_the_table(dataset, pandas_table, tmp_path):
    out = tmp_path / "features"
    result = CliRunner().invoke(app, ["features", "--data", str(dataset), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert DEFAULT_FEATURE_SET.hash[:12] in result.output
    table = FeatureTable.open(out)
    assert table.identity.feature_set_hash == DEFAULT_FEATURE_SET.hash and table.identity.cadence_ms == 60_000
    pd.testing.assert_frame_equal(table.read_all(), _float32(pandas_table))
    again = CliRunner().invoke(app, ["features", "--data", str(dataset), "--out", str(out)])
    assert again.exit_code == 2 and "already holds a feature table" in again.output
