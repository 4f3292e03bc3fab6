"""``foreshock demo --no-live`` end to end on a small cluster, checked against the ground truth.

One run (module fixture) of the real CLI in a subprocess: simulate the cluster and a history of
another seed, train on the history and register in the embedded MLflow store, replay the
cluster's last day through the predictor and the dry-run mitigator, report. The report's figures
are recomputed here from what the run left on disk (ground truth, risk scores, audit log,
registry) so a wrong join or a miscount fails the test.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from foreshock.ingest.dataset import read_ground_truth, read_manifest
from foreshock.models.frame import dataset_fingerprint
from foreshock.models.registry import champion_version, sqlite_uri

pytestmark = pytest.mark.e2e

DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo") / "run"
    args = [
        "demo",
        "--no-live",
        "--nodes",
        "16",
        "--days",
        "2",
        "--seed",
        "5",
        "--rate-multiplier",
        "400",
        "--spares",
        "2",
        "--history-nodes",
        "48",
        "--out",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "foreshock", *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def test_report_counts_the_ground_truth_failures_of_the_replayed_day(demo: tuple[Path, str]) -> None:
    out, stdout = demo
    report = json.loads((out / "report.json").read_text())
    manifest = read_manifest(out / "data")
    assert report["end_ms"] == manifest["end_ms"] and report["start_ms"] == manifest["end_ms"] - DAY_MS
    truth = read_ground_truth(out / "data")
    day = truth[(truth["ts"] >= report["start_ms"]) & (truth["ts"] < report["end_ms"])].sort_values("ts")
    assert len(day) > 0
    got = [(f["node"], f["ts"], f["cause"], f["detectable"]) for f in report["failures"]]
    want = list(
        zip(day["node"], day["ts"].astype(int), day["cause"], day["detectable"].astype(bool), strict=True)
    )
    assert got == want
    assert f"Failures: {len(day)} ({int(day['detectable'].sum())} announced by foreshocks)" in stdout
    assert (out / "report.md").read_text().count("| node0") == len(day)


def test_predicted_failures_match_the_alerting_scores(demo: tuple[Path, str]) -> None:
    out, _ = demo
    report = json.loads((out / "report.json").read_text())
    scores = pd.read_parquet(out / "scores.parquet")
    assert scores["ts"].between(report["start_ms"], report["end_ms"]).all()
    assert scores["node"].nunique() >= 14  # every node up at some point is scored
    horizon = report["horizon_minutes"] * 60_000
    for f in report["failures"]:
        mine = scores[(scores["node"] == f["node"]) & scores["alert"]]
        ahead = mine[(mine["ts"] >= f["ts"] - horizon) & (mine["ts"] < f["ts"])]
        assert f["predicted"] == (len(ahead) > 0), f
        if f["predicted"]:
            assert f["lead_minutes"] == pytest.approx((f["ts"] - ahead["ts"].min()) / 60_000)
            assert 0 < f["lead_minutes"] <= report["horizon_minutes"]
        if f["in_job"] and "migrate" in f["action"]:  # a crash (work + restart) outweighs a migration
            assert f["saved_gpu_hours"] > 0 and f["lost_gpu_hours"] > f["saved_gpu_hours"], f
        if not f["in_job"] or not f["action"]:
            assert f["saved_gpu_hours"] == 0, f
        assert (f["lost_gpu_hours"] > 0) == f["in_job"], f
    assert report["predicted"] == sum(f["predicted"] for f in report["failures"])
    assert report["alert_episodes"] >= report["false_alarm_episodes"] >= 0


def test_actions_are_the_audited_dry_run_actions(demo: tuple[Path, str]) -> None:
    out, _ = demo
    report = json.loads((out / "report.json").read_text())
    with sqlite3.connect(out / "audit.sqlite") as db:
        rows = db.execute(
            "SELECT action, COUNT(*) FROM mitigation_events WHERE status='skipped' AND dry_run=1 "
            "GROUP BY action"
        ).fetchall()
        acted_on = db.execute("SELECT MIN(ts) FROM mitigation_events").fetchone()[0]
    assert dict(rows) == report["actions"]
    if acted_on is not None:
        assert acted_on >= report["start_ms"]  # warm-up scores never reach the mitigator


def test_the_model_never_saw_the_replayed_cluster_and_runs_at_the_evaluation_budget(
    demo: tuple[Path, str],
) -> None:
    out, stdout = demo
    history = read_manifest(out / "history")
    assert (history["nodes"], history["seed"]) == (48, 6)
    assert history["end_ms"] - history["start_ms"] <= DAY_MS  # one day fewer than the replayed cluster
    trained = json.loads((out / "train" / "metrics.json").read_text())["_info"]
    assert trained["dataset_fingerprint"] == dataset_fingerprint(out / "history")
    assert trained["dataset_fingerprint"] != dataset_fingerprint(out / "data")
    report = json.loads((out / "report.json").read_text())
    budget = 400 / 60  # the full evaluation's 1 per 1,000 node-days at rate x 60, scaled to x 400
    assert report["budget_per_1000_node_days"] == pytest.approx(budget)
    assert trained["budget_false_alarms_per_1000_node_days"] == pytest.approx(budget)
    assert report["node_days"] == pytest.approx(16.0)
    assert report["recall"] == pytest.approx(report["predicted"] / len(report["failures"]))
    assert f"{report['false_alarm_episodes']} false alarms in 16 node-days (budget {budget:g}" in stdout
    reference = report["reference"]  # the full evaluation's llama3 figures, printed beside the day's
    assert 0 <= reference["recall"] <= reference["recall_detectable"] <= 1
    assert f"Full evaluation (docs/results.md, {reference['data']}): recall {reference['recall']:.2f}" \
        in stdout


def test_model_is_registered_and_the_plot_written(demo: tuple[Path, str]) -> None:
    out, _ = demo
    assert champion_version(sqlite_uri(out / "data")) == "1"
    assert (out / "train" / "metrics.json").is_file()
    assert (out / "replay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![risk over the replayed day](replay.png)" in (out / "report.md").read_text()
