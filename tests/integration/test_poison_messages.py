"""Poison from a producer that is not ours, against a real broker: ``foreshock serve`` and
``foreshock mitigate`` stay up, dead-letter it with the reason and commit past it.

Into a running serve, halfway through a stream of telemetry, kcat writes every kind of bad message:
a tombstone, bytes that are not JSON, an empty batch, a field of the wrong type, a missing field,
an unknown major version, records of another topic's type, readings no device can produce, a
record whose node is not its key, a key that is not UTF-8, a 7 MiB value, and records dated 6 h
ahead, at 2^53 and 10 minutes behind their log. Serve stays up and ready, each message is on
``telemetry.deadletter`` with its reason, and every node is scored as without the poison.

The foreign producer is kcat (librdkafka; Debian's ``kcat``, installed by
scripts/install-services.sh, which ``make test`` runs). With ``-K: -Z`` a line ``node0001:``
is a tombstone (key, null value). ``-X topic.partitioner=murmur2_random`` hashes keys as the Java
client and kafka-python do, so each poison message lands in its node's own partition, in front
of that node's telemetry.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from kafka import KafkaConsumer, TopicPartition

from foreshock.ingest.contract import (
    DEAD_LETTER_MAX_VALUE,
    MAX_EPOCH_MS,
    TOMBSTONE_REASON,
    GpuSample,
    NodeEvent,
    RiskScore,
    Topic,
    encode,
)
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.kafka_local import free_port
from foreshock.ingest.simulator import stream
from foreshock.ingest.stream import now_ms, publish
from tests.fixtures.predictor import simulator
from tests.integration.test_predictor_kafka import (
    TOKEN,
    Serve,
    TopicReader,
    by_key,
    complete,
    reference_scores,
    wait_for,
)
from tests.unit.test_poison_records import oversize_invalid

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(420),
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not on PATH "
                       "(scripts/install-services.sh installs it; `make test` runs that script)"),
]

SEGMENT_MIN = 30
PERIOD_MS = 5 * 60_000
LATENESS_MS = 2 * 60_000
HOUR = 3_600_000


def kcat_produce(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    """Produce ``key:value`` lines with kcat; an empty value is a tombstone. Returns once the broker
    has acknowledged them (kcat waits for delivery before it exits)."""
    subprocess.run(
        ["kcat", "-b", bootstrap, "-P", "-t", topic, "-K:", "-Z", "-X", "topic.partitioner=murmur2_random",
         "-X", "message.max.bytes=10485760"],
        input=b"\n".join(lines) + b"\n", check=True, capture_output=True, timeout=60,
    )


class FolderServe(Serve):
    """One ``foreshock serve`` with its model from a folder (no MLflow server needed)."""

    def __init__(self, tmp: Path, bootstrap: str, model_dir: Path, group: str, *extra: str):
        self.port = free_port()
        self.log = tmp / f"serve-{group}-{self.port}.log"
        cmd = [sys.executable, "-m", "foreshock", "serve", "--kafka", bootstrap, "--model", str(model_dir),
               "--port", str(self.port), "--group", group, "--checkpoint-dir", str(tmp / f"ckpt-{group}"),
               "--checkpoint-every", "1s", "--score-every", "5m", "--log-level", "info", *extra]
        env = {**os.environ, "FORESHOCK_API_TOKEN": TOKEN}
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)


@pytest.fixture
def procs():
    started: list[Serve] = []
    yield started
    for p in started:
        p.stop()


def poison_kinds(sim) -> list[tuple[str, bytes, bytes | None, str]]:
    """Every kind of bad message a foreign producer can write, as (topic, key, value, what its dead
    letter's reason says): each key a node of ``sim``, so each lands in front of that node's telemetry
    in its partition. Timed ones are dated against the middle of the run, when they are produced."""
    middle = sim.start_ms + SEGMENT_MIN // 2 * 60_000
    gpu = {"v": 1, "node": "node0001", "ts": middle, "gpu": 0, "gpu_temp": 60.0}

    def js(**fields) -> bytes:
        return msgspec.json.encode({**gpu, **fields})

    return [
        (Topic.GPU, b"node0001", None, TOMBSTONE_REASON),
        (Topic.GPU, b"node0001", b"{not json", "malformed JSON"),
        (Topic.GPU, b"node0002", b"[]", "empty batch"),
        (Topic.GPU, b"node0001", js(gpu_temp="hot"), "at `$.gpu_temp`"),
        (Topic.GPU, b"node0001", msgspec.json.encode({"v": 1, "node": "node0001", "gpu": 0}),
         "missing required field `ts`"),
        (Topic.GPU, b"node0001", js(v=2), "unsupported schema version (this consumer knows v1)"),
        (Topic.GPU, b"node0003", encode(NodeEvent(node="node0003", ts=middle, event="failed")),
         "missing required field `gpu`"),  # a node event on the GPU topic
        (Topic.XID, b"node0003", encode(GpuSample(node="node0003", ts=middle, gpu=0)),
         "missing required field `xid`"),  # a GPU sample on the Xid topic
        (Topic.GPU, b"node0004", js(node="node0004", gpu_temp=-1e308), "at `$.gpu_temp`"),
        (Topic.GPU, b"node0004", js(node="node0004", fb_used=-5), "at `$.fb_used`"),
        (Topic.GPU, b"node0005", js(node="node0006"), "does not match message key"),
        (Topic.GPU, b"\xffnode0006", js(node="node0006"), "does not match message key"),  # key not UTF-8
        (Topic.GPU, b"node0007", oversize_invalid("node0007"), "at `$["),  # 7 MiB: its letter holds the head
        (Topic.GPU, b"node0008", js(node="node0008", ts=now_ms() + 6 * HOUR), "after its receipt"),
        (Topic.GPU, b"node0009", js(node="node0009", ts=MAX_EPOCH_MS), f"ts {MAX_EPOCH_MS} is dated"),
        (Topic.GPU, b"node0010", js(node="node0010", ts=middle - 10 * 60_000),
         "behind the newest record of telemetry.gpu"),
    ]


def test_serve_running_dead_letters_every_kind_of_poison_and_scores_as_without_it(
        kafka_bootstrap, risk_model_dir, procs, tmp_path):
    sim = simulator(minutes=SEGMENT_MIN)
    # serve reads the stream while it is produced, and the producer's batches of two topics can reach
    # the broker out of order: a lateness of two samples keeps a boundary open for the slower topic
    expected = reference_scores(sim, risk_model_dir, PERIOD_MS, lateness_ms=LATENESS_MS)
    letters, scores = TopicReader(kafka_bootstrap, Topic.DEADLETTER), TopicReader(kafka_bootstrap, Topic.RISK)
    letters_mark, scores_mark = letters.mark(), scores.mark()
    serve = FolderServe(tmp_path, kafka_bootstrap, risk_model_dir, "poison", "--lateness", "2m")
    procs.append(serve)
    wait_for("serve ready", serve.ready, timeout=90, explain=serve.describe)
    poison = poison_kinds(sim)
    middle = sim.start_ms + SEGMENT_MIN // 2 * 60_000
    bus = KafkaBus(kafka_bootstrap)

    def midway(ts: int) -> None:
        if ts != middle:
            return
        bus.flush()
        wait_for("serve to score the first half", lambda: any(s.ts >= middle - PERIOD_MS
                                                                for s in scores.since(scores_mark)),
                 timeout=120, explain=serve.describe)
        for topic in (Topic.GPU, Topic.XID):  # into the running serve, in front of the second half
            lines = [k + b":" + (v or b"") for t, k, v, _ in poison if t == topic]
            kcat_produce(kafka_bootstrap, topic, lines)

    stream(sim, bus, on_step=midway)
    bus.close()
    got = wait_for("every risk record", lambda: complete(scores.since(scores_mark), expected), timeout=180,
                   explain=serve.describe)
    # every node, the poisoned keys' nodes included; records reach a loaded serve in other polls than
    # the in-process reference, and the window sums add them in another order (a float32 ulp at most)
    assert by_key(got) == pytest.approx(expected, rel=1e-6)
    found = wait_for("every dead letter", lambda: (d := letters.since(letters_mark)) and len(d) >= len(poison)
                     and d, timeout=30, explain=serve.describe)
    assert len(found) == len(poison)
    for topic, key, value, why in poison:
        head = None if value is None else value[:DEAD_LETTER_MAX_VALUE]
        where = (topic, key.decode(errors="replace"), head)
        letter = [d for d in found if (d.topic, d.key, d.value) == where]
        assert len(letter) == 1, f"{key!r}: {value[:60] if value else value}"
        assert why in letter[0].reason and letter[0].offset is not None, (why, letter[0].reason)
    cut = next(d for d in found if d.truncated)
    big = next(v for _, k, v, _ in poison if k == b"node0007")
    assert cut.size == len(big) and cut.sha256 == hashlib.sha256(big).hexdigest()
    assert serve.ready() and serve.get("/readyz").json()["reason"] == "ready"
    assert f"foreshock_predictor_dead_letters_total {len(poison)}.0" in serve.get("/metrics").text
    assert serve.proc.poll() is None


def committed_and_end(bootstrap: str, group: str, topic: str) -> tuple[dict, dict]:
    """The group's committed offset and the log end of every partition of ``topic`` that holds any
    message (a consumer that names the group but never joins it reads the commits)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        end = {tp.partition: off for tp, off in consumer.end_offsets(parts).items() if off > 0}
        committed = {p: consumer.committed(TopicPartition(topic, p)) for p in end}
    finally:
        consumer.close(autocommit=False)
    return committed, end


def test_mitigate_survives_a_tombstone_on_risk_scores_and_commits_past_it(kafka_bootstrap, group_id,
                                                                          tmp_path):
    letters = TopicReader(kafka_bootstrap, Topic.DEADLETTER)
    mark = letters.mark()
    kcat_produce(kafka_bootstrap, Topic.RISK, [b"gpu-7:"])  # in front of gpu-7's scores, same partition
    bus = KafkaBus(kafka_bootstrap)
    t0 = now_ms()
    publish(bus, [RiskScore(node="gpu-7", ts=t0 + i, probability=p, alert=p >= 0.8, threshold=0.8)
                  for i, p in enumerate([0.5, 0.9, 0.95])])
    bus.flush()
    bus.close()
    audit = tmp_path / "audit.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "foreshock", "mitigate", "--metrics-port", "0", "--kafka", kafka_bootstrap,
         "--scheduler", "none", "--dry-run", "--audit", str(audit), "--group", group_id, "--run-for", "12s"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sqlite3.connect(audit).execute(
        "SELECT action, status, dry_run FROM mitigation_events WHERE node = 'gpu-7' ORDER BY seq").fetchall()
    assert rows == [("drain", "planned", 1), ("drain", "skipped", 1)]  # the scores behind it were acted on
    committed, end = committed_and_end(kafka_bootstrap, group_id, Topic.RISK)
    assert committed == end  # past the tombstone and everything after it, on every partition
    deadline = time.monotonic() + 30
    dead: list = []
    while time.monotonic() < deadline and not any(d.topic == Topic.RISK and d.key == "gpu-7" for d in dead):
        dead = letters.since(mark)
    # (the serve tests' older scores on risk.scores are rejected as stale: dead letters of other nodes)
    ours = [(d.topic, d.key, d.value, d.reason) for d in dead if d.topic == Topic.RISK and d.key == "gpu-7"]
    assert ours == [(Topic.RISK, "gpu-7", None, TOMBSTONE_REASON)]
