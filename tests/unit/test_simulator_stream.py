"""Streaming a run onto a bus: the same records as the dataset, one message per node per instant, paced."""

from __future__ import annotations

from collections import Counter

import pytest

from foreshock.commands.simulate import profile_path
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import GpuSample, NodeEvent, Topic, decode
from foreshock.ingest.simulator import Simulator, load_profile, stream

MINUTE = 60_000


def small_sim() -> Simulator:
    """3 nodes x 2 hours at a rate high enough that a failure and a repair fall inside."""
    return Simulator(
        load_profile(profile_path("llama3")),
        nodes=3,
        duration_ms=120 * MINUTE,
        interval_ms=30_000,
        seed=2,
        rate_multiplier=3000,
        chunk_rows=1000,
    )


def test_stream_carries_every_record_of_the_run():
    sim = small_sim()
    chunks = list(sim.chunks())
    bus = InMemoryBus(partitions=4)
    sent = stream(sim, bus)
    by_topic = {t: [m for m in bus.messages(t)] for t in Topic.ALL}
    assert sent == sum(len(v) for v in by_topic.values())
    gpu = [r for m in by_topic[Topic.GPU] for r in decode(Topic.GPU, m.value)]
    assert len(gpu) == sum(c.gpu.num_rows for c in chunks)
    assert all(isinstance(r, GpuSample) for r in gpu)
    # one message per node per instant, keyed by node, holding all of its GPUs
    assert all(len(decode(Topic.GPU, m.value)) == sim.gpus for m in by_topic[Topic.GPU])
    assert all({r.node for r in decode(Topic.GPU, m.value)} == {m.key} for m in by_topic[Topic.GPU])
    xids = [r for m in by_topic[Topic.XID] for r in decode(Topic.XID, m.value)]
    assert len(xids) == sum(c.xid.num_rows for c in chunks)
    links = [r for m in by_topic[Topic.LINK] for r in decode(Topic.LINK, m.value)]
    assert len(links) == sum(c.link.num_rows for c in chunks)
    events = [r for m in by_topic[Topic.NODE_EVENTS] for r in decode(Topic.NODE_EVENTS, m.value)]
    assert all(isinstance(e, NodeEvent) for e in events)
    kinds = Counter(e.event for e in events)
    assert kinds["failed"] == len(sim.schedule.failures) >= 1
    first = sim.schedule.failures[0]
    failed = next(e for e in events if e.event == "failed" and e.ts == first.ts)
    assert (failed.cause, failed.detectable) == (first.cause, first.detectable)


def test_records_match_the_dataset_rows():
    sim = small_sim()
    first = next(iter(sim.chunks())).gpu.slice(0, 1).to_pylist()[0]
    bus = InMemoryBus(partitions=1)
    stream(sim, bus)
    sample = next(
        r
        for m in bus.messages(Topic.GPU)
        for r in decode(Topic.GPU, m.value)
        if (r.node, r.ts, r.gpu) == (first["node"], first["ts"], first["gpu"])
    )
    for field, value in first.items():
        if value is not None:
            assert getattr(sample, field) == pytest.approx(value)


def test_stream_is_paced_by_simulated_time():
    sim = Simulator(
        load_profile(profile_path("llama3")), nodes=2, duration_ms=10 * MINUTE, interval_ms=60_000, seed=1
    )
    now = [0.0]
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    stream(sim, InMemoryBus(), speed=60.0, clock=lambda: now[0], sleep=sleep)
    # 10 instants a simulated minute apart at 60x: the last goes out 9 real seconds after the first
    assert now[0] == pytest.approx(9.0)
    assert len(sleeps) == 9
