"""The durable audit log: every action's every status, in SQLite, and on ``mitigation.events``.

SQLite is the durable record (one row per status change, committed before the call returns) and
the source of truth for idempotency: an action id that already *succeeded* is never executed again,
even after a restart. The bus copy lets dashboards and other services follow along. ``started`` is
kept in SQLite only: on the bus, a job-bound command's ``started`` record is the command itself
(see :class:`mitigator.channels.TopicChannel`), so it is not published twice.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from ingest.bus import Bus
from ingest.contract import MitigationEvent
from ingest.stream import now_ms, publish

__all__ = ["AuditLog"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mitigation_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts INTEGER NOT NULL, node TEXT NOT NULL, action_id TEXT NOT NULL, action TEXT NOT NULL,
    status TEXT NOT NULL, job TEXT, reason TEXT NOT NULL, dry_run INTEGER NOT NULL, attempt INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS mitigation_events_action ON mitigation_events(action_id, status);
"""


class AuditLog:
    """Append-only audit trail. ``path=":memory:"`` for tests; a file path in production."""

    def __init__(
        self, path: str | Path = ":memory:", bus: Bus | None = None, clock: Callable[[], int] = now_ms
    ):
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        if str(path) != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self.bus = bus
        self.clock = clock

    def record(self, event: MitigationEvent) -> None:
        """Make ``event`` durable (SQLite commit), then publish it unless it is a ``started`` record."""
        with self._lock:
            self._db.execute(
                "INSERT INTO mitigation_events"
                " (ts, node, action_id, action, status, job, reason, dry_run, attempt)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    event.ts,
                    event.node,
                    event.action_id,
                    event.action,
                    event.status,
                    event.job,
                    event.reason,
                    int(event.dry_run),
                    event.attempt,
                ),
            )
        if self.bus is not None and event.status != "started":
            publish(self.bus, [event])
            self.bus.flush()

    def succeeded(self, action_id: str) -> bool:
        """Whether this action id already completed (the idempotency check)."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM mitigation_events WHERE action_id=? AND status='succeeded'"
                " AND dry_run=0 LIMIT 1",
                (action_id,),
            ).fetchone()
        return row is not None

    def events(self, action_id: str | None = None) -> list[MitigationEvent]:
        """The trail, oldest first (optionally for one action id)."""
        sql = (
            "SELECT ts, node, action_id, action, status, job, reason, dry_run, attempt FROM mitigation_events"
        )
        args: tuple = ()
        if action_id is not None:
            sql, args = sql + " WHERE action_id=?", (action_id,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq", args).fetchall()
        return [
            MitigationEvent(
                ts=r[0],
                node=r[1],
                action_id=r[2],
                action=r[3],
                status=r[4],
                job=r[5],
                reason=r[6],
                dry_run=bool(r[7]),
                attempt=r[8],
            )
            for r in rows
        ]

    def close(self) -> None:
        self._db.close()
