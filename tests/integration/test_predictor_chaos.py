"""``foreshock serve`` under stress against a real broker (8 partitions, 12 nodes on 7 of them).

- Chaos: serve is killed with SIGKILL at random points of its run (seeded; the seed is in the
  failure message), each time while a boundary is half published (some partitions have published
  it, others not), and restarted; the union of everything it published equals the scores of a run
  that never stopped, boundary for boundary, and no (node, ts) was ever published with two values.
- Catch-up: serve runs while a simulated cluster streams in at 720 times real time, so its
  partitions are read unevenly, some to their end while others lag; every boundary of every
  partition that has a node gets its scores.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from foreshock.ingest.contract import TELEMETRY_TOPICS, Topic, decode, partition_of
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.simulator import stream
from tests.fixtures.kafka import PARTITIONS
from tests.fixtures.predictor import simulator
from tests.integration.test_poison_messages import FolderServe
from tests.integration.test_predictor_kafka import TopicReader, by_key, complete, reference_scores, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

PERIOD_MS = 5 * 60_000
KILLS = 3
# small polls and frequent checkpoints (a partition every 1/8 s): kills land between and inside them
SLOW = ("--max-poll-records", "5", "--checkpoint-every", "1s")


@pytest.fixture
def procs():
    started: list[FolderServe] = []
    yield started
    for p in started:
        p.stop()


class Tail:
    """Follows a topic from an offset mark on a thread of its own, so that :meth:`read` answers at
    once with what has arrived (a wait can then catch a moment that lasts a fraction of a second)."""

    def __init__(self, bootstrap: str, topic: str, mark: dict):
        self.topic = topic
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._consumer.assign(list(mark))
        for tp, offset in mark.items():
            self._consumer.seek(tp, offset)
        self._records: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"tail-{topic}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            batch = self._consumer.poll(timeout_ms=200)
            got = [r for rs in batch.values() for m in rs for r in decode(self.topic, m.value)]
            with self._lock:
                self._records += got

    def read(self) -> list:
        with self._lock:
            return list(self._records)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def half_published(records: list, expected: dict[tuple[str, int], float]) -> list[int]:
    """Boundaries that some, but not all, of their expected nodes have been published for."""
    seen: dict[int, set[str]] = defaultdict(set)
    for s in records:
        seen[s.ts].add(s.node)
    wanted: dict[int, set[str]] = defaultdict(set)
    for node, ts in expected:
        wanted[ts].add(node)
    return sorted(ts for ts, nodes in seen.items() if nodes and not wanted[ts] <= nodes)


def kill_at_random_points(bootstrap: str, model_dir: Path, tmp: Path, procs: list, seed: int,
                          expected: dict[tuple[str, int], float]) -> tuple[str, Tail, list[list[int]]]:
    """Serve of a fresh group, killed with SIGKILL at :data:`KILLS` random points of its run and
    restarted after each; returns the group, a tail of its scores and, per kill, the boundaries it
    left half published.

    Serve publishes in bursts (a partition's boundaries close once every one of its logs has been
    read), and a run can publish everything in one burst before the kill: then a fresh group
    starts over, at most three times, until two kills or more have cut a run short.
    """
    rng = random.Random(seed)
    for _ in range(3):
        tail = Tail(bootstrap, Topic.RISK, TopicReader(bootstrap, Topic.RISK).mark())
        group = f"chaos-{uuid.uuid4().hex[:6]}"
        halves, cut_short = [], 0
        for share in sorted(rng.uniform(0.1, 0.7) for _ in range(KILLS)):  # random points of the run
            # past the share, and past what the runs before published: this run has made progress
            goal = max(share * len(expected), len(by_key(tail.read())) + 1)
            if goal > len(expected):  # a run went to the end before its kill
                break
            serve = FolderServe(tmp, bootstrap, model_dir, group, *SLOW)
            procs.append(serve)
            wait_for(f"{share:.0%} of the scores (seed {seed})", lambda: len(by_key(tail.read())) >= goal,  # noqa: B023
                     timeout=90, every=0.01, explain=serve.describe)
            # then, if it comes within a quarter of a second, the first moment a boundary is half
            # published: the kill lands inside it (otherwise wherever the process is)
            deadline = time.monotonic() + 0.25
            while time.monotonic() < deadline and not half_published(tail.read(), expected):
                time.sleep(0.01)
            serve.kill9()
            time.sleep(0.5)  # what the broker acknowledged before the kill
            published = tail.read()
            cut_short += len(by_key(published)) < len(expected)
            halves.append(half_published(published, expected))
        if cut_short >= 2:
            return group, tail, halves
        tail.close()
    raise AssertionError(f"three times, no more than one kill landed before the end of a run (seed {seed})")


def test_kill_9_at_random_points_publishes_the_scores_of_a_run_that_never_stopped(
        kafka_bootstrap, risk_model_dir, procs, tmp_path):
    seed = random.randrange(2**16)
    sim = simulator(minutes=3 * 60)  # 36 boundaries
    expected = reference_scores(sim, risk_model_dir, PERIOD_MS)
    bus = KafkaBus(kafka_bootstrap)
    stream(sim, bus)
    bus.close()
    group, tail, halves = kill_at_random_points(kafka_bootstrap, risk_model_dir, tmp_path, procs, seed,
                                                expected)
    assert any(halves), f"no kill landed inside a boundary (seed {seed})"
    last = FolderServe(tmp_path, kafka_bootstrap, risk_model_dir, group, *SLOW)
    procs.append(last)
    records = wait_for(f"every score (seed {seed})", lambda: complete(tail.read(), expected),
                       timeout=120, explain=last.describe)
    tail.close()
    union: dict[tuple[str, int], float] = {}
    for s in records:
        key = (s.node, s.ts)
        assert union.setdefault(key, s.probability) == s.probability, f"two values for {key} (seed {seed})"
    assert union == expected, f"seed {seed}"
    assert len(records) > len(expected), "the restarts replayed nothing"


def start_at_the_end(bootstrap: str, group: str) -> None:
    """Commit ``group``'s offsets at the end of every telemetry log, so that a serve of that group
    (without checkpoints) reads only what is produced from now on."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in TELEMETRY_TOPICS for p in range(PARTITIONS)]
        ends = consumer.end_offsets(parts)
        consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in ends.items()})
    finally:
        consumer.close(autocommit=False)


def test_every_boundary_of_every_partition_is_scored_while_serve_catches_up(
        kafka_bootstrap, risk_model_dir, procs, tmp_path: Path):
    sim = simulator(minutes=120, seed=9)
    expected = reference_scores(sim, risk_model_dir, PERIOD_MS)
    group = f"catchup-{uuid.uuid4().hex[:6]}"
    start_at_the_end(kafka_bootstrap, group)
    reader = TopicReader(kafka_bootstrap, Topic.RISK)
    mark = reader.mark()
    serve = FolderServe(tmp_path, kafka_bootstrap, risk_model_dir, group, "--max-poll-records", "200")
    procs.append(serve)
    wait_for("readiness", serve.ready, timeout=90, explain=serve.describe)
    bus = KafkaBus(kafka_bootstrap)
    started = time.monotonic()
    stream(sim, bus, speed=720.0)  # two hours in ten seconds
    bus.close()
    assert time.monotonic() - started > 5, "the stream must last long enough for serve to work through it"
    part = {n: partition_of(n, PARTITIONS) for n in sim.node_names}

    def boundaries(keys) -> dict[int, set[int]]:
        out: dict[int, set[int]] = defaultdict(set)
        for node, ts in keys:
            out[part[node]].add(ts)
        return out

    want = boundaries(expected)
    assert len(want) == 7

    def missing() -> dict[int, list[int]]:
        have = boundaries(by_key(reader.since(mark)))
        return {p: sorted(want[p] - have[p]) for p in want if want[p] - have[p]}

    wait_for("every boundary of every partition", lambda: not missing(), timeout=120,
             explain=lambda: f"boundaries with no score, by partition: {missing()}\n{serve.describe()}")
    scored = by_key(reader.since(mark))
    assert len(set(scored) & set(expected)) >= 0.99 * len(expected)
