"""The risk service on the in-memory bus: scoring, restart from checkpoints, dead letters, scale-out,
model checks. The model is a real trained RiskModel; the feature engine is the real online engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.batch import compute_features
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import GpuSample, NodeEvent, RiskScore, Topic, decode
from foreshock.ingest.simulator import stream, write_dataset
from foreshock.ingest.stream import publish
from foreshock.models.artifact import RiskModel
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import ModelMismatchError, PathModelSource
from foreshock.predictor.partition import PartitionState
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator

PERIOD = 5 * 60_000
ENGINES = OnlineEngines(DEFAULT_FEATURE_SET)


def make_service(bus, model_dir, tmp_path, group="g", store=True, **config) -> RiskService:
    cfg = ServiceConfig(group=group, score_every_ms=PERIOD, checkpoint_every_ms=3_600_000, **config)
    checkpoints = CheckpointStore(tmp_path / "ckpt", ENGINES.load) if store else None
    return RiskService(bus, ENGINES, PathModelSource(model_dir), config=cfg, checkpoints=checkpoints).start()


def drain(*services: RiskService, cycles: int = 400) -> list[RiskScore]:
    """Run the services until their consumers are caught up and nothing more is scored."""
    out: list[RiskScore] = []
    quiet = 0
    for _ in range(cycles):
        got = [s for svc in services for s in svc.run_once()]
        out += got
        quiet = quiet + 1 if not got and all(svc.lag_records == 0 for svc in services) else 0
        if quiet >= 2:
            return out
    raise AssertionError("services did not drain")


def by_key(scores) -> dict[tuple[str, int], float]:
    return {(s.node, s.ts): s.probability for s in scores}


@pytest.fixture(scope="module")
def sim():
    return simulator(minutes=40)


def test_every_node_is_scored_at_every_boundary_as_one_engine_would(sim, risk_model_dir, tmp_path):
    bus = InMemoryBus(partitions=4)  # divides the feature set's peer_partitions: each group in one engine
    stream(sim, bus)
    svc = make_service(bus, risk_model_dir, tmp_path)
    scores = drain(svc)
    published = [r for m in bus.messages(Topic.RISK) for r in decode(Topic.RISK, m.value)]
    assert by_key(published) == by_key(scores) and len(published) == len(scores)
    boundaries = sorted({s.ts for s in scores})
    assert len(boundaries) >= 5 and all(t % PERIOD == 0 for t in boundaries)
    assert np.all(np.diff(boundaries) == PERIOD)
    # reference: the batch engine's rows at the same instants, from the same run written as a dataset
    batch = compute_features(write_dataset(sim, tmp_path / "ds"), cadence_ms=PERIOD)
    model = RiskModel.load(risk_model_dir)
    for t in boundaries:
        rows = batch[batch["ts"] == t]
        expect = dict(zip(rows["node"], model.predict_proba(rows), strict=True))
        got = {s.node: s.probability for s in scores if s.ts == t}
        assert set(got) == set(expect) and got
        assert np.allclose([got[n] for n in sorted(got)], [expect[n] for n in sorted(got)], rtol=1e-9, atol=0)
    top = scores[-1].top_features
    assert len(top) == 5 and all(f.name in model.feature_names for f in top)
    assert all(s.alert == (s.probability >= model.threshold) for s in scores)
    assert svc.readiness() == (True, "ready")


def test_a_restart_from_the_checkpoint_publishes_the_same_scores(sim, risk_model_dir, tmp_path):
    bus = InMemoryBus(partitions=3)
    stream(sim, bus)
    reference = by_key(drain(make_service(bus, risk_model_dir, tmp_path / "a", group="ref")))
    first = make_service(bus, risk_model_dir, tmp_path / "b", group="run", max_records=100)
    before: list[RiskScore] = []
    while len(before) < len(reference) // 3:
        before += first.run_once()
    first.checkpoint()
    for _ in range(3):  # work done after the checkpoint is lost with the process
        before += first.run_once()
    first._stream.consumer.close()  # the "kill": no final checkpoint, no commit; the group moves on
    after = drain(make_service(bus, risk_model_dir, tmp_path / "b", group="run", max_records=100))
    combined = by_key(before)
    for key, p in by_key(after).items():
        assert combined.setdefault(key, p) == p, f"replayed score differs at {key}"
    assert combined == reference
    assert min(s.ts for s in after) <= max(s.ts for s in before), "the restart replayed nothing"


def test_the_partitions_take_turns_at_checkpointing(sim, risk_model_dir, tmp_path):
    """A due cycle saves one changed partition, the one saved longest ago: with 3 partitions and a
    30 s period one save falls due every 10 s, and each changed partition is saved once, as it
    stood when the snapshot was taken."""
    bus = InMemoryBus(partitions=3)
    stream(sim, bus)
    now = [0.0]
    store = CheckpointStore(tmp_path / "ckpt", ENGINES.load)
    saved: list[tuple[float, int]] = []
    save = store.save

    def saving(p, engine, *args):  # on the writer's thread, from the snapshot laid in the service's space
        saved.append((now[0], p))
        engine.save(tmp_path / "written")
        return save(p, engine, *args)

    store.save = saving
    cfg = ServiceConfig(group="g", score_every_ms=PERIOD, checkpoint_every_ms=30_000)
    svc = RiskService(bus, ENGINES, PathModelSource(risk_model_dir), config=cfg, checkpoints=store,
                      wall=lambda: now[0]).start()
    drain(svc)  # the clock stands still: nothing is due yet, every partition has changed
    assert saved == []
    for _ in range(24):  # 60 s
        now[0] += 2.5
        svc.run_once()
        svc._writer.wait()  # the write of a due snapshot ends before the clock moves on
        if saved and saved[-1][0] == now[0]:  # the state written is the partition's as it stands
            svc._states[saved[-1][1]].engine.save(tmp_path / "live")
            assert (tmp_path / "written").read_bytes() == (tmp_path / "live").read_bytes()
    assert [t for t, _ in saved] == [10.0, 20.0, 30.0]
    assert sorted(p for _, p in saved) == [0, 1, 2]
    assert all(store.load(p) is not None for p in range(3))


def test_bad_records_are_dead_lettered_and_scoring_goes_on(sim, risk_model_dir, tmp_path):
    bus = InMemoryBus(partitions=2)
    bus.send(Topic.GPU, "node0003", b"{not json")
    bus.send(Topic.GPU, "node0004", b'{"v":1,"node":"node0004","ts":-5,"gpu":0}')
    stream(sim, bus)
    svc = make_service(bus, risk_model_dir, tmp_path)
    scores = drain(svc)
    letters = sorted((decode(Topic.DEADLETTER, m.value)[0] for m in bus.messages(Topic.DEADLETTER)),
                     key=lambda d: d.key)
    assert [(d.key, d.value) for d in letters] == [("node0003", b"{not json"),
                                                  ("node0004", b'{"v":1,"node":"node0004","ts":-5,"gpu":0}')]
    assert "ts" in letters[1].reason
    assert {"node0003", "node0004"} <= {s.node for s in scores}
    assert b"foreshock_predictor_dead_letters_total 2.0" in svc.metrics.render()


def test_two_members_split_the_nodes_and_one_takes_over_when_the_other_dies(risk_model_dir, tmp_path):
    first_half, whole = simulator(minutes=25), simulator(minutes=50)
    bus = InMemoryBus(partitions=4)
    a = make_service(bus, risk_model_dir, tmp_path, group="pair")
    b = make_service(bus, risk_model_dir, tmp_path, group="pair")
    stream(first_half, bus)
    drain(a, b)
    a.checkpoint()
    b.checkpoint()
    nodes_a, nodes_b = {s.node for s in a.board.latest()}, {s.node for s in b.board.latest()}
    assert nodes_a and nodes_b and not nodes_a & nodes_b
    assert nodes_a | nodes_b == set(first_half.node_names)
    b._stream.consumer.close()  # b dies
    later = [r for r in _stream_to_memory(whole) if r.ts > first_half.end_ms]
    publish(bus, later)
    taken = drain(a)
    assert len(a.owned_partitions()) == 4
    # reference: one process that saw the same records all along
    alone = InMemoryBus(partitions=4)
    stream(first_half, alone)
    publish(alone, later)
    expect = {k: p for k, p in by_key(drain(make_service(alone, risk_model_dir, tmp_path / "ref"))).items()
              if k[1] > first_half.end_ms}
    got = {k: p for k, p in by_key(taken).items() if k[1] > first_half.end_ms}
    assert got == expect
    assert {n for n, _ in got} & nodes_b, "the survivor scores the nodes the dead member owned"


def _stream_to_memory(sim) -> list:
    bus = InMemoryBus(partitions=1)
    stream(sim, bus)
    return sorted((r for topic in (Topic.GPU, Topic.XID, Topic.LINK, Topic.NODE_EVENTS)
                   for m in bus.messages(topic) for r in decode(topic, m.value)), key=lambda r: r.ts)


def test_a_model_for_another_feature_set_is_refused(risk_model_dir, tmp_path):
    model = RiskModel.load(risk_model_dir)
    other = tmp_path / "other"
    RiskModel(model.booster, feature_names=model.feature_names, feature_set_hash="0" * 64,
              threshold=model.threshold, version="9").save(other)
    with pytest.raises(ModelMismatchError, match="feature set"):
        make_service(InMemoryBus(), other, tmp_path)

    class Moving(PathModelSource):
        def version(self) -> str:
            return "9"

    svc = make_service(InMemoryBus(), risk_model_dir, tmp_path)
    svc.models = Moving(other)
    assert svc.reload_model() is False
    assert svc.model.feature_set_hash == DEFAULT_FEATURE_SET.hash
    assert b'foreshock_predictor_model_reloads_total{result="refused"} 1.0' in svc.metrics.render()


def test_scoring_a_telemetry_window_and_feature_rows(sim, risk_model_dir, tmp_path):
    svc = make_service(InMemoryBus(), risk_model_dir, tmp_path, store=False)
    records = [r for r in _stream_to_memory(sim) if r.ts <= sim.start_ms + 30 * 60_000]
    scores = svc.score_telemetry(records)
    assert {s.node for s in scores} == set(sim.node_names)
    assert {s.ts for s in scores} == {sim.start_ms + 31 * 60_000}
    batch = compute_features(write_dataset(sim, tmp_path / "ds"))
    frame = batch[batch["ts"] == scores[0].ts]
    again = svc.score_rows(frame[svc.model.feature_names])
    assert np.allclose(sorted(s.probability for s in again), sorted(s.probability for s in scores))
    with pytest.raises(KeyError):
        svc.score_rows(pd.DataFrame({"gpu_temp": [1.0]}))
    assert svc.score_telemetry([]) == []
    single = svc.score_telemetry([GpuSample(node="n", ts=1, gpu=0)])
    assert [(s.node, s.ts) for s in single] == [("n", 60_000)]


def test_a_node_out_of_service_is_not_scored_until_it_returns(sim, risk_model_dir, tmp_path):
    bus = InMemoryBus(partitions=3)
    stream(sim, bus)
    reference = drain(make_service(bus, risk_model_dir, tmp_path / "ref", group="ref"))
    boundaries = sorted({s.ts for s in reference})
    node = reference[0].node
    leave, back = boundaries[1] - 1, boundaries[3] - 1  # drained just before a boundary, back before another
    publish(bus, [NodeEvent(node=node, ts=leave, event="drained"), NodeEvent(node=node, ts=back, event="up")])
    scores = drain(make_service(bus, risk_model_dir, tmp_path / "run", group="run"))
    scored = {s.ts for s in scores if s.node == node}
    # out of service at the next two; back after, bar the boundary right after its return, where
    # its fresh windows hold no record yet. The events, read first, do not make it skip the first
    assert scored == set(boundaries) - set(boundaries[1:4])
    # the others, until it returns, as without the events: it still counts among their peers, as
    # it does in the batch features the model was trained on (its return then cuts its windows)
    ref = by_key(reference)
    expect = {k: p for k, p in ref.items() if k[1] in boundaries[:3] and k != (node, boundaries[1])
              and k != (node, boundaries[2])}
    assert {k: p for k, p in by_key(scores).items() if k[1] in boundaries[:3]} == expect


def test_the_nodes_out_of_service_survive_a_checkpoint():
    state = PartitionState(0, ENGINES.new(), PERIOD)
    t0 = 1_735_689_600_000
    state.add(Topic.NODE_EVENTS, 0, [NodeEvent(node="n1", ts=t0, event="failed", cause="gpu_hbm"),
                                      NodeEvent(node="n2", ts=t0, event="drained")])
    state.add(Topic.NODE_EVENTS, 1, [NodeEvent(node="n2", ts=t0 + 60_000, event="repaired")])
    assert state.away_at(t0) == {"n1", "n2"}
    restored = PartitionState.restore(ENGINES.new(), state.meta(), PERIOD)
    assert restored.away_at(t0) == {"n1", "n2"}
    # the return, read before the checkpoint, counts from its own time
    assert restored.away_at(t0 + 59_999) == {"n1", "n2"} and restored.away_at(t0 + 60_000) == {"n1"}


def test_a_scoring_cycle_longer_than_ten_seconds_is_seen_as_such():
    from prometheus_client import CollectorRegistry

    from foreshock.predictor.metrics import ServiceMetrics

    m = ServiceMetrics(CollectorRegistry())
    m.scoring.observe(42.0)
    buckets = {s.labels["le"]: s.value for s in next(iter(m.scoring.collect())).samples
               if s.name.endswith("_bucket")}
    assert buckets["10.0"] == 0 and buckets["60.0"] == 1
