"""The risk HTTP API in a process of its own, fed by the scoring loop's process.

Why a second process: the API's reads (the board, readiness) are cheap, but in the scoring
process every request's Python work (the ASGI server, routing, encoding) competes with the loop
for one interpreter lock: under load the loop fell behind, and every answer, ``/healthz``
included, waited for the lock. Here the API answers from a mirror of the board in its own
interpreter, and the loop pays only for sending what changed.

    scoring process                          API process (``spawn``)
    RiskBoard ── changes ─► Feed thread ══ feed pipe ══► reader thread ─► mirror RiskBoard
    readiness, failure, model ── every 0.25 s ═══════►       (status)    ─► GET /v1/..., /healthz, /readyz
    Bridge thread ◄══════ calls pipe ═════════ /metrics (the loop's own), POST /v1/score (forwarded)

The API process exits when the scoring process goes (its feed pipe closes); the scoring process
stops when the API process dies (``foreshock serve`` watches it), so a supervisor restarts both.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import pandas as pd

from foreshock.ingest.contract import RiskScore
from foreshock.predictor.metrics import BoardMetrics
from foreshock.predictor.scoring import RiskBoard
from foreshock.predictor.service import NotReady

__all__ = ["ServedModel", "Mirror", "Feed", "Bridge", "ApiProcess", "FORWARDED"]

log = logging.getLogger(__name__)

FORWARDED = frozenset({"metrics_text", "score_rows", "score_telemetry"})
"""The service's methods the API process may call in the scoring process (:class:`Bridge`)."""

STATUS_EVERY_S = 0.25
"""How often the scoring process tells the API process its readiness (and whether its loop failed)."""

_SCORES = msgspec.msgpack.Encoder()
_DECODE_SCORES = msgspec.msgpack.Decoder(list[RiskScore])


@dataclass(frozen=True)
class ServedModel:
    """What the API says of the model being served (the scoring process keeps the model itself)."""

    version: str
    feature_set_hash: str
    threshold: float
    horizon_minutes: int
    feature_names: list[str]
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: Any) -> ServedModel:
        return cls(model.version, model.feature_set_hash, model.threshold, model.horizon_minutes,
                   list(model.feature_names), dict(model.metrics or {}))


class Feed:
    """Scoring process: sends the board's changes and the service's status to the API process.

    The loop only puts a change on a queue (the board calls :meth:`changed` under its lock); this
    thread encodes and sends, so a slow reader never holds up scoring. A reader that stops (an API
    process hung, not dead) does not make the queue grow without bound: past ``max_backlog``
    changes the feed stops queueing and, once the reader takes again, sends the whole board.
    """

    def __init__(self, conn: Connection, service: Any, every_s: float = STATUS_EVERY_S,
                 max_backlog: int = 1_000):
        self.conn = conn
        self.service = service
        self.every_s = every_s
        self.max_backlog = max_backlog
        self._resync = False
        self._changes: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._model_version: str | None = None
        self._thread = threading.Thread(target=self._run, name="api-feed", daemon=True)

    def start(self) -> Feed:
        self.service.board.subscribe(self.changed)
        self._resync = True  # the board as it stands first
        self._thread.start()
        return self

    def changed(self, kind: str, payload: Any) -> None:
        if self._resync:  # the whole board goes next: it holds this change
            return
        if self._changes.qsize() >= self.max_backlog:
            self._resync = True
            return
        self._changes.put((kind, payload))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._send_changes()
                self._send_status()
        except (BrokenPipeError, EOFError, OSError):
            log.warning("the API process closed its feed")

    def _send_changes(self) -> None:
        if self._resync:
            self._send_board()
        try:
            kind, payload = self._changes.get(timeout=self.every_s)
        except queue.Empty:
            return
        while True:
            if kind == "record":  # one msgspec call; pickling would reduce each struct in Python
                self.conn.send_bytes(b"R" + _SCORES.encode(payload))
            else:
                self.conn.send((kind, payload))
            try:
                kind, payload = self._changes.get_nowait()
            except queue.Empty:
                return

    def _send_board(self) -> None:
        """The whole board, replacing the mirror's: what was queued before is in it. Changes made
        while it is read are queued again and replayed after it (replaying them is harmless)."""
        self._resync = False
        while True:
            try:
                self._changes.get_nowait()
            except queue.Empty:
                break
        board = self.service.board
        self.conn.send(("replace", board.export(s.node for s in board.latest())))

    def _send_status(self) -> None:
        model = self.service.model
        if model is not None and model.version != self._model_version:
            self.conn.send(("model", ServedModel.of(model)))
            self._model_version = model.version
        self.conn.send(("status", self.service.readiness(), self.service.failure()))


class Bridge:
    """Scoring process: answers the API process's forwarded calls (``/metrics``, ``POST /v1/score``)."""

    def __init__(self, conn: Connection, service: Any):
        self.conn = conn
        self.service = service
        self._thread = threading.Thread(target=self._run, name="api-bridge", daemon=True)

    def start(self) -> Bridge:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                name, args = self.conn.recv()
            except (EOFError, OSError):
                return
            try:
                if name not in FORWARDED:
                    raise ValueError(f"{name!r} is not a call the API process may forward")
                answer: tuple[str, Any] = ("ok", getattr(self.service, name)(*args))
            except Exception as exc:  # sent back and raised there, as if the call had run there
                answer = ("raise", exc)
            try:
                self.conn.send(answer)
            except (BrokenPipeError, OSError):
                return


class Mirror:
    """API process: what :func:`foreshock.predictor.api.create_app` reads, kept by the feed.

    Reads (the board, readiness, the model, the per-node series) are answered here; the loop's own
    metrics and scoring calls are forwarded to the scoring process, one at a time.
    """

    def __init__(self, feed: Connection, calls: Connection, history: int):
        self.board = RiskBoard(history)
        self.model: ServedModel | None = None
        self.board_metrics = BoardMetrics(self.board, lambda: self.model)
        self._ready: tuple[bool, str] = (False, "waiting for the scoring process")
        self._failure: str | None = None
        self._feed = feed
        self._calls = calls
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def follow(self, on_close: Callable[[], None]) -> None:
        """Read the feed on a thread until it closes, then call ``on_close`` (the server's exit)."""

        def run() -> None:
            try:
                while True:
                    self.apply(self._feed.recv_bytes())
            except (EOFError, OSError):
                self._failure = self._failure or "the scoring process is gone"
            finally:
                self.closed.set()
                on_close()

        threading.Thread(target=run, name="api-mirror", daemon=True).start()

    def apply(self, message: bytes) -> None:
        if message[:1] == b"R":
            self.board.record(_DECODE_SCORES.decode(message[1:]))
            return
        kind, *rest = pickle.loads(message)  # noqa: S301 - from our own scoring process, over a pipe
        if kind == "status":
            self._ready, self._failure = rest
        elif kind == "model":
            self.model = rest[0]
        else:
            self.board.apply(kind, rest[0])

    def readiness(self) -> tuple[bool, str]:
        if self.closed.is_set():
            return False, "the scoring process is gone"
        return self._ready

    def failure(self) -> str | None:
        return self._failure

    def metrics_text(self) -> bytes:
        """The scoring process's metrics, then the per-node series rendered here from the mirror."""
        return self._call("metrics_text", False) + self.board_metrics.render()

    def score_rows(self, frame: pd.DataFrame) -> list[RiskScore]:
        return self._call("score_rows", frame)

    def score_telemetry(self, records: Sequence[Any], at: int | None = None) -> list[RiskScore]:
        return self._call("score_telemetry", list(records), at)

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            try:
                self._calls.send((name, args))
                status, value = self._calls.recv()
            except (EOFError, OSError) as exc:
                raise NotReady("the scoring process is gone") from exc
        if status == "raise":
            raise value
        return value


class ApiProcess:
    """Scoring process: starts the API process and feeds it (see the module docstring)."""

    def __init__(self, service: Any, **app_options: Any):
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs Kafka threads
        feed_out, feed_in = ctx.Pipe(duplex=False)
        self._calls, calls_there = ctx.Pipe()
        self.process = ctx.Process(target=_api_main, args=(feed_out, calls_there, app_options),
                                   name="foreshock-api", daemon=True)
        self._feed_in = feed_in
        self._ends_there = (feed_out, calls_there)
        self.feed = Feed(feed_in, service)
        self.bridge = Bridge(self._calls, service)

    def start(self) -> ApiProcess:
        self.process.start()
        for end in self._ends_there:  # the child holds them now: EOF reaches each side when the other goes
            end.close()
        self.feed.start()
        self.bridge.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.feed.stop()
        self._feed_in.close()  # the API process sees the feed close and exits
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        self._calls.close()


def _api_main(feed: Connection, calls: Connection, options: dict[str, Any]) -> None:
    """The API process: serve the app over a :class:`Mirror` until the feed closes or a signal comes."""
    import gc
    import signal
    import sys

    import uvicorn

    from foreshock.predictor.api import create_app

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the scoring process decides
    sys.setswitchinterval(0.0005)  # the event loop waits less for the lock while the feed decodes a batch
    logging.basicConfig(level=options.pop("log_level", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port, history = options.pop("host"), options.pop("port"), options.pop("history")
    mirror = Mirror(feed, calls, history)
    server = uvicorn.Server(uvicorn.Config(create_app(mirror, **options), host=host, port=port,
                                           log_level="warning", access_log=False))

    def close() -> None:
        server.should_exit = True

    mirror.follow(close)
    gc.freeze()
    server.run()
    if not server.started:
        sys.exit(3)  # could not bind: the scoring process sees the API process exit and stops
