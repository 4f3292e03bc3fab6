"""``benchmarks/history_features.py`` runs to its end on a small cluster: it trains and judges as
``train`` and ``evaluate`` do, from the dataset's feature cache, so a change to how labelled rows
hold their features must keep the benchmark working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fixtures.predictor import simulator

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "history_features.py"


def test_the_history_benchmark_judges_both_variants_on_an_unseen_pool(predictor_dataset, tmp_path):
    from foreshock.ingest.simulator import write_dataset

    unseen = write_dataset(simulator(24 * 60, seed=2), tmp_path / "unseen")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--train", str(predictor_dataset), "--pool", f"unseen={unseen}",
         "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| pool unseen")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        ["base", "model"], ["base", "logistic"], ["history", "model"], ["history", "logistic"]
    ]
    assert (tmp_path / "runs" / "history" / "model").is_dir()
