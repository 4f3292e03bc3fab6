"""The durable audit log: every action's every status, in SQLite, and on ``mitigation.events``.

SQLite is the durable record (one row per status change, committed before the call returns) and
the source of truth for idempotency: an action id that already *succeeded* is never executed again,
even after a restart, and for the cold start (:mod:`foreshock.mitigator.coldstart`). The bus copy lets
dashboards and other services follow along; it is sent, not waited for (the producer delivers it
within its linger, and at close), so a broker outage never holds an action. ``started`` is kept
in SQLite only: on the bus, a job-bound command's ``started`` record is the command itself (see
:class:`foreshock.mitigator.channels.TopicChannel`), so it is not published twice.

A log that cannot be opened or written raises :class:`AuditUnavailable` with one clear line: the
mitigator then stops acting rather than act without a record (see :class:`foreshock.mitigator.service`).
An attempt that failed and will be retried says so in its reason (:data:`RETRYING`), so an action's
last row tells whether it ended.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from foreshock.ingest.bus import Bus
from foreshock.ingest.contract import MitigationEvent
from foreshock.ingest.stream import now_ms, publish

__all__ = ["AuditLog", "AuditUnavailable", "RETRYING", "OPEN_STATUSES", "is_open"]

RETRYING = "; will retry"
"""Ends the reason of a failed attempt that is not the last: the action is still open."""
OPEN_STATUSES = frozenset({"planned", "started", "partial", "abandoned"})
"""Last rows of an action that has not ended. ``abandoned`` is one: a cold start writes it and then
resumes the action, so a crash right after it must leave the action open for the next start."""


def is_open(last: MitigationEvent) -> bool:
    """Whether an action whose newest row is ``last`` has not ended (a crash cut it off, or it retries)."""
    return last.status in OPEN_STATUSES or (last.status == "failed" and RETRYING in last.reason)


class AuditUnavailable(RuntimeError):
    """The audit log cannot be opened or written (full disk, file size limit, read-only, missing)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mitigation_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts INTEGER NOT NULL, node TEXT NOT NULL, action_id TEXT NOT NULL, action TEXT NOT NULL,
    status TEXT NOT NULL, job TEXT, reason TEXT NOT NULL, dry_run INTEGER NOT NULL, attempt INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS mitigation_events_action ON mitigation_events(action_id, status);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL);
"""
_PROBE = "INSERT OR REPLACE INTO probe (id, ts) VALUES (1, ?)"


class AuditLog:
    """Append-only audit trail. ``path=":memory:"`` for tests; a file path in production."""

    def __init__(
        self, path: str | Path = ":memory:", bus: Bus | None = None, clock: Callable[[], int] = now_ms
    ):
        self.path = str(path)
        self._db = self._connect()
        self._lock = threading.Lock()
        self.bus = bus
        self.clock = clock
        self.write_failures = 0  # writes that raised AuditUnavailable, for the metrics

    def record(self, event: MitigationEvent) -> None:
        """Make ``event`` durable (SQLite commit), then publish it unless it is a ``started`` record."""
        with self._lock, self._writing():
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
            publish(self.bus, [event])  # no flush: a broker outage must not hold the mitigator

    def probe(self) -> None:
        """Commit a write (raises :class:`AuditUnavailable`): can the log take the next record?

        A write that fails is tried once more on a fresh connection: SQLite keeps a file it opened
        on read-only storage read-only on that connection, after the storage is writable again."""
        with self._lock:
            try:
                self._db.execute(_PROBE, (self.clock(),))
                return
            except sqlite3.Error:
                if self.path != ":memory:":
                    self._reopen()
            with self._writing():
                self._db.execute(_PROBE, (self.clock(),))

    def _reopen(self) -> None:
        self._db.close()  # first: a process's connections to one file share its WAL index mapping
        try:
            self._db = self._connect()
        except AuditUnavailable:
            with suppress(sqlite3.Error):  # reads go on where the file can still be read
                self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False,
                                           isolation_level=None)
            raise

    def _connect(self) -> sqlite3.Connection:
        """A connection to the log with its schema in place (raises :class:`AuditUnavailable`)."""
        db = None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            raise AuditUnavailable(f"cannot open the audit log {self.path}: {exc}") from None
        return db

    @contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            self.write_failures += 1
            raise AuditUnavailable(f"cannot write the audit log {self.path}: {exc}") from None

    def succeeded(self, action_id: str) -> bool:
        """Whether this action id already completed (the idempotency check; dry runs complete nothing)."""
        return self.has(action_id, "succeeded", dry_run=False)

    def has(self, action_id: str, status: str, dry_run: bool | None = None) -> bool:
        """Whether the log holds a row of ``action_id`` with ``status`` (optionally: of this dry-run flag)."""
        sql = "SELECT 1 FROM mitigation_events WHERE action_id=? AND status=?"
        args: tuple = (action_id, status)
        if dry_run is not None:
            sql, args = sql + " AND dry_run=?", (*args, int(dry_run))
        with self._lock:
            return self._db.execute(sql + " LIMIT 1", args).fetchone() is not None

    def events(self, action_id: str | None = None, last: int | None = None) -> list[MitigationEvent]:
        """The trail, oldest first (optionally for one action id, or only its ``last`` rows)."""
        sql = (
            "SELECT ts, node, action_id, action, status, job, reason, dry_run, attempt FROM mitigation_events"
        )
        args: tuple = ()
        if action_id is not None:
            sql, args = sql + " WHERE action_id=?", (action_id,)
        with self._lock:
            if last is None:
                rows = self._db.execute(sql + " ORDER BY seq", args).fetchall()
            else:
                rows = self._db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, last)).fetchall()[::-1]
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
