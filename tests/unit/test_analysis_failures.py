"""The failure-analysis loaders behind notebooks/failure_analysis.ipynb, on a tiny simulated run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foreshock.ingest.collectors.xid_policy import load_xid_policy
from foreshock.ingest.dataset import read_ground_truth, read_manifest, read_table
from foreshock.ingest.simulator import Simulator, load_profile, write_dataset
from foreshock.models.analysis import failures as fa

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def profile():
    return load_profile(ROOT / "datasets" / "profiles" / "llama3.toml")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, profile) -> Path:
    sim = Simulator(
        profile, nodes=6, duration_ms=12 * 3_600_000, interval_ms=60_000, seed=11, rate_multiplier=1500.0
    )
    return write_dataset(sim, tmp_path_factory.mktemp("fa") / "data")


def test_failure_mix_counts_every_failure_and_keeps_profile_shares(dataset: Path, profile) -> None:
    truth = read_ground_truth(dataset)
    assert len(truth) >= 3
    shares = fa.profile_shares(profile)
    mix = fa.failure_mix(truth, shares)
    assert mix["failures"].sum() == len(truth)
    assert mix["observed_share"].sum() == pytest.approx(1.0)
    assert set(mix["cause"]) >= set(shares)
    by_cause = mix.set_index("cause")
    for cause, n in truth["cause"].value_counts().items():
        assert by_cause.loc[cause, "failures"] == n
    assert by_cause.loc["nccl_watchdog_timeout", "profile_share"] == pytest.approx(
        shares["nccl_watchdog_timeout"]
    )
    assert list(mix["profile_share"]) == sorted(mix["profile_share"], reverse=True)
    assert fa.plot_failure_mix(mix).axes[0].get_title() == "Failure mix by cause: observed vs profile"


def test_failure_mix_lists_a_cause_missing_from_the_profile() -> None:
    truth = pd.DataFrame({"cause": ["a", "a", "zz"]})
    mix = fa.failure_mix(truth, {"a": 0.75, "b": 0.25}).set_index("cause")
    assert mix.loc["zz", "failures"] == 1 and mix.loc["zz", "profile_share"] == 0.0
    assert mix.loc["b", "failures"] == 0 and mix.loc["b", "expected"] == pytest.approx(0.75)


def test_foreshock_example_and_healthy_node(dataset: Path) -> None:
    truth, manifest = read_ground_truth(dataset), read_manifest(dataset)
    failure = fa.pick_foreshock_example(truth, manifest["start_ms"], hours_before=1.0)
    assert failure["detectable"] and pd.notna(failure["precursor_start_ms"])
    warned = truth[truth["precursor_start_ms"].notna()]
    assert (
        failure["ts"] - failure["precursor_start_ms"] <= (warned["ts"] - warned["precursor_start_ms"]).max()
    )
    start, end = int(failure["ts"]) - 3_600_000, int(failure["ts"]) + 600_000
    healthy = fa.pick_healthy_node(truth, manifest["nodes"], start, end)
    busy = truth[(truth["ts"] < end) & (truth["repair_ts"] >= start)]
    assert healthy not in set(busy["node"])

    signals = fa.node_signals(dataset, failure["node"], start, end)
    assert list(signals.columns) == [s.label for s in fa.SIGNALS]
    counters = [s.label for s in fa.SIGNALS if s.counter]
    assert (signals[counters].iloc[0] == 0).all()  # increases since the window's first sample
    gpu = read_table(dataset, "gpu", columns=["node", "ts", "gpu_temp"], start_ms=start, end_ms=end)
    hottest = gpu[gpu["node"] == failure["node"]].groupby("ts")["gpu_temp"].max()
    np.testing.assert_array_equal(signals[fa.SIGNALS[0].label].dropna().to_numpy(), hottest.to_numpy())

    fig = fa.plot_foreshocks(signals, fa.node_signals(dataset, healthy, start, end), failure, healthy)
    assert fig._suptitle.get_text().startswith(f"Foreshocks of {failure['node']}")
    lead = fa.PRECURSOR_SIGNAL[failure["precursor"]].label
    assert [ax.get_title() for ax in fig.axes if ax.get_title().endswith("<- this precursor")] == [
        f"{lead}  <- this precursor"
    ]


def test_pick_foreshock_example_needs_a_warned_failure() -> None:
    truth = pd.DataFrame(
        {
            "node": ["node0000"],
            "ts": [10],
            "detectable": [False],
            "precursor_start_ms": pd.array([None], dtype="Int64"),
        }
    )
    with pytest.raises(ValueError, match="announced"):
        fa.pick_foreshock_example(truth, 0)


def test_xid_frequency_sums_counts_and_reads_the_policy() -> None:
    xid = pd.DataFrame({"node": ["n1", "n1", "n2", "n3"], "xid": [13, 79, 13, 99999], "count": [5, 1, 2, 1]})
    freq = fa.xid_frequency(xid, load_xid_policy()).set_index("xid")
    assert freq.loc[13, "events"] == 7 and freq.loc[13, "nodes"] == 2
    assert freq.loc[13, "severity"] == "NONFATAL" and freq.loc[79, "severity"] == "FATAL"
    assert freq.loc[99999, "severity"] == "UNKNOWN"
    assert list(freq.index)[0] == 13
    fig = fa.plot_xid_frequency(freq.reset_index())
    assert fig.axes[0].get_title() == "Xid codes by frequency and severity"


def test_time_between_failures(dataset: Path) -> None:
    truth, manifest = read_ground_truth(dataset), read_manifest(dataset)
    gaps, mean_gap = fa.time_between_failures(dataset)
    assert len(gaps) == len(truth) - 1
    assert gaps.sum() == pytest.approx((truth["ts"].max() - truth["ts"].min()) / 3_600_000)
    assert (gaps >= 0).all()
    assert mean_gap == pytest.approx((manifest["end_ms"] - manifest["start_ms"]) / 3_600_000 / len(truth))
    assert (
        fa.plot_time_between_failures(gaps, mean_gap).axes[0].get_title().startswith("Time between failures")
    )
