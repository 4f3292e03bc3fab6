"""Poison from a producer that is not ours, against a real broker: ``foreshock serve`` and
``foreshock mitigate`` stay up, dead-letter it with the reason and commit past it.

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
import pytest
from kafka import KafkaConsumer, TopicPartition

from foreshock.ingest.contract import (
    DEAD_LETTER_MAX_VALUE,
    TOMBSTONE_REASON,
    GpuSample,
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


def test_serve_dead_letters_foreign_poison_and_scores_as_without_it(kafka_bootstrap, risk_model_dir, procs,
                                                                    tmp_path):
    sim = simulator(minutes=SEGMENT_MIN)
    expected = reference_scores(sim, risk_model_dir, PERIOD_MS)
    letters, scores = TopicReader(kafka_bootstrap, Topic.DEADLETTER), TopicReader(kafka_bootstrap, Topic.RISK)
    letters_mark, scores_mark = letters.mark(), scores.mark()
    big = oversize_invalid("node0002")  # 7 MiB: its whole base64 dead letter would be 9.3 MiB
    stray = encode(GpuSample(node="node0003", ts=sim.start_ms, gpu=0, gpu_temp=99.0))
    kcat_produce(kafka_bootstrap, Topic.GPU, [
        b"node0001:",  # a tombstone
        b"node0002:" + big,
        b"\xffnode0003:" + stray,  # a key that is not UTF-8 (its record must not count)
    ])
    bus = KafkaBus(kafka_bootstrap)
    stream(sim, bus)  # after the poison: serve meets it first in those partitions
    bus.close()

    serve = FolderServe(tmp_path, kafka_bootstrap, risk_model_dir, "poison")
    procs.append(serve)
    got = wait_for("every risk record", lambda: complete(scores.since(scores_mark), expected), timeout=180,
                   explain=serve.describe)
    assert by_key(got) == expected  # every node, the poisoned keys' nodes included
    assert serve.ready() and serve.get("/readyz").json()["reason"] == "ready"
    found = wait_for("three dead letters", lambda: (d := letters.since(letters_mark)) and len(d) >= 3 and d,
                     timeout=30, explain=serve.describe)
    dead = {d.key: d for d in found}
    assert set(dead) == {"node0001", "node0002", "\ufffdnode0003"}
    assert all(d.topic == Topic.GPU and d.offset is not None for d in dead.values())
    tomb = dead["node0001"]
    assert (tomb.value, tomb.reason, tomb.truncated) == (None, TOMBSTONE_REASON, False)
    cut = dead["node0002"]
    assert cut.truncated and cut.value == big[:DEAD_LETTER_MAX_VALUE] and "$[" in cut.reason
    assert cut.size == len(big) and cut.sha256 == hashlib.sha256(big).hexdigest()
    odd = dead["\ufffdnode0003"]
    assert odd.value == stray and "does not match message key" in odd.reason
    assert "foreshock_predictor_dead_letters_total 3.0" in serve.get("/metrics").text
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
