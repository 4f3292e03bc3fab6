"""The risk API in a process of its own (``foreshock.predictor.front``), fed by a real service.

A real :class:`RiskService` (in-memory bus, real engine, trained model) scores in this process; the
API process is spawned as ``foreshock serve`` spawns it and answered over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pandas as pd
import psutil
import pytest

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import FeatureContribution, RiskScore
from foreshock.ingest.kafka_local import free_port
from foreshock.ingest.simulator import stream
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.front import ApiProcess, Bridge, Feed, Mirror
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.scoring import RiskBoard
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator
from tests.unit.test_process_metrics import by_label, samples

TOKEN = "front-token"


def _until(check, timeout: float = 30.0):
    """``check()``'s first truthy answer, polled; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except httpx.TransportError:
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not so within {timeout} s")


@pytest.fixture(scope="module")
def front(risk_model_dir):
    service = RiskService(InMemoryBus(partitions=2), OnlineEngines(DEFAULT_FEATURE_SET),
                          PathModelSource(risk_model_dir),
                          config=ServiceConfig(score_every_ms=5 * 60_000)).start()
    port = free_port()
    api = ApiProcess(service, host="127.0.0.1", port=port, history=service.config.history, token=TOKEN,
                     log_level="WARNING").start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        yield service, api, client
    finally:
        api.stop()
        client.close()


def test_the_api_process_mirrors_readiness_and_the_board(front):
    service, _, client = front
    assert _until(lambda: client.get("/readyz").json()["reason"].startswith("waiting for a partition"))
    stream(simulator(minutes=25), service.bus)
    for _ in range(50):
        service.run_once()
    assert service.board.latest()
    assert _until(lambda: client.get("/readyz").json() == {"ready": True, "reason": "ready"})
    expected = [{"node": s.node, "ts": s.ts, "probability": s.probability, "alert": s.alert}
                for s in service.board.latest()]
    assert _until(lambda: client.get("/v1/nodes", params={"limit": 1000}).json()["nodes"] == expected)
    node = expected[0]["node"]
    detail = client.get(f"/v1/nodes/{node}").json()
    latest, past = service.board.node(node)
    assert detail["top_features"] == [{"name": f.name, "value": f.value, "contribution": f.contribution}
                                      for f in latest.top_features]
    assert [(h["ts"], h["probability"], h["alert"]) for h in detail["history"]] == past
    assert client.get("/v1/model").json()["version"] == service.model.version


def test_a_node_forgotten_by_the_loop_leaves_the_api_and_comes_back_restored(front):
    service, _, client = front
    gone = service.board.latest()[-1].node
    kept = service.board.export([gone])
    service.board.forget([gone])
    assert _until(lambda: client.get(f"/v1/nodes/{gone}").status_code == 404)
    service.board.restore(kept)
    assert _until(lambda: client.get(f"/v1/nodes/{gone}").status_code == 200)


def test_metrics_and_scoring_are_answered_by_the_scoring_process(front):
    service, _, client = front
    found = samples(client.get("/metrics").text)
    assert by_label(found, "foreshock_node_failure_probability", "node") == {
        s.node: s.probability for s in service.board.latest()}
    assert found[("foreshock_predictor_ready", ())] == 1.0
    row = {name: 0.0 for name in service.model.feature_names}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    scored = client.post("/v1/score", json={"rows": [{**row, "node": "n1", "ts": 60_000}]}, headers=auth)
    assert scored.status_code == 200
    expected = service.score_rows(pd.DataFrame([{**row, "node": "n1", "ts": 60_000}]))
    assert scored.json()["scores"][0]["probability"] == expected[0].probability
    missing = client.post("/v1/score", json={"rows": [{"node": "n1"}]}, headers=auth)  # KeyError over there
    assert missing.status_code == 400 and "missing feature columns" in missing.json()["detail"]


def test_the_bridge_answers_only_the_calls_the_api_may_forward(front):
    service = front[0]
    here, there = multiprocessing.Pipe()
    Bridge(there, service).start()
    here.send(("close", ()))  # a method of the service, but not one the API process may call
    status, error = here.recv()
    assert status == "raise" and "not a call the API process may forward" in str(error)
    assert service._stream is not None
    here.send(("metrics_text", (False,)))
    status, text = here.recv()
    assert status == "ok" and b"foreshock_predictor_ready" in text and b"foreshock_node_alert{" not in text
    here.close()


def test_a_failed_loop_shows_on_healthz_and_the_api_process_exits_when_the_feed_closes(front):
    service, api, client = front
    service.error = RuntimeError("disk full")
    try:
        assert _until(lambda: client.get("/healthz").status_code == 503)
        assert "disk full" in client.get("/healthz").json()["reason"]
        assert client.get("/readyz").status_code == 503
    finally:
        service.error = None
    api.stop()
    assert api.process.exitcode == 0


@contextlib.contextmanager
def _serving(model, *flags: str):
    """A ``foreshock serve`` on the in-memory bus, healthy, with its API process."""
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "foreshock", "serve", "--model", str(model), "--port",
                              str(port), "--simulate-nodes", "4", *flags], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        try:  # a start on a loaded two-core host (the suite runs two files at a time) can take 30 s
            _until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200, timeout=120)
        except AssertionError:
            serve.kill()
            raise AssertionError(f"serve never answered /healthz: {serve.communicate()[1][-3000:]}") from None
        # its other child, if any, is multiprocessing's tracker
        (api,) = [c for c in psutil.Process(serve.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        yield serve, api
    finally:
        serve.kill()


def _thread_nices(pid: int) -> list[int]:
    """The niceness of each thread of ``pid`` (Linux: a thread's own, field 19 of its stat)."""
    return [int(Path(f"/proc/{pid}/task/{t.id}/stat").read_text().rpartition(")")[2].split()[16])
            for t in psutil.Process(pid).threads()]


def test_the_scoring_loop_runs_nicer_than_the_api_process(risk_model_dir):
    with _serving(risk_model_dir, "--scoring-nice", "7") as (serve, api):
        assert 7 in _thread_nices(serve.pid)  # the loop's thread
        assert 0 in _thread_nices(serve.pid)  # the Kafka client's and the feed's keep theirs
        assert set(_thread_nices(api.pid)) == {0}


def test_serve_stops_with_an_error_when_its_api_process_dies(risk_model_dir):
    with _serving(risk_model_dir) as (serve, api):
        api.send_signal(signal.SIGKILL)
        _, err = serve.communicate(timeout=60)
        assert serve.returncode == 1 and "the API process exited with code -9" in err


def test_serve_stops_cleanly_on_sigterm_and_takes_its_api_process_along(risk_model_dir):
    with _serving(risk_model_dir) as (serve, api):
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=60)
        assert serve.returncode == 0
        assert not api.is_running() or api.status() == psutil.STATUS_ZOMBIE


def _scores(ts: int, nodes: int = 64) -> list[RiskScore]:
    top = [FeatureContribution(name=f"feature_{i}", value=float(i), contribution=0.1 * i) for i in range(5)]
    return [RiskScore(node=f"n{n:03d}", ts=ts, probability=(n * ts % 97) / 97, alert=n % 7 == 0,
                      threshold=0.5, top_features=top) for n in range(nodes)]


def test_a_reader_that_stalls_bounds_the_feed_and_gets_the_whole_board_back():
    board = RiskBoard(history=5)
    service = types.SimpleNamespace(board=board, model=None, readiness=lambda: (True, "ready"),
                                    failure=lambda: None)
    board.record(_scores(0))
    reader, writer = multiprocessing.Pipe(duplex=False)
    feed = Feed(writer, service, every_s=0.05, max_backlog=5).start()
    try:
        for ts in range(1, 200):  # nobody reads: the pipe fills, then the queue, then the feed stops queueing
            board.record(_scores(ts))
            assert feed._changes.qsize() <= feed.max_backlog
        assert feed._resync  # changes were dropped: the whole board goes once the reader takes again
        board.forget(["n000"])
        mirror = Mirror(reader, calls=None, history=5)

        def caught_up() -> bool:
            while reader.poll(0.01):
                mirror.apply(reader.recv_bytes())
            return mirror.board.latest() == board.latest() and all(
                mirror.board.node(s.node) == board.node(s.node) for s in board.latest())

        assert _until(caught_up, timeout=30)
        assert mirror.board.node("n000") is None and len(mirror.board.latest()) == 63
    finally:
        feed.stop()
