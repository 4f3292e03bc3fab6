"""``foreshock simulate --kafka``: the run lands on the real broker's topics, ground truth on node.events."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.commands.simulate import profile_path
from foreshock.ingest.contract import Topic
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.simulator import Simulator, load_profile
from foreshock.ingest.stream import RecordStream

pytestmark = pytest.mark.integration

ARGS = [
    "--profile",
    "llama3",
    "--nodes",
    "3",
    "--duration",
    "20m",
    "--interval",
    "30s",
    "--seed",
    "4",
    "--rate-multiplier",
    "20000",
]


def consume(
    bootstrap: str, group: str, topics: tuple[str, ...], expected: int, timeout_s: float = 60
) -> list:
    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(group, topics))
    records: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < expected and time.monotonic() < deadline:
            polled = stream.poll(timeout_s=1.0)
            records += [r for d in polled for r in d.records]
            stream.commit(polled)
    finally:
        stream.close()
    assert stream.dead_letters == 0
    return records


def test_simulate_kafka_streams_the_run(kafka_bootstrap, group_id):
    sim = Simulator(
        load_profile(profile_path("llama3")),
        nodes=3,
        duration_ms=20 * 60_000,
        interval_ms=30_000,
        seed=4,
        rate_multiplier=20000,
    )
    chunks = list(sim.chunks())
    gpu_rows = sum(c.gpu.num_rows for c in chunks)
    events = sim.events_table().num_rows
    assert events >= 1
    started = time.monotonic()
    result = CliRunner().invoke(app, ["simulate", *ARGS, "--kafka", kafka_bootstrap, "--speed", "600"])
    assert result.exit_code == 0, result.output
    # 40 instants 30 s apart at 600x: about 2 real seconds of pacing
    assert time.monotonic() - started >= 1.9
    records = consume(kafka_bootstrap, group_id, (Topic.GPU, Topic.NODE_EVENTS), gpu_rows + events)
    kinds = Counter(type(r).__name__ for r in records)
    assert kinds["GpuSample"] == gpu_rows
    assert kinds["NodeEvent"] == events
    failed = {
        (r.node, r.ts, r.cause) for r in records if type(r).__name__ == "NodeEvent" and r.event == "failed"
    }
    assert failed == {(sim.node_names[f.node], f.ts, f.cause) for f in sim.schedule.failures}
