"""The risk HTTP API over a real service (in-memory bus, real engine, trained model)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.simulator import stream
from foreshock.predictor.api import create_app
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def service(risk_model_dir) -> RiskService:
    bus = InMemoryBus(partitions=2)
    svc = RiskService(bus, OnlineEngines(DEFAULT_FEATURE_SET), PathModelSource(risk_model_dir),
                      config=ServiceConfig(score_every_ms=5 * 60_000)).start()
    return svc


@pytest.fixture(scope="module")
def client(service) -> TestClient:
    return TestClient(create_app(service, token=TOKEN))


def test_not_ready_until_the_consumer_has_caught_up(service, client):
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False
    assert "partition assignment" in r.json()["reason"]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/v1/nodes").json() == {"total": 0, "nodes": []}
    sim = simulator(minutes=25)
    stream(sim, service.bus)
    for _ in range(50):
        service.run_once()
    assert client.get("/readyz").json() == {"ready": True, "reason": "ready"}


def test_nodes_by_risk_with_filters_and_one_node_in_detail(service, client):
    body = client.get("/v1/nodes").json()
    probs = [n["probability"] for n in body["nodes"]]
    assert body["total"] == len(body["nodes"]) > 0 and probs == sorted(probs, reverse=True)
    threshold = service.model.threshold
    assert all(n["alert"] == (n["probability"] >= threshold) for n in body["nodes"])
    alerting = client.get("/v1/nodes", params={"alert": "true"}).json()
    assert all(n["alert"] for n in alerting["nodes"])
    assert client.get("/v1/nodes", params={"limit": 2}).json()["nodes"] == body["nodes"][:2]
    assert {n["node"] for n in client.get("/v1/nodes", params={"prefix": "node000"}).json()["nodes"]} == {
        n["node"] for n in body["nodes"] if n["node"].startswith("node000")}
    assert client.get("/v1/nodes", params={"min_probability": 2}).status_code == 422
    top = body["nodes"][0]["node"]
    detail = client.get(f"/v1/nodes/{top}").json()
    assert detail["probability"] == body["nodes"][0]["probability"]
    assert len(detail["top_features"]) == 5 and detail["model_version"] == service.model.version
    assert {"name", "value", "contribution"} <= set(detail["top_features"][0])
    history = [h["ts"] for h in detail["history"]]
    assert len(history) >= 3 and history == sorted(history) and history[-1] == detail["ts"]
    missing = client.get("/v1/nodes/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_model_metrics_and_docs(service, client):
    model = client.get("/v1/model").json()
    assert model["feature_set_hash"] == DEFAULT_FEATURE_SET.hash
    assert model["threshold"] == service.model.threshold
    assert model["feature_names"] == service.model.feature_names
    text = client.get("/metrics").text
    ready = "1.0" if service.readiness()[0] else "0.0"  # whether or not an earlier test fed the service
    for name in ("foreshock_predictor_records_consumed_total", "foreshock_predictor_consumer_lag_records",
                 "foreshock_predictor_scoring_duration_seconds_bucket", "foreshock_predictor_nodes_in_alert",
                 "foreshock_predictor_dead_letters_total", f"foreshock_predictor_ready {ready}"):
        assert name in text
    labelled = [line for line in text.splitlines() if "node=" in line]  # only the fleet's per-node gauges
    assert all(line.startswith(("foreshock_node_failure_probability{", "foreshock_node_alert{"))
               for line in labelled)
    assert client.get("/docs").status_code == 200
    assert {"/v1/nodes", "/v1/nodes/{node}", "/v1/score", "/v1/model", "/readyz"} <= set(
        client.get("/openapi.json").json()["paths"])


def test_scoring_needs_the_token_and_rejects_bad_input(service, client):
    one = {"rows": [{n: 0.0 for n in service.model.feature_names}]}
    assert client.post("/v1/score", json=one).status_code == 401
    assert client.post("/v1/score", json=one, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = client.post("/v1/score", json=one, headers=AUTH)
    assert ok.status_code == 200
    score = ok.json()["scores"][0]
    assert 0 <= score["probability"] <= 1
    assert score["alert"] == (score["probability"] >= ok.json()["threshold"])
    missing = client.post("/v1/score", json={"rows": [{"x": 1}]}, headers=AUTH)
    assert missing.status_code == 400 and "missing feature" in missing.json()["detail"]
    assert client.post("/v1/score", json={}, headers=AUTH).status_code == 400
    assert client.post("/v1/score", content=b"{", headers={**AUTH, "Content-Type": "application/json"}
                       ).status_code == 422
    bad = client.post("/v1/score", json={"telemetry": {"gpu": [{"node": "n", "ts": -1, "gpu": 0}]}},
                      headers=AUTH)
    assert bad.status_code == 400 and "ts" in bad.json()["detail"]
    assert client.post("/v1/score", json={"telemetry": {"disk": []}}, headers=AUTH).status_code == 400
    window = {"telemetry": {"gpu": [{"node": "n1", "ts": 60_000 * i, "gpu": 0, "gpu_temp": 60.0}
                                    for i in range(1, 10)]}}
    scored = client.post("/v1/score", json=window, headers=AUTH).json()["scores"]
    assert [(s["node"], s["ts"]) for s in scored] == [("n1", 600_000)]
    closed = TestClient(create_app(service, token=None))
    assert closed.post("/v1/score", json=one, headers=AUTH).status_code == 403


def test_health_reports_a_dead_loop(service):
    client = TestClient(create_app(service, token=TOKEN))
    service.error = RuntimeError("boom")
    try:
        assert client.get("/healthz").status_code == 503
        assert "boom" in client.get("/readyz").json()["reason"]
    finally:
        service.error = None


BIG = 23 * 10**6  # the unauthenticated body that used to be read and parsed before the 401


def _raw_post(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, int, bytes]:
    """POST /v1/score straight into the ASGI app; returns (status, body bytes the app pulled, answer)."""
    pulled = 0
    pending = list(chunks)
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal pulled
        chunk = pending.pop(0) if pending else b""
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/score", "raw_path": b"/v1/score", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"), *headers]}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], pulled, body


def test_a_body_over_the_limit_is_refused_before_it_is_read_and_before_auth(service, client):
    big = b'{"rows": [' + b" " * (BIG - 12) + b"]}"
    r = client.post("/v1/score", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "1,048,576 bytes" in r.json()["detail"]  # not 401: nothing parsed
    assert client.post("/v1/score", content=big, headers={**AUTH, "Content-Type": "application/json"}
                       ).status_code == 413
    app = create_app(service, token=TOKEN)
    status, pulled, _ = _raw_post(app, [(b"content-length", str(BIG).encode())], [b" " * (1 << 16)] * 360)
    assert (status, pulled) == (413, 0)  # refused from the header alone
    # without a Content-Length (chunked), it stops reading once past the limit
    status, pulled, body = _raw_post(app, [], [b" " * (1 << 16)] * 360)
    assert status == 413 and pulled <= (1 << 20) + (1 << 16) and b"over" in body
    # the limit is the caller's: a small one refuses a valid request, a request under it is served
    small = TestClient(create_app(service, token=TOKEN, max_body_bytes=64))
    one = {"rows": [{n: 0.0 for n in service.model.feature_names}]}
    assert small.post("/v1/score", json=one, headers=AUTH).status_code == 413
    assert client.post("/v1/score", json=one, headers=AUTH).status_code == 200


def test_the_openapi_schema_lists_the_error_answers_and_metrics_as_text(client):
    paths = client.get("/openapi.json").json()["paths"]
    score = paths["/v1/score"]["post"]["responses"]
    assert {"400", "401", "403", "413", "422", "503"} <= set(score)
    assert score["413"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorDetail")
    assert "404" in paths["/v1/nodes/{node}"]["get"]["responses"]
    assert "503" in paths["/readyz"]["get"]["responses"] and "503" in paths["/v1/model"]["get"]["responses"]
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain"}  # not documented as JSON
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_not_ready_while_far_behind_the_topics_or_without_a_broker(risk_model_dir):
    bus = InMemoryBus(partitions=2)
    svc = RiskService(bus, OnlineEngines(DEFAULT_FEATURE_SET), PathModelSource(risk_model_dir),
                      config=ServiceConfig(score_every_ms=5 * 60_000, max_lag=50, max_records=10)).start()
    api = TestClient(create_app(svc, token=TOKEN))
    stream(simulator(minutes=10), bus)
    for _ in range(400):
        svc.run_once()
        if svc.lag_records == 0:
            break
    assert api.get("/readyz").json() == {"ready": True, "reason": "ready"}
    stream(simulator(minutes=30, start_ms=simulator(minutes=10).end_ms), bus)  # a burst: ~800 messages
    svc.run_once()
    r = api.get("/readyz")
    assert r.status_code == 503 and "messages behind its topics (ready at 50 or fewer)" in r.json()["reason"]
    assert b"foreshock_predictor_ready 0.0" in svc.metrics.render()
    while svc.lag_records > 50:
        svc.run_once()
    assert api.get("/readyz").status_code == 200  # back within the bound: ready again
    svc._stream.consumer.reachable = lambda: False  # what KafkaConsumerMember says with no broker up
    r = api.get("/readyz")
    assert r.status_code == 503 and r.json()["reason"].startswith("broker unreachable")
