"""The feature table: read in time order, a slice at a time, in one pass or several, it holds
the rows of every record computed at once; on disk it answers only for its own identity."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import foreshock.features.batch as batch
import foreshock.features.timeslices as timeslices
from foreshock import shipped
from foreshock.features import DEFAULT_FEATURE_SET as FS
from foreshock.features.batch import compute_features, peer_group, read_frames, write_feature_table
from foreshock.features.frames import Codes
from foreshock.features.table import DAY_MS, FeatureTable, FeatureTableError, TableIdentity, _read_partition
from foreshock.features.timeslices import time_slices
from foreshock.ingest.contract import RETURN_EVENTS
from foreshock.ingest.dataset import part_paths, read_events
from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

HOUR = 3_600_000


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """6 nodes x 30 hours from 20:00 (two UTC days), parts of 4,000 GPU rows, nodes that fail
    and come back."""
    sim = Simulator(
        load_profile(shipped.profile("llama3")),
        nodes=6,
        duration_ms=30 * HOUR,
        interval_ms=60_000,
        seed=10,
        rate_multiplier=400.0,
        start_ms=1_767_225_600_000 + 20 * HOUR,
        chunk_rows=2_000,
    )
    return write_dataset(sim, tmp_path_factory.mktemp("table") / "data", part_rows=4_000)


@pytest.fixture(scope="module")
def at_once(dataset) -> pd.DataFrame:
    """Every record of the dataset in memory, in one slice."""
    frames = read_frames(dataset, FS)
    return compute_features(**frames, events=read_events(dataset))


def test_the_dataset_spans_days_parts_and_returns(dataset, at_once):
    assert len(part_paths(dataset, "gpu")) >= 4
    assert at_once["ts"].floordiv(DAY_MS).nunique() == 3
    assert read_events(dataset)["event"].isin(RETURN_EVENTS).any()


def test_slices_end_on_bucket_boundaries_and_follow_each_other(dataset, monkeypatch):
    monkeypatch.setattr(timeslices, "SLICE_ROWS", 3_000)
    slices = list(time_slices(dataset, FS, Codes(), Codes()))
    assert len(slices) > 10 and slices[-1][1] == np.inf
    previous = -np.inf
    for columns, cut in slices:
        assert cut == np.inf or cut % FS.bucket_ms == 0
        for cols in columns.values():
            assert (cols["ts"] >= previous).all() and (cols["ts"] < cut).all()
        previous = cut
    rows = sum(len(c["ts"]) for columns, _ in slices for k, c in columns.items() if k == "gpu")
    assert rows == len(read_frames(dataset, FS)["gpu"])


def test_reading_in_small_slices_gives_every_record_at_once(dataset, at_once, monkeypatch):
    """Counter increases carry across slices, buckets never straddle two, and a day's grid
    starts at its first window: the table is the one of every record at once, to the bit."""
    monkeypatch.setattr(timeslices, "SLICE_ROWS", 3_000)
    pd.testing.assert_frame_equal(compute_features(dataset), at_once)


def test_several_passes_over_peer_groups_give_the_same_table(dataset, at_once, monkeypatch):
    monkeypatch.setattr(batch, "_PASS_BYTES", 1)  # as many passes as peer groups
    plan = batch._plan(FS, (0, 1), 6, 60_000, None, None, None)
    assert plan.passes == FS.peer_partitions
    pd.testing.assert_frame_equal(compute_features(dataset, nodes_per_group=1), at_once)


def test_parts_without_statistics_are_read_in_time_order_too(dataset, at_once, tmp_path, monkeypatch):
    """Parts written without statistics (another writer's): the dataset's extent comes from
    their ts columns, and the table is the same, still read a slice at a time."""
    bare = tmp_path / "bare"
    shutil.copytree(dataset, bare)
    for kind in ("gpu", "xid", "link"):
        for path in part_paths(bare, kind):
            table = pq.read_table(path)
            pq.write_table(table, path, write_statistics=False, row_group_size=1_500)
            assert pq.ParquetFile(path).metadata.row_group(0).column(0).statistics is None
    monkeypatch.setattr(timeslices, "SLICE_ROWS", 3_000)
    assert len(list(time_slices(bare, FS, Codes(), Codes()))) > 10
    pd.testing.assert_frame_equal(compute_features(bare), at_once)


def test_the_table_on_disk_holds_the_rows_by_peer_group_and_day(dataset, at_once, tmp_path):
    table = write_feature_table(dataset, tmp_path / "t", dataset_fingerprint="f00d")
    assert table.identity == TableIdentity(FS.hash, 60_000, "f00d")
    assert table.feature_names == FS.names and table.rows == len(at_once)
    want = at_once.astype({n: np.float32 for n in FS.names})
    pd.testing.assert_frame_equal(table.read_all(), want)
    for p in table.partitions:
        rows = table.read(p)
        assert len(rows) == p.rows and rows["ts"].floordiv(DAY_MS).eq(p.day).all()
        assert {peer_group(n, FS) for n in rows["node"]} == {p.group}
        assert (tmp_path / "t" / p.path).is_file()
    assert len({p.group for p in table.partitions}) > 1


def test_a_partition_is_read_whole_so_its_columns_reach_numpy_without_a_copy(tmp_path):
    """A 2,048-node day's partition holds hundreds of thousands of rows: read in the dataset
    reader's 128 Ki-row batches, every column read would be joined again by a copy."""
    rows = 300_000
    frame = pd.DataFrame({"ts": np.arange(rows, dtype=np.int64), "x": np.arange(rows, dtype=np.float32)})
    frame.to_parquet(tmp_path / "part.parquet", index=False)
    table = _read_partition(tmp_path / "part.parquet", ["x"])
    assert table.column_names == ["x"]
    assert table.column("x").num_chunks == 1
    x = table.column("x").chunk(0).to_numpy(zero_copy_only=True)
    np.testing.assert_array_equal(x, frame["x"].to_numpy())
    assert _read_partition(tmp_path / "part.parquet", None).column_names == ["ts", "x"]


def test_the_table_answers_only_for_its_identity(dataset, tmp_path):
    write_feature_table(dataset, tmp_path / "t", dataset_fingerprint="f00d")
    FeatureTable.open(tmp_path / "t", expect=TableIdentity(FS.hash, 60_000, "f00d"))
    with pytest.raises(FeatureTableError, match="dataset_fingerprint is 'f00d', expected 'beef'"):
        FeatureTable.open(tmp_path / "t", expect=TableIdentity(FS.hash, 60_000, "beef"))
    with pytest.raises(FeatureTableError, match="feature_set_hash .*cadence_ms is 60000, expected 300000"):
        FeatureTable.open(tmp_path / "t", expect=TableIdentity("another", 300_000, "f00d"))


def test_an_unfinished_table_is_refused_then_replaced_and_a_finished_one_kept(dataset, tmp_path):
    path = tmp_path / "t"
    write_feature_table(dataset, path, dataset_fingerprint="f00d")
    meta = json.loads((path / "table.json").read_text())
    (path / "table.json").unlink()  # as if the writer had died before the end
    with pytest.raises(FeatureTableError, match="not a complete feature table"):
        FeatureTable.open(path)
    again = write_feature_table(dataset, path, dataset_fingerprint="f00d")
    assert again.rows == sum(p["rows"] for p in meta["partitions"])
    with pytest.raises(FeatureTableError, match="already holds a feature table"):
        write_feature_table(dataset, path, dataset_fingerprint="f00d")
    assert FeatureTable.open(path).rows == again.rows  # the refusal left it whole
    again.attach("notes", pd.DataFrame({"a": [1, 2]}))  # what else the table's readers read
    pd.testing.assert_frame_equal(FeatureTable.open(path).attached("notes"), pd.DataFrame({"a": [1, 2]}))
    assert again.attached("other") is None
    replaced = write_feature_table(dataset, path, dataset_fingerprint="f00d", overwrite=True)
    assert replaced.rows == again.rows and replaced.attached("notes") is None
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(FeatureTableError, match="not a feature table's"):
        write_feature_table(dataset, other, dataset_fingerprint="f00d")
    assert (other / "todo.txt").read_text() == "mine"
    shutil.rmtree(path)
