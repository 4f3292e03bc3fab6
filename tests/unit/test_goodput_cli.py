"""``foreshock goodput``: tables, JSON and plot for a profile, the real trace and a metrics file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.models.goodput import JSON_KEYS, SOURCES, STRATEGIES, TIERED_STRATEGIES

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


DRILL = ("--drill", str(Path(__file__).resolve().parents[2] / "tests" / "data" / "drill" / "sample.json"),
         "--state-gb-per-gpu", "0.4")


def test_drill_adds_the_tiered_rows_and_keeps_the_others():
    base = ("--profile", "llama3", "--gpus", "1024,16384", "--days", "365", "--json", "--no-plot")
    result = runner.invoke(app, ["goodput", *base, *DRILL])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    expected = [(g, s) for g in (1024, 16384) for s in STRATEGIES + TIERED_STRATEGIES]
    assert [(r["gpus"], r["strategy"]) for r in rows] == expected
    assert all(tuple(r) == JSON_KEYS for r in rows)
    # The rows of the single-tier strategies are those of a run without --drill.
    assert [r for r in rows if r["strategy"] in STRATEGIES] == json.loads(run(*base))
    by = {(r["gpus"], r["strategy"]): r for r in rows}
    for g in (1024, 16384):
        assert by[g, "tiered"]["ettr"] > by[g, "young_daly"]["ettr"]
        assert by[g, "tiered"]["lost_time_reduction"] > by[g, "foreshock"]["lost_time_reduction"]
        assert by[g, "tiered+foreshock"]["interruptions_per_day"] < by[g, "tiered"]["interruptions_per_day"]
    assert "sources" in result.stderr and "MegaScale" in result.stderr  # stdout stays JSON


def test_drill_table_prints_the_projection_and_its_sources():
    text = run("--profile", "llama3", "--gpus", "16384", "--days", "365", "--no-plot", *DRILL)
    for strategy in STRATEGIES + TIERED_STRATEGIES:
        assert f"│ {strategy} " in text
    assert "vs Young/Daly" in text and "pair-loss probability" in text and "estimated from this trace" in text
    sources = text[text.index("sources"):]
    for src in SOURCES.values():
        if src.key != "reinit_2048":  # only used up to 2,048 GPUs
            assert src.url in sources
    assert "[5]" not in sources  # the 2,048-GPU figure is not listed at 16,384 GPUs
    assert "recovery at 16,384 GPUs: peer 37.2 s" in text  # 6.7 s fixed + 0.4 GB / 0.8 GB/s + 30 s


def test_drill_needs_the_state_size():
    result = runner.invoke(app, ["goodput", "--profile", "llama3", "--days", "30", "--no-plot", *DRILL[:2]])
    assert result.exit_code != 0
