"""The mitigator's read-only HTTP endpoint: ``/metrics``, ``/status``, ``/healthz``, ``/readyz``.

``/status`` is the operator's view of every block (:meth:`MitigationService.status`): the breaker,
the nodes per state, the actions in flight, the last rejections, what the cold start rebuilt, and
the audit log's newest rows (``recent_actions``, newest last). Every answer allows any origin
(``Access-Control-Allow-Origin: *``): it is read-only, and the risk service's status page reads
``/status`` from the operator's browser.
``/readyz`` answers 503 with the reason while the service is paused (its audit log cannot be
written). Nothing here changes state: the breaker is reset, and nodes pinned, through requests on
``mitigation.events`` (``foreshock mitigate --reset-breaker``, ``--pin``), which are audited.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from foreshock.mitigator.service import MitigationService

__all__ = ["StatusServer", "RECENT_ACTIONS"]

RECENT_ACTIONS = 20
"""Audit rows ``/status`` shows under ``recent_actions``."""


class StatusServer(ThreadingHTTPServer):
    """Serve ``service``'s status on ``host:port`` (port 0: any free one) from a daemon thread."""

    daemon_threads = True

    def __init__(self, service: MitigationService, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.service = service
        self._thread = threading.Thread(target=self.serve_forever, name="mitigator-status", daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: StatusServer

    def log_message(self, *args) -> None:  # the service logs what matters; no line per scrape
        pass

    def do_GET(self) -> None:
        service = self.server.service
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            return self._send(200, service.render_metrics(), CONTENT_TYPE_LATEST)
        if path == "/status":
            recent = service.executor.audit.events(last=RECENT_ACTIONS)
            return self._json(200, {**service.status(), "recent_actions": msgspec.to_builtins(recent)})
        if path == "/healthz":
            return self._json(200, {"status": "ok"})
        if path == "/readyz":
            if service.ready:
                return self._json(200, {"status": "ready"})
            return self._json(503, {"status": "paused", "reason": service.paused})
        self._json(404, {"detail": f"no such endpoint: {path}"})

    def _json(self, code: int, body: dict) -> None:
        self._send(code, json.dumps(body).encode(), "application/json")

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(data)
