"""``benchmarks/relative_features.py`` runs to its end on a small cluster, and its ``relative``
model reads no absolute sensor level while it keeps the peers' view of the same sensors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.predictor import judge_variants

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "relative_features.py"


def test_the_relative_benchmark_judges_both_variants_on_an_unseen_pool(predictor_dataset, tmp_path):
    assert judge_variants(BENCH, predictor_dataset, tmp_path) == [
        ["relative", "model"], ["relative", "logistic"], ["base", "model"], ["base", "logistic"]
    ]
    card = {name: tmp_path / "runs" / name / "model" / "risk_model.json" for name in ("relative", "base")}
    read = {name: json.loads(path.read_text())["feature_names"] for name, path in card.items()}
    assert {"gpu_temp__max__30m", "power_usage__mean__30m"} <= set(read["base"])
    assert not {"gpu_temp__max__30m", "power_usage__mean__30m", "sm_clock__min__30m"} & set(read["relative"])
    assert {"peer_z__gpu_temp__max__30m", "gpu_temp__slope__30m"} <= set(read["relative"])
    assert len(read["relative"]) == len(read["base"]) - 8
