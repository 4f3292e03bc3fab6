"""The risk HTTP API (FastAPI; OpenAPI at ``/docs``).

Reads come from a :class:`RiskReader`: the service itself, or in ``foreshock serve`` the API process's
mirror of it (:mod:`foreshock.predictor.front`). Reads answer from its
:class:`foreshock.predictor.scoring.RiskBoard` (no model call on a read);
``POST /v1/score`` runs the model on what the caller sends and needs the bearer token. The
token is passed in by the composition root (``foreshock serve``); this module reads no
environment. Errors are JSON ``{"detail": ...}``: 400/422 for bad input, 401/403 for a missing
or wrong token, 404 for an unknown node, 413 for a request body over the limit (1 MiB unless
configured), 503 with the reason when the service is not ready. ``/metrics`` is Prometheus text.
``/`` is the status page (``predictor/static/``, shipped with the package): plain HTML and
JavaScript that read the endpoints above from the operator's browser, and the mitigator's
``/status`` when the service knows its address.
"""

from __future__ import annotations

import html
import secrets
from collections.abc import Sequence
from importlib import resources
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec
import pandas as pd
from fastapi import Depends, FastAPI, HTTPException, Query, Response
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from foreshock.ingest.contract import MAX_EPOCH_MS, RecordError, RiskScore, Topic, decode
from foreshock.predictor.scoring import RiskBoard
from foreshock.predictor.service import NotReady

__all__ = ["create_app", "RiskReader", "BodyLimit", "MAX_BODY_BYTES", "status_page"]

_JSON = "application/json"
_KINDS = {"gpu": Topic.GPU, "xid": Topic.XID, "link": Topic.LINK, "events": Topic.NODE_EVENTS}
MAX_BODY_BYTES = 1 << 20
"""Request bodies larger than this are refused with 413 (``foreshock serve --max-body``)."""


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 before it is read.

    Why here and not in the endpoint: FastAPI reads and parses a body before it runs any
    dependency, the bearer-token check included, so an unauthenticated client could make the
    service read and parse a body of any size. A ``Content-Length`` over the limit is refused
    from the headers alone (nothing of the body is read, and the connection is closed); a body
    without one (chunked) is counted as it arrives and refused once it passes the limit.
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self.app = app
        self.max_bytes = max_bytes

    def _detail(self) -> str:
        return f"request body over {self.max_bytes:,} bytes"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            body = msgspec.json.encode({"detail": f"{self._detail()} (Content-Length {int(declared):,})"})
            await send({"type": "http.response.start", "status": 413, "headers": [
                (b"content-type", _JSON.encode()), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # FastAPI passes an HTTPException from the body read on
                    raise HTTPException(413, self._detail())
            return message

        await self.app(scope, counted, send)


class RiskReader(Protocol):
    """What the API reads and calls: :class:`foreshock.predictor.service.RiskService` in the same
    process, :class:`foreshock.predictor.front.Mirror` in a process of its own. ``model`` has the
    served model's ``version``, ``feature_set_hash``, ``threshold``, ``horizon_minutes``,
    ``feature_names`` and ``metrics``, or is None before one is loaded."""

    board: RiskBoard
    model: Any

    def failure(self) -> str | None: ...

    def readiness(self) -> tuple[bool, str]: ...

    def metrics_text(self) -> bytes: ...

    def score_rows(self, frame: pd.DataFrame) -> list[RiskScore]: ...

    def score_telemetry(self, records: Sequence[Any], at: int | None = None) -> list[RiskScore]: ...


class ErrorDetail(BaseModel):
    detail: str = Field(description="what was wrong, for a person")


class Health(BaseModel):
    status: str = Field(description="ok or failed")
    reason: str | None = None


class Readiness(BaseModel):
    ready: bool
    reason: str = Field(description="ready, or why not")


def _errors(**described: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error answers: ``_errors(e404="unknown node")``; all are ``{"detail"}``."""
    return {int(code[1:]): {"model": ErrorDetail, "description": text} for code, text in described.items()}


class Contribution(BaseModel):
    name: str
    value: float | None
    contribution: float = Field(description="SHAP contribution to the log-odds")


class NodeSummary(BaseModel):
    node: str
    ts: int = Field(description="event time the score is for (epoch ms)")
    probability: float
    alert: bool


class NodeList(BaseModel):
    total: int
    nodes: list[NodeSummary]


class HistoryPoint(BaseModel):
    ts: int
    probability: float
    alert: bool


class NodeDetail(NodeSummary):
    threshold: float
    horizon_minutes: int
    model_version: str
    top_features: list[Contribution]
    history: list[HistoryPoint]


class ScoreRequest(BaseModel):
    """Either ``rows`` (feature name -> value; optional ``node`` and ``ts``) or ``telemetry``
    (raw contract records by kind: ``gpu``, ``xid``, ``link``, ``events``) scored at ``at``."""

    rows: list[dict[str, Any]] | None = None
    telemetry: dict[str, list[dict[str, Any]]] | None = None
    at: int | None = Field(None, description="epoch ms to score a telemetry window at "
                           "(default: the minute tick after its last record)")


class ScoreResult(BaseModel):
    node: str
    ts: int
    probability: float
    alert: bool
    top_features: list[Contribution]


class ScoreResponse(BaseModel):
    model_version: str
    threshold: float
    scores: list[ScoreResult]


class ModelInfo(BaseModel):
    version: str
    feature_set_hash: str
    threshold: float
    horizon_minutes: int
    feature_names: list[str]
    metrics: dict[str, Any]


_ASSETS = {"status.js": "text/javascript; charset=utf-8", "status.css": "text/css; charset=utf-8"}
_MITIGATOR_META = '<meta name="foreshock-mitigator" content="">'


def _asset(name: str) -> bytes:
    return resources.files("foreshock.predictor").joinpath("static", name).read_bytes()


def status_page(mitigator_url: str | None = None) -> tuple[bytes, str]:
    """The status page's HTML, told where the mitigator's ``/status`` is, and its Content-Security-Policy:
    nothing loads from anywhere but this service, and the page may read only it and the mitigator."""
    page = _asset("index.html").decode()
    connect = "'self'"
    if mitigator_url:
        parts = urlsplit(mitigator_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"the mitigator URL must be http(s)://host[:port], not {mitigator_url!r}")
        connect += f" {parts.scheme}://{parts.netloc}"
        page = page.replace(_MITIGATOR_META, _MITIGATOR_META.replace(
            'content=""', f'content="{html.escape(mitigator_url.rstrip("/"), quote=True)}"'))
    policy = (f"default-src 'self'; connect-src {connect}; style-src 'self' 'unsafe-inline'; "
              "img-src 'self' data:; frame-ancestors 'none'")
    return page.encode(), policy


def _json(obj: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(obj), status_code=status, media_type=_JSON)


def _summary(s: RiskScore) -> dict[str, Any]:
    return {"node": s.node, "ts": s.ts, "probability": s.probability, "alert": s.alert}


def create_app(service: RiskReader, *, token: str | None, title: str = "Foreshock risk API",
               max_body_bytes: int = MAX_BODY_BYTES, mitigator_url: str | None = None) -> FastAPI:
    """The API over ``service``. ``token=None`` disables the write endpoints (403); a request body
    over ``max_body_bytes`` is answered 413 before it is read (:class:`BodyLimit`); the status page
    at ``/`` shows the mitigator's last actions when ``mitigator_url`` is given."""
    page, policy = status_page(mitigator_url)
    app = FastAPI(title=title, version="1", description=__doc__)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    def require_token(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            raise HTTPException(403, "write endpoints are disabled: the service has no API token configured")
        if cred is None or cred.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(cred.credentials.encode(), token.encode()):
            raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8",
                        headers={"Content-Security-Policy": policy, "Cache-Control": "no-cache"})

    @app.get("/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in _ASSETS:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_asset(name), media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health,
             "description": "the service loop stopped; the process is about to exit"}},
             summary="Liveness: the process and its service loop are running")
    async def healthz() -> Response:
        if (failure := service.failure()) is not None:
            return _json({"status": "failed", "reason": failure}, 503)
        return _json({"status": "ok"})

    @app.get("/readyz", response_model=Readiness, responses={503: {
             "model": Readiness, "description": "not ready: no model, no partitions yet, not caught up, "
             "no broker reachable, or too far behind the topics (the reason says which)"}},
             summary="Readiness: model loaded, broker reachable, consumer caught up")
    async def readyz() -> Response:
        ready, reason = service.readiness()
        return _json({"ready": ready, "reason": reason}, 200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
             responses={200: {"description": "Prometheus text exposition format 0.0.4"}})
    def metrics() -> Response:  # not async: the mirror forwards it to the scoring process and waits
        return Response(service.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/nodes", response_model=NodeList, summary="Nodes this process scores, highest risk first")
    async def nodes(
        alert: bool | None = Query(None, description="only nodes in (true) or out of (false) alert"),
        min_probability: float = Query(0.0, ge=0.0, le=1.0),
        prefix: str | None = Query(None, description="only node ids starting with this"),
        limit: int = Query(100, ge=1, le=100_000),
        offset: int = Query(0, ge=0),
    ) -> Response:
        picked = [s for s in service.board.latest()
                  if s.probability >= min_probability and (alert is None or s.alert == alert)
                  and (prefix is None or s.node.startswith(prefix))]
        return _json({"total": len(picked), "nodes": [_summary(s) for s in picked[offset:offset + limit]]})

    @app.get("/v1/nodes/{node}", response_model=NodeDetail, summary="A node's risk, top features and history",
             responses=_errors(e404="the node is not scored by this process"))
    async def node_detail(node: str) -> Response:
        found = service.board.node(node)
        if found is None:
            raise HTTPException(404, f"node {node!r} is not scored by this process")
        latest, past = found
        return _json({
            **_summary(latest), "threshold": latest.threshold, "horizon_minutes": latest.horizon_minutes,
            "model_version": latest.model_version,
            "top_features": [{"name": f.name, "value": f.value, "contribution": f.contribution}
                             for f in latest.top_features],
            "history": [{"ts": t, "probability": p, "alert": a} for t, p, a in past],
        })

    @app.get("/v1/model", response_model=ModelInfo, summary="The model being served",
             responses=_errors(e503="no model loaded"))
    async def model() -> Response:
        m = service.model
        if m is None:
            raise HTTPException(503, "no model loaded")
        return _json({"version": m.version, "feature_set_hash": m.feature_set_hash, "threshold": m.threshold,
                      "horizon_minutes": m.horizon_minutes, "feature_names": m.feature_names,
                      "metrics": m.metrics})

    @app.post("/v1/score", response_model=ScoreResponse, dependencies=[Depends(require_token)],
              summary="Score feature rows or a window of raw telemetry",
              responses=_errors(e400="neither or both of rows and telemetry, missing feature columns, "
                                "an invalid record or an 'at' out of range",
                                e401="missing or wrong bearer token", e403="the service has no API token",
                                e413="request body over the limit, refused before it is read",
                                e503="no model loaded"))
    def score(req: ScoreRequest) -> Response:
        if (req.rows is None) == (req.telemetry is None):
            raise HTTPException(400, "give exactly one of 'rows' or 'telemetry'")
        if req.at is not None and not 0 <= req.at <= MAX_EPOCH_MS:  # the records' own range
            raise HTTPException(400, f"'at' must be epoch ms from 0 to {MAX_EPOCH_MS}")
        try:
            if req.rows is not None:
                if not req.rows:
                    raise HTTPException(400, "'rows' is empty")
                scores = service.score_rows(pd.DataFrame(req.rows))
            else:
                scores = service.score_telemetry(_records(req.telemetry or {}), req.at)
        except NotReady as exc:
            raise HTTPException(503, str(exc)) from None
        except KeyError as exc:
            raise HTTPException(400, f"missing feature columns: {exc.args[0]}") from None
        except (ValueError, TypeError) as exc:
            raise HTTPException(400, str(exc)) from None
        m = service.model
        return _json({"model_version": m.version if m else "", "threshold": m.threshold if m else 0.0,
                      "scores": [{**_summary(s), "top_features": [
                          {"name": f.name, "value": f.value, "contribution": f.contribution}
                          for f in s.top_features]} for s in scores]})

    return app


def _records(telemetry: dict[str, list[dict[str, Any]]]) -> list[Any]:
    out: list[Any] = []
    for kind, rows in telemetry.items():
        if kind not in _KINDS:
            raise HTTPException(400, f"unknown telemetry kind {kind!r}; use one of {sorted(_KINDS)}")
        if rows:
            try:
                out.extend(decode(_KINDS[kind], msgspec.json.encode(rows)))
            except RecordError as exc:
                raise HTTPException(400, f"{kind}: {exc.reason}") from None
    return out
