"""``foreshock serve`` against a real Kafka broker and a real MLflow server.

Telemetry is published once per module; every run of the service is a separate process started
with the CLI. The expected scores come from the same service code run in-process on the
in-memory bus over the same records: the Kafka path must publish exactly those numbers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition
from mlflow.tracking import MlflowClient

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import RiskScore, Topic, decode
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.kafka_local import free_port
from foreshock.ingest.simulator import stream
from foreshock.models.artifact import RiskModel
from foreshock.models.registry import CHAMPION_ALIAS, CHAMPION_URI, MODEL_NAME, log_and_register
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.kafka import PARTITIONS
from tests.fixtures.predictor import simulator

pytestmark = pytest.mark.integration

PERIOD = "5m"
TOKEN = "integration-token"
SEGMENT_MIN = 60


def wait_for(what: str, check: Callable[[], object], timeout: float = 60, every: float = 0.3,
             explain: Callable[[], str] = lambda: ""):
    """``check()``'s first truthy answer; on timeout the error carries ``explain()`` (the state
    of the processes involved), so a failure in CI can be read without rerunning it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}\n{explain()}")


class Serve:
    """One ``foreshock serve`` process."""

    def __init__(self, tmp: Path, bootstrap: str, tracking: str, group: str, *extra: str):
        self.port = free_port()
        self.log = tmp / f"serve-{group}-{self.port}.log"
        cmd = [sys.executable, "-m", "foreshock", "serve", "--kafka", bootstrap, "--model", CHAMPION_URI,
               "--tracking-uri", tracking, "--port", str(self.port), "--group", group,
               "--checkpoint-dir", str(tmp / f"ckpt-{group}"), "--checkpoint-every", "1s",
               "--score-every", PERIOD, "--reload-every", "1s", "--log-level", "info", *extra]
        env = {**os.environ, "FORESHOCK_API_TOKEN": TOKEN}
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)

    def get(self, path: str, **params) -> httpx.Response:
        return self.http.get(path, params=params)

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"serve exited: {self.log.read_text()[-3000:]}"
        try:
            return self.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def nodes(self) -> dict[str, int]:
        return {n["node"]: n["ts"] for n in self.get("/v1/nodes", limit=10_000).json()["nodes"]}

    def partitions_owned(self) -> int:
        """The partition numbers this process owns, as its metrics report them."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith("foreshock_predictor_partitions_owned "):
                return int(float(line.split()[1]))
        raise AssertionError("no foreshock_predictor_partitions_owned metric")

    def describe(self) -> str:
        """Scores, partitions and log tail: what a timed-out wait reports about this process."""
        try:
            state = (f"ready: {self.get('/readyz').json()['reason']}; partitions {self.partitions_owned()}, "
                     f"nodes {sorted(self.nodes().items())}")
        except (httpx.TransportError, AssertionError) as exc:
            state = f"API unreachable ({exc})"
        if self.proc.poll() is None:  # serve dumps its threads' stacks on SIGUSR1
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
        return f"--- serve :{self.port} (exit {self.proc.poll()}): {state}\n{self.log.read_text()[-12000:]}"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.http.close()


class TopicReader:
    """Reads a topic from explicit offsets (no group), to tell one run's records from another's."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.parts = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))]
        self.consumer.assign(self.parts)

    def mark(self) -> dict:
        return dict(self.consumer.end_offsets(self.parts))

    def since(self, mark: dict) -> list:
        for tp in self.parts:
            self.consumer.seek(tp, mark.get(tp, 0))
        out = []
        while True:
            batch = self.consumer.poll(timeout_ms=500)
            if not batch:
                return out
            out += [r for records in batch.values() for m in records for r in decode(self.topic, m.value)]


def by_key(scores) -> dict[tuple[str, int], float]:
    return {(s.node, s.ts): s.probability for s in scores}


def complete(records: list, expected: dict) -> list | None:
    """``records`` once they cover every expected (node, ts), else None."""
    return records if len(by_key(records)) >= len(expected) else None


@pytest.fixture(scope="module")
def champion(mlflow_server, risk_model_dir) -> str:
    """Registers the trained model in the MLflow server as the champion; returns its version."""
    reg = log_and_register(RiskModel.load(risk_model_dir), tracking_uri=mlflow_server, params={}, metrics={},
                           dataset_fingerprint="predictor-tests", score_on_test=lambda m: 0.5)
    assert reg.promoted
    return reg.version


@pytest.fixture(scope="module")
def segment(kafka_bootstrap, risk_model_dir):
    """An hour of a 12-node cluster on the telemetry topics, and the scores it must produce."""
    sim = simulator(minutes=SEGMENT_MIN)
    bus = KafkaBus(kafka_bootstrap)
    stream(sim, bus)
    bus.close()
    expected = reference_scores(sim, risk_model_dir, 5 * 60_000)
    assert len({ts for _, ts in expected}) >= 10
    return sim, expected


def reference_scores(sim, model_dir: Path, period_ms: int,
                     lateness_ms: int = 0) -> dict[tuple[str, int], float]:
    """The scores an uninterrupted service gives the same telemetry: in-process, on the in-memory bus."""
    memory = InMemoryBus(partitions=1)
    stream(sim, memory)
    ref = RiskService(memory, OnlineEngines(DEFAULT_FEATURE_SET), PathModelSource(model_dir),
                      config=ServiceConfig(score_every_ms=period_ms, lateness_ms=lateness_ms)).start()
    expected: list[RiskScore] = []
    quiet = 0
    while quiet < 2:
        got = ref.run_once()
        expected += got
        quiet = 0 if got or ref.lag_records else quiet + 1
    return by_key(expected)


@pytest.fixture
def procs():
    started: list[Serve] = []
    yield started
    for p in started:
        p.stop()


def test_telemetry_to_risk_records_and_api_answers(kafka_bootstrap, mlflow_server, champion, segment,
                                                   procs, tmp_path):
    sim, expected = segment
    reader = TopicReader(kafka_bootstrap, Topic.RISK)
    mark = reader.mark()
    serve = Serve(tmp_path, kafka_bootstrap, mlflow_server, "e2e")
    procs.append(serve)
    wait_for("readiness", serve.ready, timeout=90)
    got = wait_for("every risk record", lambda: complete(reader.since(mark), expected), timeout=90)
    assert by_key(got) == expected
    assert all(s.model_version == champion and s.top_features for s in got)
    last = max(t for _, t in expected)
    nodes = serve.nodes()
    assert set(nodes) == {n for n, t in expected if t == last} and set(nodes.values()) == {last}
    node = sorted(nodes)[0]
    detail = serve.get(f"/v1/nodes/{node}").json()
    assert detail["probability"] == expected[(node, last)] and len(detail["top_features"]) == 5
    model = serve.get("/v1/model").json()
    assert model["version"] == champion and model["feature_set_hash"] == DEFAULT_FEATURE_SET.hash
    metrics = serve.get("/metrics").text
    assert "foreshock_predictor_ready 1.0" in metrics
    assert "foreshock_predictor_consumer_lag_records 0.0" in metrics
    assert serve.http.post("/v1/score", json={"rows": [{}]}).status_code == 401
    # a new champion trained on another feature set is refused; the old model keeps serving
    client = MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    other = tmp_path / "other"
    base = RiskModel.load(CHAMPION_URI, tracking_uri=mlflow_server)
    RiskModel(base.booster, feature_names=base.feature_names, feature_set_hash="f" * 64,
              threshold=base.threshold).save(other)
    bad = log_and_register(RiskModel.load(other), tracking_uri=mlflow_server, params={}, metrics={},
                           dataset_fingerprint="other", score_on_test=lambda m: 0.0)
    client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, bad.version)
    try:
        wait_for("the refusal", lambda: 'foreshock_predictor_model_reloads_total{result="refused"}'
                 in serve.get("/metrics").text, timeout=30)
        assert serve.get("/v1/model").json()["version"] == champion
    finally:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION_ALIAS, champion)


def test_kill_9_and_restart_publish_the_scores_of_a_run_that_never_stopped(
        kafka_bootstrap, mlflow_server, champion, segment, procs, tmp_path):
    _, expected = segment
    reader = TopicReader(kafka_bootstrap, Topic.RISK)
    mark = reader.mark()
    group = f"kill-{uuid.uuid4().hex[:6]}"
    # One record per poll and frequent checkpoints; the kill lands as soon as the first checkpoint
    # exists (a cheap file check, polled often), long before the segment is consumed.
    slow = ("--max-poll-records", "1", "--checkpoint-every", "100ms")
    first = Serve(tmp_path, kafka_bootstrap, mlflow_server, group, *slow)
    procs.append(first)
    checkpoints = tmp_path / f"ckpt-{group}"
    wait_for("a checkpoint", lambda: any(checkpoints.glob("p*/CURRENT")), timeout=120, every=0.01)
    first.kill9()
    before = reader.since(mark)
    assert len(by_key(before)) < len(expected), "the first run finished before the kill; nothing was replayed"
    second = Serve(tmp_path, kafka_bootstrap, mlflow_server, group, *slow)
    procs.append(second)
    records = wait_for("the rest of the scores", lambda: complete(reader.since(mark), expected), timeout=120)
    seen: dict[tuple[str, int], float] = {}
    for s in records:
        key = (s.node, s.ts)
        assert seen.setdefault(key, s.probability) == s.probability, f"two values for {key}"
    assert seen == expected


def test_two_processes_split_the_nodes_and_the_survivor_takes_over(kafka_bootstrap, mlflow_server, champion,
                                                                    segment, procs, tmp_path):
    sim, expected = segment
    last = max(t for _, t in expected)
    alive = {n for n, t in expected if t == last}
    a = Serve(tmp_path, kafka_bootstrap, mlflow_server, "pair")
    b = Serve(tmp_path, kafka_bootstrap, mlflow_server, "pair")
    procs += [a, b]
    wait_for("both ready", lambda: a.ready() and b.ready(), timeout=90,
             explain=lambda: f"{a.describe()}\n{b.describe()}")

    def split():
        # the group has settled (each owns some partitions, together all of them) and both have
        # scored their nodes to the end; before that, one may still show what it just gave up
        owned = a.partitions_owned(), b.partitions_owned()
        na, nb = a.nodes(), b.nodes()
        return min(owned) > 0 and sum(owned) == PARTITIONS and set(na) | set(nb) == alive \
            and set(na.values()) | set(nb.values()) == {last} and (na, nb)

    def explain() -> str:
        return f"alive {sorted(alive)} at {last}\n{a.describe()}\n{b.describe()}"

    nodes_a, nodes_b = wait_for("the nodes split between the two", split, timeout=120, explain=explain)
    assert not set(nodes_a) & set(nodes_b)
    letters = TopicReader(kafka_bootstrap, Topic.DEADLETTER)
    mark = letters.mark()
    bus = KafkaBus(kafka_bootstrap)
    bus.send(Topic.GPU, sorted(nodes_a)[0], b"{not json")
    bus.flush()
    a.kill9()
    later = simulator(minutes=20, start_ms=sim.end_ms)
    stream(later, bus)
    bus.close()
    taken = wait_for("the survivor to score the dead one's nodes", lambda: (n := b.nodes()) and any(
        n.get(node, 0) > last for node in nodes_a) and n, timeout=90, explain=b.describe)
    assert set(taken) >= set(nodes_b)
    dead = wait_for("the dead letter", lambda: letters.since(mark), timeout=30)
    assert dead[0].value == b"{not json" and "malformed JSON" in dead[0].reason
    assert b.ready()
