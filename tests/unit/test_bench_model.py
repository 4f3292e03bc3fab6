"""``benchmarks/bench_model.py --quick`` runs to its end: it trains as ``train`` trains (tail
bins, monotone trees), so a change to those pieces' signatures must keep the benchmark working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_model.py"


def test_the_model_benchmark_runs_its_smoke_size():
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ratio predict_proba / logistic" in done.stdout
