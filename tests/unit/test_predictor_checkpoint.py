"""Checkpoints are all-or-nothing: a half-written generation is never loaded."""

from __future__ import annotations

import threading

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


def test_a_cut_journaled_while_its_snapshot_is_written_outlives_the_write(tmp_path):
    store = CheckpointStore(tmp_path, OnlineEngines(DEFAULT_FEATURE_SET).load)
    state = _state(2, 3)
    before, after = {"until": 10, "cuts": {Topic.XID: 1}}, {"until": 20, "cuts": {Topic.XID: 2}}
    store.journal(2, before)
    sealed = store.seal(2)  # the snapshot: the state reflects `before`
    store.journal(2, after)  # the loop goes on while the snapshot is written
    assert store.journaled(2) == [before, after]  # a crash now: the old generation needs both
    store.save(2, state.engine, state.meta(), sealed)
    assert store.journaled(2) == [after]
    store.save(2, state.engine, state.meta())  # saving the current state seals what came before
    assert store.journaled(2) == []


def test_the_loop_scores_on_while_a_checkpoint_is_written_and_commits_only_after(risk_model_dir, tmp_path):
    from foreshock.ingest.bus import InMemoryBus
    from foreshock.ingest.simulator import stream
    from foreshock.predictor.model_source import PathModelSource
    from foreshock.predictor.service import RiskService, ServiceConfig
    from tests.fixtures.predictor import simulator
    from tests.unit.test_predictor_service import ENGINES, PERIOD

    release, writing = threading.Event(), threading.Event()

    class SlowDisk(CheckpointStore):
        def save(self, *args, **kwargs):
            writing.set()
            assert release.wait(60)
            return super().save(*args, **kwargs)

    bus = InMemoryBus(partitions=2)
    stream(simulator(minutes=40), bus)
    config = ServiceConfig(group="g", score_every_ms=PERIOD, max_records=20, checkpoint_every_ms=1)
    service = RiskService(bus, ENGINES, PathModelSource(risk_model_dir), config=config,
                          checkpoints=SlowDisk(tmp_path, ENGINES.load)).start()
    scores = []
    for _ in range(400):
        scores += service.run_once()
        if writing.is_set() and len(scores) > 20:
            break
    assert writing.is_set() and service._writer.busy
    assert bus._committed["g"] == {}  # nothing durable yet: nothing committed
    more = [s for _ in range(30) for s in service.run_once()]
    assert more and max(s.ts for s in more) > max(s.ts for s in scores) - PERIOD  # it went on scoring
    assert service._writer.busy and bus._committed["g"] == {}
    release.set()
    service.checkpoint()  # waits for the write in progress, then writes the rest
    saved = service.checkpoints.partitions()
    assert saved == [0, 1] and bus._committed["g"]
    for p in saved:
        _, meta = service.checkpoints.load(p)
        assert {(t, q): off for t, q, off in meta["positions"]}.items() <= bus._committed["g"].items()
