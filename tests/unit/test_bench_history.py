"""``benchmarks/history_features.py`` runs to its end on a small cluster: it trains and judges as
``train`` and ``evaluate`` do, from the dataset's feature cache, so a change to how labelled rows
hold their features must keep the benchmark working."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.predictor import judge_variants

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "history_features.py"


def test_the_history_benchmark_judges_both_variants_on_an_unseen_pool(predictor_dataset, tmp_path):
    assert judge_variants(BENCH, predictor_dataset, tmp_path) == [
        ["base", "model"], ["base", "logistic"], ["history", "model"], ["history", "logistic"]
    ]
    assert (tmp_path / "runs" / "history" / "model").is_dir()
