"""``foreshock goodput``: tables, JSON and plot for a profile, the real trace and a metrics file."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from models.goodput import JSON_KEYS, STRATEGIES

runner = CliRunner()


def run(*args: str) -> str:
    result = runner.invoke(app, ["goodput", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_json_table_for_profile_sizes(tmp_path):
    rows = json.loads(run("--profile", "llama3", "--gpus", "1024,16384", "--days", "365", "--json",
                          "--plot", str(tmp_path / "ettr.png")))
    assert [(r["gpus"], r["strategy"]) for r in rows] == [(g, s) for g in (1024, 16384) for s in STRATEGIES]
    assert all(tuple(r) == JSON_KEYS for r in rows)
    by = {(r["gpus"], r["strategy"]): r for r in rows}
    for g in (1024, 16384):
        assert by[g, "fixed"]["lost_time_reduction"] == 0.0
        assert by[g, "oracle"]["ettr"] > by[g, "foreshock"]["ettr"] > by[g, "young_daly"]["ettr"]
        assert by[g, "foreshock"]["interruptions_per_day"] < by[g, "fixed"]["interruptions_per_day"]
        lost = (1 - by[g, "fixed"]["ettr"]) * g * 24
        assert by[g, "fixed"]["lost_gpu_hours_per_day"] == pytest.approx(lost)
    assert by[16384, "fixed"]["interruptions_per_day"] > 10 * by[1024, "fixed"]["interruptions_per_day"]
    assert (tmp_path / "ettr.png").stat().st_size > 10_000


def test_real_trace_table_and_metrics_operating_point(tmp_path):
    metrics = tmp_path / "metrics.json"
    point = {"pr_auc": 0.4, "roc_auc": 0.9, "recall_at_budget": 0.0, "precision_at_budget": 0.0,
             "false_alarms_per_1000_node_days": 0.0, "median_lead_minutes": 30.0, "recall_by_cause": {}}
    metrics.write_text(json.dumps({"model": point, "rules": point, "logistic": point}))
    rows = json.loads(run("--trace", "infinitehbd", "--metrics", str(metrics), "--json", "--no-plot"))
    by = {r["strategy"]: r for r in rows}
    assert {r["gpus"] for r in rows} == {3200}
    assert by["foreshock"] == dict(by["young_daly"], strategy="foreshock")  # recall 0 from metrics
    text = run("--trace", "infinitehbd", "--out", str(tmp_path))
    assert "3,200 GPUs (400 nodes): 582 failures in 349 days" in text
    for strategy in STRATEGIES:
        assert strategy in text
    assert (tmp_path / "goodput.png").exists()


def test_rejects_two_sources():
    result = runner.invoke(app, ["goodput", "--profile", "llama3", "--trace", "infinitehbd"])
    assert result.exit_code != 0
