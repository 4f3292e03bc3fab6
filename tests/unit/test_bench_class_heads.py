"""``benchmarks/class_heads.py`` runs to its end on a small cluster: it grows its heads by the
recipe ``train`` uses (``fit_with_prior``) from the dataset's feature cache, so a change to that
recipe or to how labelled rows hold their features must keep the benchmark working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "class_heads.py"


def _simulate(out: Path, nodes: int, days: int, seed: int) -> Path:
    subprocess.run(
        [sys.executable, "-m", "foreshock", "simulate", "--profile", "llama3", "--nodes", str(nodes),
         "--days", str(days), "--interval", "60s", "--seed", str(seed), "--rate-multiplier", "300",
         "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )
    return out


def test_the_class_heads_benchmark_judges_both_variants_on_validation_and_an_unseen_pool(tmp_path):
    train = _simulate(tmp_path / "train", 32, 2, seed=1)
    unseen = _simulate(tmp_path / "unseen", 16, 1, seed=2)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--train", str(train), "--pool", f"unseen={unseen}",
         "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # two days of 32 nodes hold no thermal or power failure in validation: that head is left out
    assert "no head for thermal_power" in done.stdout
    rows = [line.split(" | ")[1] for line in done.stdout.splitlines() if line.startswith("| unseen pool")]
    assert rows == ["single", "heads"]
    summary = json.loads((tmp_path / "runs" / "summary.json").read_text())
    assert set(summary) == {"validation", "unseen pool"}
    for variant in ("single", "heads"):
        figures = summary["unseen pool"][variant]
        assert figures["failures"] > 0 and len(figures["caught_at"]) == 4
        assert 0 < figures["pr_auc"] <= 1
