"""Checkpoints are all-or-nothing: a half-written generation is never loaded."""

from __future__ import annotations

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.online import OnlineFeatureEngine
from foreshock.ingest.contract import GpuSample, Topic
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.partition import PartitionState


def _state(partition: int, steps: int) -> PartitionState:
    state = PartitionState(partition, OnlineFeatureEngine(DEFAULT_FEATURE_SET), period_ms=60_000)
    for i in range(steps):
        state.add(Topic.GPU, i, [GpuSample(node="node0001", ts=i * 30_000, gpu=0, gpu_temp=50.0 + i)])
    state.close(60_000)
    return state


def test_a_restored_partition_holds_the_same_state(tmp_path):
    store = CheckpointStore(tmp_path, OnlineEngines(DEFAULT_FEATURE_SET).load)
    state = _state(3, 5)
    store.save(3, state.engine, state.meta())
    engine, meta = store.load(3)
    back = PartitionState.restore(engine, meta, period_ms=60_000)
    assert back.positions == {(Topic.GPU, 3): 5} and back.next_boundary == 120_000
    assert back.held == state.held == 2 and back.progress == state.progress
    assert engine.features_at(120_000).equals(state.engine.features_at(120_000))
    assert store.partitions() == [3] and store.load(4) is None


def test_a_generation_written_halfway_is_ignored_and_older_ones_are_removed(tmp_path):
    store = CheckpointStore(tmp_path, OnlineEngines(DEFAULT_FEATURE_SET).load)
    first = _state(0, 3)
    live = store.save(0, first.engine, first.meta())
    second = _state(0, 6)
    newer = store.save(0, second.engine, second.meta())
    assert not live.exists() and newer.exists()
    crashed = newer.parent / "000000000099-deadbeef"  # a kill -9 before CURRENT moved
    crashed.mkdir()
    (crashed / "engine").write_bytes(b"partial")
    _, meta = store.load(0)
    assert meta["positions"] == [[Topic.GPU, 0, 6]]
