"""Time stamps the contract accepts but the risk service cannot place: a record dated after its
receipt (6 h ahead, ts = 2^53) or far behind its own log is dead-lettered with the reason and moves
nothing, so every other node is scored as if it had never been sent. A log's first record has
nothing to trail: one stamped in 1970 costs a boundary, not a walk of 10^11 empty boundaries.
The same against a real broker with kcat as the producer: tests/integration/test_poison_messages.py.
"""

from __future__ import annotations

import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import MAX_EPOCH_MS, GpuSample, NodeEvent, Topic, XidEvent, decode, encode
from foreshock.ingest.simulator import stream
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.partition import PartitionState, time_anomaly
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator
from tests.unit.test_predictor_service import ENGINES, PERIOD, by_key, drain

HOUR = 3_600_000


def live_service(bus, model_dir, path, receipt_ms: int, **config) -> RiskService:
    """A service whose wall clock reads ``receipt_ms``: the simulated telemetry is live, not a replay."""
    cfg = ServiceConfig(group="g", score_every_ms=PERIOD, checkpoint_every_ms=3_600_000, **config)
    return RiskService(bus, ENGINES, PathModelSource(model_dir), config=cfg,
                       checkpoints=CheckpointStore(path, ENGINES.load), clock=lambda: receipt_ms).start()


def test_the_rule_future_by_receipt_past_by_the_records_own_log():
    state = PartitionState(3, ENGINES.new(), PERIOD)
    t0, receipt = 1_735_689_600_000, 1_735_689_600_000 + HOUR
    check = lambda topic, *records: time_anomaly(state, topic, records, receipt, future_ms=300_000,  # noqa: E731
                                                 past_ms=60_000)
    # a log's first record: nothing to trail, and not after its receipt
    assert check(Topic.GPU, GpuSample(node="n", ts=0, gpu=0)) is None
    assert check(Topic.GPU, GpuSample(node="n", ts=receipt + 300_000, gpu=0)) is None  # at the tolerance
    ahead = check(Topic.GPU, GpuSample(node="n", ts=receipt + 300_001, gpu=0))
    assert ahead.startswith("time anomaly: ts") and "after its receipt (future tolerance 300 s)" in ahead
    state.add(Topic.GPU, 0, [GpuSample(node="n", ts=t0, gpu=0)])
    assert check(Topic.GPU, GpuSample(node="n", ts=t0 - 60_000, gpu=0)) is None
    behind = check(Topic.GPU, GpuSample(node="m", ts=t0 + 1, gpu=0),
                   GpuSample(node="m", ts=t0 - 60_001, gpu=0))
    assert "60 s behind the newest record of telemetry.gpu partition 3" in behind  # one bad record: all
    # another log of the partition has its own progress: a sparse log's records trail a dense one
    assert check(Topic.XID, XidEvent(node="n", ts=t0 - HOUR, xid=79)) is None
    # node events are placed at any time: never late
    state.add(Topic.NODE_EVENTS, 0, [NodeEvent(node="n", ts=t0, event="up")])
    assert check(Topic.NODE_EVENTS, NodeEvent(node="n", ts=t0 - 5 * HOUR, event="drained")) is None


def test_dated_too_far_ahead_or_behind_is_dead_lettered_and_moves_nothing(risk_model_dir, tmp_path):
    sim = simulator(minutes=30)
    receipt = sim.end_ms + 60_000  # live: the last records arrive a minute after they were taken
    clean = InMemoryBus(partitions=2)
    stream(sim, clean)
    expected = by_key(drain(live_service(clean, risk_model_dir, tmp_path / "clean", receipt)))
    middle = sim.start_ms + 15 * 60_000
    poison = {
        "node0003": encode(GpuSample(node="node0003", ts=middle + 6 * HOUR, gpu=0, gpu_temp=60.0)),
        "node0005": encode(GpuSample(node="node0005", ts=MAX_EPOCH_MS, gpu=0, gpu_temp=60.0)),
        "node0007": encode([GpuSample(node="node0007", ts=middle, gpu=0, gpu_temp=60.0),
                            GpuSample(node="node0007", ts=middle - 10 * 60_000, gpu=1, gpu_temp=60.0)]),
    }
    bus = InMemoryBus(partitions=2)

    def among_the_traffic(ts: int) -> None:
        if ts == middle:
            for node, value in poison.items():
                bus.send(Topic.GPU, node, value)

    stream(sim, bus, on_step=among_the_traffic)
    svc = live_service(bus, risk_model_dir, tmp_path / "poisoned", receipt)
    assert by_key(drain(svc)) == expected
    assert svc.readiness() == (True, "ready")
    letters = {d.key: d for m in bus.messages(Topic.DEADLETTER) for d in decode(Topic.DEADLETTER, m.value)}
    assert {k: d.value for k, d in letters.items()} == poison  # the original bytes, whole
    assert f"{(middle + 6 * HOUR - receipt) / 1000:,.0f} s after its receipt" in letters["node0003"].reason
    assert "after its receipt" in letters["node0005"].reason
    assert "600 s behind the newest record of telemetry.gpu" in letters["node0007"].reason
    svc.checkpoint()
    assert b"foreshock_predictor_dead_letters_total 3.0" in svc.metrics.render()
    store = CheckpointStore(tmp_path / "poisoned", ENGINES.load)
    for p in store.partitions():  # the jump is not saved: a restart is not stalled either
        _, meta = store.load(p)
        assert max(meta["progress"].values()) <= sim.end_ms and meta["next_boundary"] <= sim.end_ms + PERIOD


@pytest.mark.timeout(120)
def test_a_first_record_stamped_in_1970_costs_a_boundary_not_a_walk_from_the_epoch(risk_model_dir, tmp_path):
    sim = simulator(minutes=20)
    clean = InMemoryBus(partitions=2)
    stream(sim, clean)
    expected = by_key(drain(live_service(clean, risk_model_dir, tmp_path / "clean", sim.end_ms)))
    bus = InMemoryBus(partitions=2)
    bus.send(Topic.GPU, "node0001", encode(GpuSample(node="node0001", ts=0, gpu=0, gpu_temp=60.0)))
    stream(sim, bus)
    got = by_key(drain(live_service(bus, risk_model_dir, tmp_path / "early", sim.end_ms), cycles=100))
    early = {k for k in got if k[1] < sim.start_ms}
    assert early and {node for node, _ in early} == {"node0001"}  # its node, while the record is live
    assert max(t for _, t in early) <= 10 * 60_000
    assert {k: p for k, p in got.items() if k not in early} == expected
