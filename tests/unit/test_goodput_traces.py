"""Failure traces: the real InfiniteHBD trace, profile draws, simulated ground truth, resizing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foreshock.models.goodput import from_ground_truth, from_profile, load_infinitehbd, load_profile, resize
from foreshock.models.goodput.compare import OperatingPoint, sweep

REPO = Path(__file__).resolve().parents[2]
INFINITEHBD = REPO / "datasets" / "traces" / "infinitehbd" / "fault_trace.json"
PROFILE = {"cluster": {"gpus_per_node": 8, "interruptions_per_gpu_day": 0.000474, "repair_median_hours": 4.0},
           "failure": [{"cause": "gpu", "share": 0.75}, {"cause": "software", "share": 0.25,
                                                          "repair_median_hours": 0.25}]}


def test_infinitehbd_trace_pairs_faults_and_matches_its_published_statistics():
    trace = load_infinitehbd(INFINITEHBD)
    stats = json.loads((INFINITEHBD.parent / "fault_statistics.json").read_text())
    published = sum(level["LevelTotal"] for level in stats.values())
    assert published == 584
    # Two faults start while their node is still down from an earlier one: they never reach the job.
    assert len(trace) == published - 2
    assert (trace.nodes, trace.gpus, round(trace.days)) == (400, 3200, 349)
    assert np.all(trace.repair_s >= 0) and np.all(np.diff(trace.fail_s) >= 0)
    # Causes are the infinitehbd profile's (the simulator's calibration map): GPU ECC = DBE + SBE.
    gpu = stats["Hardware Failure"]["GPU"]
    ecc = gpu["GPU DBE(Double Bit ECC) > Threshold"] + gpu["GPU SBE(Single Bit ECC) > Threshold"]
    assert (trace.cause == "gpu_ecc").sum() == ecc
    assert trace.mtbf_s / 3600 == pytest.approx(349 * 24 / 582)


def test_profile_draw_has_the_profiles_rate_mix_and_repair_times():
    trace = from_profile(PROFILE, gpus=16384, days=365, seed=1)
    expected = 0.000474 * 16384 * 365
    assert abs(len(trace) - expected) < 4 * np.sqrt(expected)
    assert np.mean(trace.cause == "gpu") == pytest.approx(0.75, abs=0.02)
    software = trace.repair_s[trace.cause == "software"]
    assert np.median(software) / 3600 == pytest.approx(0.25, rel=0.15)
    assert trace.nodes == 2048 and trace.node.max() < 2048
    # Same seed, same trace.
    again = from_profile(PROFILE, gpus=16384, days=365, seed=1)
    assert np.array_equal(trace.fail_s, again.fail_s)


def test_checked_in_llama3_profile_reads():
    profile = load_profile(REPO / "datasets" / "profiles" / "llama3.toml")
    trace = from_profile(profile, gpus=16384, days=54, seed=0)
    assert abs(len(trace) - 419) < 4 * np.sqrt(419)  # the published 419 interruptions in 54 days


def test_ground_truth_of_a_simulated_dataset(tmp_path):
    start = 1_700_000_000_000
    manifest = {"schema_version": 1, "profile": "llama3", "nodes": 16, "gpus_per_node": 8, "start_ms": start,
                "end_ms": start + 86_400_000, "interval_ms": 30_000, "seed": 0}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    pd.DataFrame({"node": ["node0003", "node0011"], "ts": [start + 7_200_000, start + 3_600_000],
                  "cause": ["gpu_hbm3_memory", "nic"], "detectable": [True, False],
                  "precursor": ["ecc", "none"],
                  "precursor_start_ms": [start, None], "repair_ts": [start + 9_000_000, start + 3_700_000]},
                 ).to_parquet(tmp_path / "ground_truth.parquet")
    trace = from_ground_truth(tmp_path)
    assert trace.gpus == 128 and trace.duration_s == 86_400
    assert list(trace.fail_s) == [3600.0, 7200.0] and list(trace.repair_s) == [100.0, 1800.0]
    assert list(trace.node) == [11, 3] and list(trace.cause) == ["nic", "gpu_hbm3_memory"]


def test_resize_keeps_the_per_node_failure_rate():
    base = load_infinitehbd(INFINITEHBD)
    per_node = len(base) / base.nodes
    for gpus in (800, 16384):
        trace = resize(base, gpus, seed=2)
        assert trace.gpus == gpus and trace.duration_s == base.duration_s
        assert len(trace) / trace.nodes == pytest.approx(per_node, rel=0.35)
        assert np.all(np.diff(trace.fail_s) >= 0) and trace.node.max() < trace.nodes
    assert resize(base, 3200) is base


def test_operating_point_from_metrics_uses_the_model_object(tmp_path):
    def point(recall, leads):
        return {"pr_auc": 0.5, "roc_auc": 0.9, "recall_at_budget": recall, "precision_at_budget": 0.4,
                "false_alarms_per_1000_node_days": 2.5, "median_lead_minutes": 42.0, "lead_minutes": leads,
                "recall_by_cause": {"nic": {"caught": 1, "failures": 10, "recall": 0.1},
                                    "ssd": {"caught": 1, "failures": 1, "recall": 1.0}}}
    metrics = {"_info": {}, "model": point(0.7, [40, 41, 42, 43, 44]), "rules": point(0.3, [42]),
               "logistic": point(None, [])}
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics))
    op = OperatingPoint.from_metrics(path)
    assert (op.recall, op.false_alarms_per_1000_node_days) == (0.7, 2.5)
    assert op.lead_time_s == (2400.0, 2460.0, 2520.0, 2580.0, 2640.0)  # the observed leads
    # A cause seen once does not override the overall recall; one seen ten times does.
    assert list(op.recall_for(np.array(["nic", "ssd", "gpu"], dtype=object))) == [0.1, 0.7, 0.7]
    rules = OperatingPoint.from_metrics(metrics, "rules")
    assert (rules.recall, rules.lead_time_s) == (0.3, 42 * 60.0)  # too few leads: the median
    with pytest.raises(ValueError):
        OperatingPoint.from_metrics(metrics, "logistic")


def test_sweep_gives_ettr_against_size_and_recall():
    table = sweep(lambda g: from_profile(PROFILE, gpus=g, days=365, seed=0), [1024, 8192], [0.0, 0.5, 1.0])
    fs = table[table["strategy"] == "foreshock"]
    assert len(fs) == 6 and set(table["strategy"]) == {"fixed", "young_daly", "foreshock", "oracle"}
    for _, rows in fs.groupby("gpus"):
        assert rows.sort_values("recall")["ettr"].is_monotonic_increasing
    # Bigger jobs fail more often, so lose a larger share of their time.
    fixed = table[table["strategy"] == "fixed"].set_index("gpus")["ettr"]
    assert fixed[8192] < fixed[1024]
