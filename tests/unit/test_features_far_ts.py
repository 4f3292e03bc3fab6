"""The online engine works at any ts the contract accepts (0 to 2^53 ms) and across long jumps.

Epoch bucket numbers pass 2^32 at ts = 2^32 minutes (257,698,037,760,000 ms); before the fix a
read there indexed past the last node (``POST /v1/score`` answered 500, ``foreshock serve``'s loop
died). Features are differences of times and sums over buckets, so a stream moved by a whole
number of buckets must give the same rows, moved by as much; the parity tests prove the
unmoved rows equal the batch engine's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.batch import compute_features
from foreshock.features.buckets import _KEY_SHIFT
from foreshock.features.online import _KEY_BUCKETS, OnlineFeatureEngine
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import MAX_EPOCH_MS, GpuSample
from foreshock.predictor.api import create_app
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.unit.test_features_parity import SETS, T0, assert_same, feed, make_stream

M = 60_000
TOKEN = "t"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_the_engine_knows_how_many_buckets_a_key_holds():
    assert _KEY_BUCKETS == int(_KEY_SHIFT)


def moved(frames: dict[str, pd.DataFrame], arrival: dict[str, np.ndarray], by: int):
    return ({k: df.assign(ts=df["ts"] + by) for k, df in frames.items()},
            {k: a + by for k, a in arrival.items()})


def _extent(arrival: dict[str, np.ndarray]) -> tuple[int, int]:
    return (min(int(a.min()) for a in arrival.values() if len(a)),
            max(int(a.max()) for a in arrival.values() if len(a)) + 1)


def _run(fs, frames, arrival, tolerance: int, spans: list[tuple[int, int]] | None = None
         ) -> tuple[OnlineFeatureEngine, list[pd.DataFrame]]:
    """Feed the stream 90 s of arrivals at a time (over ``spans`` of arrival time, default its
    whole extent), reading the features at the last minute tick after each feed."""
    engine = OnlineFeatureEngine(fs, tolerance_ms=tolerance, history_ms=10 * M)
    reads = []
    for first, last in spans or [_extent(arrival)]:
        for lo in range(first, last, 90_000):
            feed(engine, frames, arrival, lo, lo + 90_000, use_records=lo % 2 == 0)
            reads.append(engine.features_at((lo // M) * M))
    return engine, reads


@pytest.mark.parametrize("seed", [7, 11])  # 4 nodes for 8 minutes; 1 node for 23 minutes
@pytest.mark.parametrize("which", sorted(SETS))
@pytest.mark.parametrize("where", ["2^32 buckets", "2^53 ms"])
def test_a_stream_moved_to_the_end_of_the_contract_gives_the_same_rows(seed, which, where):
    fs = SETS[which]
    b = fs.bucket_ms
    if where == "2^32 buckets":  # T0 moves to 8 buckets before the first bucket number past 32 bits
        to = (2**32 - 8) * b
    else:  # the stream ends hours before the contract's last ts
        to = (MAX_EPOCH_MS - 3 * 3_600_000) // b * b
    by = to - T0 // b * b
    frames, arrival = make_stream(seed, 60_000)
    far_frames, far_arrival = moved(frames, arrival, by)
    near, near_reads = _run(fs, frames, arrival, 60_000)
    far, far_reads = _run(fs, far_frames, far_arrival, 60_000)
    assert len(near_reads) == len(far_reads) and any(len(r) for r in far_reads)
    for i, (a, z) in enumerate(zip(near_reads, far_reads, strict=True)):
        assert (z["ts"] - by).tolist() == a["ts"].tolist()
        assert_same(z, a, fs.names, f"read {i}")
    end = (_extent(arrival)[1] // M + 1) * M
    assert_same(far.features_at(end + by), near.features_at(end), fs.names, "end")


@pytest.mark.parametrize("which", sorted(SETS))
def test_a_jump_of_more_than_2_to_the_32_buckets_reads_as_any_jump_past_the_rings(which):
    """A stream, then the same stream again after a gap: 2,000 minutes (past every ring), or to the
    end of the contract (the engine finalises that jump in spans of 2^32 buckets). Only the gap's
    length differs, and no window reaches across it, so the second part reads the same."""
    fs = SETS[which]
    frames, arrival = make_stream(7, 60_000)
    end = (MAX_EPOCH_MS - 3 * 3_600_000) // M * M - T0
    rows = []
    for gap in (2_000 * M, end):
        later, later_arrival = moved(frames, arrival, gap)
        both = {k: pd.concat([frames[k], later[k]], ignore_index=True) for k in frames}
        both_arrival = {k: np.r_[arrival[k], later_arrival[k]] for k in frames}
        first, last = _extent(later_arrival)
        engine, reads = _run(fs, both, both_arrival, 60_000, [_extent(arrival), (first, last)])
        reads = [r for r in reads if len(r) and r["ts"].iloc[0] >= first // M * M]
        reads.append(engine.features_at(last // M * M + M))
        at_once, _ = _run(fs, both, both_arrival, 60_000, [_extent(arrival)])
        feed(at_once, both, both_arrival, first, last, use_records=True)  # one update: the jump and more
        reads += [at_once.features_at(t) for t in range(last // M * M - 3 * M, last // M * M + 2 * M, M)]
        rows.append([r.assign(ts=r["ts"] - gap) for r in reads])
    assert len(rows[0]) == len(rows[1]) > 1
    for i, (a, z) in enumerate(zip(*rows, strict=True)):
        assert z["ts"].tolist() == a["ts"].tolist()
        assert_same(z, a, fs.names, f"read {i}")


def test_a_jump_longer_than_the_rings_leaves_no_stale_bucket():
    """Records 5 min and 1,506 min into a stream (a gap longer than the 1,450-bucket ring): the
    old record's bucket must not land in a slot a newer bucket is read from."""
    t0 = T0
    gpu = pd.DataFrame({"node": ["n1"] * 3, "ts": [t0 + 5 * M, t0 + 1506 * M, t0 + 1507 * M], "gpu": [0] * 3,
                        "gpu_temp": [90.0, 40.0, 41.0], "ecc_sbe_vol_total": [3.0, 9.0, 9.0]})
    batch = compute_features(gpu=gpu)
    for split in (1, 2):  # the jump inside one update, and between two
        engine = OnlineFeatureEngine(tolerance_ms=60_000)
        records = [GpuSample(node=r.node, ts=int(r.ts), gpu=0, gpu_temp=r.gpu_temp,
                             ecc_sbe_vol_total=int(r.ecc_sbe_vol_total)) for r in gpu.itertuples()]
        engine.update(records[:split])
        engine.update(records[split:])
        for t in (t0 + 1507 * M, t0 + 1508 * M):
            assert_same(engine.features_at(t), batch[batch["ts"] == t].reset_index(drop=True),
                        DEFAULT_FEATURE_SET.names, f"split {split}, t={t}")


@pytest.fixture(scope="module")
def client(risk_model_dir) -> TestClient:
    svc = RiskService(InMemoryBus(), OnlineEngines(DEFAULT_FEATURE_SET), PathModelSource(risk_model_dir),
                      config=ServiceConfig(score_every_ms=5 * M)).start()
    return TestClient(create_app(svc, token=TOKEN))


@pytest.mark.parametrize("start", [2**32 * M - 5 * M, MAX_EPOCH_MS - 10 * M])
def test_the_score_api_answers_any_ts_the_contract_accepts(client, start):
    window = {"telemetry": {"gpu": [{"node": "n1", "ts": start + M * i, "gpu": 0, "gpu_temp": 60.0}
                                    for i in range(9)]}}
    near = {"telemetry": {"gpu": [{**r, "ts": r["ts"] - start + T0} for r in window["telemetry"]["gpu"]]}}
    got = client.post("/v1/score", json=window, headers=AUTH)
    assert got.status_code == 200, got.text
    ref = client.post("/v1/score", json=near, headers=AUTH).json()["scores"]
    assert [s["probability"] for s in got.json()["scores"]] == [s["probability"] for s in ref]


def test_the_score_api_refuses_an_at_outside_the_contract_with_400(client):
    window = {"telemetry": {"gpu": [{"node": "n1", "ts": 60_000, "gpu": 0}]}}
    for at in (-1, MAX_EPOCH_MS + 1, 2**70):
        got = client.post("/v1/score", json={**window, "at": at}, headers=AUTH)
        assert got.status_code == 400 and "'at'" in got.json()["detail"]
    beyond = client.post("/v1/score", json={"telemetry": {"gpu": [{"node": "n1", "ts": MAX_EPOCH_MS + 1,
                                                                   "gpu": 0}]}}, headers=AUTH)
    assert beyond.status_code == 400 and "ts" in beyond.json()["detail"]
