"""``benchmarks/sequence_features.py``: its two aggregations mean what they say, in the batch
engine, against the definitions applied to the raw records (as ``test_features_reference`` checks
the shipped ones), in buckets of any size; and the benchmark runs to its end on a small cluster."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foreshock.features.batch import compute_features
from foreshock.features.default_set import XID_CLASSES
from foreshock.features.kernels import AGGREGATIONS, reduce_direct
from foreshock.features.spec import Feature, FeatureSet
from tests.fixtures.predictor import judge_variants
from tests.unit.test_features_parity import make_stream
from tests.unit.test_features_reference import B, _dedup, _increases

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def sequence(monkeypatch):
    """The benchmark's module, its aggregations in the engines' table for this test only."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import sequence_features

    for name, agg in sequence_features.SEQUENCE_AGGREGATIONS.items():
        monkeypatch.setitem(AGGREGATIONS, name, agg)
    return sequence_features


def _defined(f: Feature, t: int, node: str, frames: dict[str, pd.DataFrame]) -> float:
    """The error count's per-bucket totals of the W buckets before ``t`` (empty ones included):
    weighted by position, 1 / W for the oldest to 1 for the newest, or their least-squares slope
    against the bucket's position, per hour."""
    if f.source == "xid":
        classes = {c: k for k, cs in XID_CLASSES.items() for c in cs}
        x = frames["xid"][frames["xid"]["node"] == node]
        x = x[x["xid"].map(lambda c: classes.get(c, "other")) == f.field]
        ts, amounts = x["ts"], x["count"]
    else:
        table, member = ("gpu", "gpu") if f.source == "gpu" else ("link", "port")
        inc = _increases(frames[table][frames[table]["node"] == node], member, f.field)
        ts, amounts = inc["ts"], inc["_inc"]
    w = f.window_ms // B
    within = (ts >= t - f.window_ms) & (ts < t)
    per = np.zeros(w)
    np.add.at(per, (ts[within] // B - (t // B - w)).to_numpy(int), amounts[within].to_numpy(float))
    if f.agg == "weighted":
        return float(per @ (np.arange(1, w + 1) / w))
    return float(np.polyfit(np.arange(w), per, 1)[0] * 3_600_000 / B) if w > 1 else np.nan


@pytest.mark.parametrize("seed", [3, 11, 2024])
def test_the_batch_engine_computes_the_definitions(sequence, seed):
    frames, _ = make_stream(seed, 0)
    feats = tuple(
        Feature(source, field, agg, w * B)
        for source, field in (("gpu", "ecc_sbe_vol_total"), ("link", "symbol_error"), ("xid", "memory"),
                              ("xid", "other"))
        for agg in sequence.SEQUENCE_AGGREGATIONS
        for w in (1, 3, 7)
    )
    fs = FeatureSet(feats, (), XID_CLASSES, live_ms=3 * B, reset_on_return=False)
    table = compute_features(gpu=frames["gpu"], xid=frames["xid"], link=frames["link"],
                             events=frames["events"], feature_set=fs)
    clean = {"gpu": _dedup(frames["gpu"], ["node", "ts", "gpu"]),
             "xid": _dedup(frames["xid"], ["node", "ts", "gpu", "xid"]),
             "link": _dedup(frames["link"], ["node", "ts", "port"])}
    rows = table.iloc[np.random.default_rng(seed).choice(len(table), size=min(8, len(table)), replace=False)]
    for _, row in rows.iterrows():
        for f in feats:
            want = _defined(f, int(row["ts"]), row["node"], clean)
            assert np.isclose(row[f.name], want, rtol=1e-9, atol=1e-9, equal_nan=True), (f.name, row["ts"])


@pytest.mark.parametrize("bucket_ms", [30_000, 60_000, 120_000])
def test_trend_and_weight_do_not_depend_on_the_bucket_size(sequence, bucket_ms):
    """An error rate that grows by one a minute every minute, over a 4-minute window: its trend
    reads 60 per minute per hour whatever the buckets, and its recency weights are the
    definition's."""
    w = 4 * 60_000 // bucket_ms
    minutes = (np.arange(w) + 0.5) * bucket_ms / 60_000  # each bucket's middle, from the window's start
    increments = minutes * bucket_ms / 60_000  # the rate then (per minute) times the bucket's minutes
    for agg, want in (("trend", 60.0), ("weighted", increments @ (np.arange(1, w + 1) / w))):
        f = Feature("gpu", "ecc_sbe_vol_total", agg, 4 * 60_000)
        kernel = sequence.SEQUENCE_AGGREGATIONS[agg]
        reduced = [reduce_direct(r.op, increments[None, :]) for r in kernel.reductions(f)]
        assert kernel.finalize(reduced, f, np.zeros(1), bucket_ms)[0] == pytest.approx(want), agg


def test_the_sequence_benchmark_judges_both_variants_on_an_unseen_pool(predictor_dataset, tmp_path):
    assert judge_variants(BENCHMARKS / "sequence_features.py", predictor_dataset, tmp_path) == [
        ["base", "model"], ["base", "logistic"], ["sequence", "model"], ["sequence", "logistic"]
    ]
    model = json.loads((tmp_path / "runs" / "sequence" / "model" / "risk_model.json").read_text())
    assert "ecc_sbe_vol_total__trend__1h" in json.dumps(model)
