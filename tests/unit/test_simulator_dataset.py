"""The dataset layout (the contract with features and models), determinism, and the CLI."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.commands.simulate import profile_path
from foreshock.ingest.contract import GPU_FIELDS, LINK_COUNTERS
from foreshock.ingest.dataset import (
    MANIFEST_KEYS,
    DatasetError,
    DatasetWriter,
    part_paths,
    read_events,
    read_ground_truth,
    read_manifest,
    read_table,
    row_groups,
)
from foreshock.ingest.simulator import Simulator, load_profile, parse_profile, write_dataset

HOUR = 3_600_000


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 nodes x 2 days of llama3 at 100x the rate, in small chunks so there are several parts."""
    sim = Simulator(
        load_profile(profile_path("llama3")),
        nodes=12,
        duration_ms=48 * HOUR,
        interval_ms=60_000,
        seed=7,
        rate_multiplier=100,
        chunk_rows=40_000,
    )
    out = tmp_path_factory.mktemp("ds")
    write_dataset(sim, out, part_rows=100_000)
    return sim, out


def test_manifest_has_the_layout_keys_and_the_multiplier(dataset):
    sim, out = dataset
    m = read_manifest(out)
    assert set(MANIFEST_KEYS) <= set(m)
    assert (m["nodes"], m["gpus_per_node"], m["interval_ms"], m["seed"]) == (12, 8, 60_000, 7)
    assert m["end_ms"] - m["start_ms"] == 48 * HOUR
    assert m["rate_multiplier"] == 100 and m["profile"] == "llama3"


def test_gpu_table_columns_order_and_dtypes(dataset):
    sim, out = dataset
    spans = {}
    for table in ("gpu", "link"):  # part N of every table covers the same time span
        spans[table] = [
            (t.column("ts")[0].as_py(), t.column("ts")[-1].as_py())
            for t in map(pq.read_table, part_paths(out, table))
        ]
    assert spans["gpu"] == spans["link"] and len(spans["gpu"]) > 1
    assert all(a[1] < b[0] for a, b in zip(spans["gpu"], spans["gpu"][1:], strict=False))
    assert len(part_paths(out, "xid")) == len(spans["gpu"])
    gpu = read_table(out, "gpu")
    assert list(gpu.columns) == ["node", "ts", "gpu", *GPU_FIELDS]
    assert gpu.ts.dtype == np.int64 and gpu.gpu.dtype == np.int64
    assert pd.api.types.is_string_dtype(gpu.node)
    assert all(gpu[f].dtype in (np.float64, np.int64) for f in GPU_FIELDS)
    keys = gpu[["ts", "node", "gpu"]]
    assert keys.equals(keys.sort_values(["ts", "node", "gpu"], ignore_index=True))
    assert gpu.node.str.fullmatch(r"node\d{4}").all()


def test_link_and_xid_tables(dataset):
    _, out = dataset
    link = read_table(out, "link")
    assert list(link.columns) == ["node", "ts", "port", "kind", "state", *LINK_COUNTERS]
    assert set(link.kind) == {"ib"}
    xid = read_table(out, "xid")
    assert list(xid.columns) == ["node", "ts", "gpu", "xid", "count", "message", "pci_bus_id"]
    assert xid.ts.is_monotonic_increasing


def test_ground_truth_and_events_agree(dataset):
    sim, out = dataset
    gt = read_ground_truth(out)
    ev = read_events(out)
    assert len(gt) == len(sim.schedule.failures) >= 5
    failed = ev[ev.event == "failed"].reset_index(drop=True)
    assert failed[["node", "ts", "cause"]].equals(gt[["node", "ts", "cause"]])
    assert (gt.precursor_start_ms.isna() == ~gt.detectable).all()
    assert (gt.precursor_start_ms.dropna() < gt.ts[gt.detectable]).all()
    # each foreshock's strength, as the telemetry was drawn with it (foreshock.models.analysis.lead_bound)
    assert (gt.precursor_strength.isna() == ~gt.detectable).all()
    drawn = {(sim.node_names[e.node], e.end_ms): e.strength for e in sim.schedule.episodes if e.failure}
    recorded = gt[gt.detectable].set_index(["node", "ts"])["precursor_strength"]
    assert recorded.to_dict() == drawn
    repaired = ev[ev.event == "repaired"]
    assert len(repaired) == (gt.repair_ts < read_manifest(out)["end_ms"]).sum()


def test_no_samples_while_down_and_failure_xids_at_the_failure_instant(dataset):
    sim, out = dataset
    gpu = read_table(out, "gpu", columns=["node", "ts"])
    link = read_table(out, "link", columns=["node", "ts"])
    xid = read_table(out, "xid")
    for f in read_ground_truth(out).itertuples():
        for table in (gpu, link):
            assert not ((table.node == f.node) & (table.ts >= f.ts) & (table.ts < f.repair_ts)).any()
        codes = load_profile(profile_path("llama3")).failures
        expected = next(c.xid for c in codes if c.cause == f.cause)
        at_failure = xid[(xid.node == f.node) & (xid.ts == f.ts)]
        assert set(at_failure.xid) == set(expected)


def test_counters_are_monotonic_across_parts_except_after_repair(dataset):
    sim, out = dataset
    gpu = read_table(
        out, "gpu", columns=["node", "ts", "gpu", "ecc_sbe_agg_total", "total_energy_consumption"]
    )
    for _, g in gpu.groupby(["node", "gpu"]):
        assert (np.diff(g.ecc_sbe_agg_total.to_numpy()) >= 0).all()
        assert (np.diff(g.total_energy_consumption.to_numpy()) > 0).all()


def test_read_table_selects_columns_and_time(dataset):
    sim, out = dataset
    lo, hi = sim.start_ms + 3 * HOUR, sim.start_ms + 5 * HOUR
    part = read_table(out, "gpu", columns=["node", "gpu_temp"], start_ms=lo, end_ms=hi)
    assert list(part.columns) == ["node", "gpu_temp"]
    full = read_table(out, "gpu", columns=["ts"])
    assert len(part) == ((full.ts >= lo) & (full.ts < hi)).sum() > 0


def test_row_groups_come_in_time_order_and_parts_without_the_wanted_columns_go_unread(dataset, tmp_path):
    _, out = dataset
    groups = list(row_groups(out, "gpu", ["ts", "node", "no_such_column"], dictionary=["node"]))
    assert len(groups) >= len(part_paths(out, "gpu"))
    assert all(g.column_names == ["ts", "node"] for g in groups)  # only the columns a part holds
    assert pa.types.is_dictionary(groups[0].schema.field("node").type)
    ts = np.concatenate([g.column("ts").to_numpy() for g in groups])
    assert (np.diff(ts) >= 0).all() and len(ts) == len(read_table(out, "gpu", columns=["ts"]))
    # a part without the column asked for is skipped before a row of it is read
    parts = tmp_path / "gpu"
    parts.mkdir()
    pq.write_table(pa.table({"ts": [1, 2], "node": ["a", "b"]}), parts / "part-00000.parquet")
    pq.write_table(pa.table({"ts": [3], "node": ["a"], "sbe": [1.0]}), parts / "part-00001.parquet")
    kept = list(row_groups(tmp_path, "gpu", ["ts", "sbe"], any_of=["sbe"]))
    assert [g.to_pydict() for g in kept] == [{"ts": [3], "sbe": [1.0]}]


def test_writer_refuses_an_existing_dataset_and_a_bad_layout(dataset, tmp_path):
    _, out = dataset
    with pytest.raises(DatasetError, match="already holds"):
        DatasetWriter(out)
    with pytest.raises(DatasetError, match="no manifest"):
        read_manifest(tmp_path)
    with pytest.raises(DatasetError, match="must start with"):
        DatasetWriter(tmp_path / "x").write_part("gpu", pa.table({"ts": [1], "node": ["a"], "gpu": [0]}))


def test_same_seed_same_bytes_through_the_cli(tmp_path):
    runner = CliRunner()
    args = [
        "simulate",
        "--profile",
        "llama3",
        "--nodes",
        "4",
        "--days",
        "0.25",
        "--interval",
        "30s",
        "--seed",
        "7",
        "--rate-multiplier",
        "200",
    ]
    outs = []
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        result = runner.invoke(
            app, [*args[:-3], seed, "--rate-multiplier", "200", "--out", str(tmp_path / name)]
        )
        assert result.exit_code == 0, result.output
        outs.append(
            {
                p.relative_to(tmp_path / name): p.read_bytes()
                for p in sorted((tmp_path / name).rglob("*"))
                if p.is_file()
            }
        )
    assert outs[0] == outs[1]
    assert outs[0].keys() == outs[2].keys() and outs[0] != outs[2]
    assert (
        json.loads(outs[0][next(k for k in outs[0] if k.name == "manifest.json")])["rate_multiplier"] == 200
    )


def test_cli_refuses_a_bad_profile_by_name(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text("[cluster]\ngpus_per_node = 8\n")
    result = CliRunner().invoke(app, ["simulate", "--profile", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "cluster.interruptions_per_gpu_day" in result.output


def test_lost_scrapes_drop_rows_and_change_nothing_else():
    base = tomllib.loads(profile_path("llama3").read_text())
    runs = []
    for lost in (0.0, 0.2):
        base["noise"]["missing_scrape_fraction"] = lost
        sim = Simulator(
            parse_profile(base, "llama3"),
            nodes=6,
            duration_ms=6 * HOUR,
            interval_ms=30_000,
            seed=4,
            rate_multiplier=300,
        )
        chunks = list(sim.chunks())
        gpu = pa.concat_tables([c.gpu for c in chunks]).to_pandas()
        xid = pa.concat_tables([c.xid for c in chunks]).to_pandas()
        runs.append((sim.schedule, gpu, xid))
    (sched_all, gpu_all, xid_all), (sched_lost, gpu_lost, xid_lost) = runs
    assert sched_all == sched_lost and xid_all.equals(xid_lost)
    assert 0.75 < len(gpu_lost) / len(gpu_all) < 0.85
    kept = gpu_all.merge(gpu_lost[["node", "ts", "gpu"]], on=["node", "ts", "gpu"])
    assert kept.equals(gpu_lost)
