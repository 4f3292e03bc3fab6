"""``foreshock serve`` against a real broker that this module owns (it stops and restarts it):
time anomalies from a foreign producer, readiness through lag and a broker outage, the body cap,
and the broker's own log.

- kcat writes, among live telemetry, one record 6 h ahead of its receipt, one at ts = 2^53 and one
  ten minutes behind its log: each is dead-lettered with its reason, every node's scores equal a
  run without them, and no checkpoint holds the jump.
- ``/readyz`` answers 503 with the reason while serve is more than ``--max-lag`` messages behind
  its topics and while no broker answers, and 200 again once it has caught up / the broker is back.
- A request announcing 23 MB is answered 413 from its headers, before any of the body is sent.
- The local broker logs at INFO to ``broker.log`` (it held only SLF4J "NOP logger" lines).
"""

from __future__ import annotations

import shutil
import socket
import time

import pytest

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.contract import MAX_EPOCH_MS, GpuSample, Topic, encode
from foreshock.ingest.kafka_bus import KafkaBus, ensure_topics
from foreshock.ingest.kafka_local import LocalKafka
from foreshock.ingest.simulator import stream
from foreshock.ingest.stream import now_ms
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.engines import OnlineEngines
from tests.fixtures.kafka import PARTITIONS
from tests.fixtures.predictor import simulator
from tests.integration.test_poison_messages import FolderServe, kcat_produce
from tests.integration.test_predictor_kafka import TopicReader, by_key, complete, reference_scores, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(420),
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not on PATH "
                       "(scripts/install-services.sh installs it; `make test` runs that script)"),
]

HOUR = 3_600_000
PERIOD_MS = 5 * 60_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker of this module's own (never an external one: a test stops it)."""
    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka"), quick_start=True).start()
    try:
        ensure_topics(kafka.bootstrap, Topic.ALL, partitions=PARTITIONS)
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture
def procs():
    started: list[FolderServe] = []
    yield started
    for p in started:
        p.stop()


def test_the_local_broker_logs_at_info_to_broker_log(broker):
    log = (broker.data_dir / "broker.log").read_text(errors="replace")
    assert "Kafka Server started (kafka.server.KafkaRaftServer)" in log
    assert "NOP" not in log and " INFO " in log


def test_records_dated_far_from_their_time_are_dead_lettered_and_move_nothing(broker, risk_model_dir, procs,
                                                                               tmp_path):
    # live telemetry: the 40 minutes before now (scores are made of event time; any start would do)
    start = (now_ms() - 40 * 60_000) // 60_000 * 60_000
    sim = simulator(minutes=30, start_ms=start)
    expected = reference_scores(sim, risk_model_dir, PERIOD_MS)
    letters = TopicReader(broker.bootstrap, Topic.DEADLETTER)
    scores = TopicReader(broker.bootstrap, Topic.RISK)
    letters_mark, scores_mark = letters.mark(), scores.mark()
    middle = start + 15 * 60_000
    poison = {
        "node0003": encode(GpuSample(node="node0003", ts=middle + 6 * HOUR, gpu=0, gpu_temp=60.0)),
        "node0005": encode(GpuSample(node="node0005", ts=MAX_EPOCH_MS, gpu=0, gpu_temp=60.0)),
        "node0007": encode(GpuSample(node="node0007", ts=middle - 10 * 60_000, gpu=0, gpu_temp=60.0)),
    }
    bus = KafkaBus(broker.bootstrap)

    def among_the_traffic(ts: int) -> None:
        if ts == middle:  # after each node's records up to the middle, in front of the rest
            bus.flush()
            kcat_produce(broker.bootstrap, Topic.GPU, [k.encode() + b":" + v for k, v in poison.items()])

    stream(sim, bus, on_step=among_the_traffic)
    bus.close()
    serve = FolderServe(tmp_path, broker.bootstrap, risk_model_dir, "anomalies")
    procs.append(serve)
    got = wait_for("every risk record", lambda: complete(scores.since(scores_mark), expected), timeout=180,
                   explain=serve.describe)
    assert by_key(got) == expected  # the poisoned nodes' too
    found = wait_for("three dead letters", lambda: (d := letters.since(letters_mark)) and len(d) >= 3 and d,
                     timeout=30, explain=serve.describe)
    dead = {d.key: d for d in found}
    assert {k: d.value for k, d in dead.items()} == poison
    assert all(d.reason.startswith("time anomaly: ") for d in dead.values())
    assert "after its receipt (future tolerance 300 s)" in dead["node0003"].reason
    assert f"ts {MAX_EPOCH_MS} is dated" in dead["node0005"].reason
    assert "600 s behind the newest record of telemetry.gpu" in dead["node0007"].reason
    assert serve.ready() and "foreshock_predictor_dead_letters_total 3.0" in serve.get("/metrics").text
    time.sleep(3)  # a few checkpoint turns (--checkpoint-every 1s) after the last record
    store = CheckpointStore(tmp_path / "ckpt-anomalies", OnlineEngines(DEFAULT_FEATURE_SET).load)
    saved = [store.load(p)[1] for p in store.partitions()]
    assert saved and all(max(m["progress"].values()) <= sim.end_ms for m in saved)


def _post_headers_only(port: int, length: int) -> bytes:
    """Send a request's headers announcing ``length`` body bytes and none of the body; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % length)
        answer = b""
        while chunk := s.recv(65536):  # the server closes the connection after its answer
            answer += chunk
        return answer


def test_readyz_follows_the_lag_and_the_broker_and_big_bodies_are_refused_unread(broker, risk_model_dir,
                                                                                 procs, tmp_path):
    serve = FolderServe(tmp_path, broker.bootstrap, risk_model_dir, "ready", "--max-lag", "200",
                        "--max-poll-records", "1")
    procs.append(serve)
    wait_for("readiness", serve.ready, timeout=120, explain=serve.describe)
    answer = _post_headers_only(serve.port, 23 * 10**6)  # before the fix: no answer until the body came
    assert answer.startswith(b"HTTP/1.1 413") and b"request body over 1,048,576 bytes" in answer
    # a burst, sent far faster than serve, reading one message a poll, takes it in
    bus = KafkaBus(broker.bootstrap)
    t0 = now_ms() - 5 * 60_000
    for i in range(10_000):
        node = f"burst{i % 8}"
        bus.send(Topic.GPU, node, encode(GpuSample(node=node, ts=t0 + 10 * i, gpu=0, gpu_temp=60.0)))
    bus.close()
    behind = wait_for("not ready while behind", lambda: (r := serve.get("/readyz")).status_code == 503 and r,
                      timeout=60, every=0.1, explain=serve.describe)
    assert "messages behind its topics (ready at 200 or fewer)" in behind.json()["reason"]
    wait_for("ready once caught up", serve.ready, timeout=240, explain=serve.describe)
    broker.stop()
    try:
        down = wait_for("not ready without a broker", lambda: (r := serve.get("/readyz")).status_code == 503
                        and r, timeout=30, every=0.2, explain=serve.describe)
        assert down.json() == {"ready": False, "reason": "broker unreachable: the consumer has no connection "
                               "to any Kafka broker"}
        gauge = "foreshock_predictor_ready 0.0"  # the loop sets it each cycle
        wait_for("the ready gauge at 0", lambda: gauge in serve.get("/metrics").text, timeout=15,
                 explain=serve.describe)
    finally:
        broker.start()
    wait_for("ready once the broker is back", serve.ready, timeout=120, explain=serve.describe)
    assert serve.proc.poll() is None
