"""Between a collector's poll loop and the bus: a bounded, ordered buffer and the thread that empties it.

Why it exists: a collector that publishes from its poll loop stops polling whenever the broker
does not answer (it used to wait in ``flush`` for the whole outage, and the samples it should have
taken meanwhile were never taken). Here the loop only calls :meth:`Outbox.put`, which never waits
for the bus; a sender thread delivers the oldest entries, in order, and an entry leaves the buffer
only once the bus has acknowledged it. A failed or timed-out delivery leaves it at the head, and
the sender tries again after a back-off (0.2 s doubling to 2 s), so the backlog goes out, oldest
first, as soon as the broker is back.

Bounds. Entries are held in memory up to ``memory_bytes``; past that, with a :class:`Spool`, on
disk up to the spool's size, and the spool feeds memory as it empties (the order is kept: while
the spool holds anything, new entries go behind it). When both are full the *oldest* entries are
dropped to make room: after a long outage the most recent telemetry is what the predictor needs
first. The chunk being delivered (at most a quarter of ``memory_bytes``, or one entry) is out of
the count while in flight, so a delivery that hangs until its timeout cannot make the newest
polls the ones dropped; memory can hold that much more than ``memory_bytes`` until the next put.
Drops are counted in records and entries (:attr:`Outbox.records_dropped`,
:attr:`Outbox.entries_dropped`), logged when they start and at most every 30 s while they go on,
and reported by :meth:`Outbox.close`.

Shutdown. :meth:`close` gives the sender ``timeout_s`` to deliver what is left and returns within
that bound whatever the broker does; what is still unsent then is put back in front of the spool
(sent first by the next start) or, without a spool, counted as unsent and lost.

Delivery is at-least-once: a batch the broker wrote but whose acknowledgement was lost is sent
again. That happens mostly as a broker comes back: a batch handed to the producer during the
outage reaches it just before the producer's delivery timeout fails the batch. So while the bus is
failing the sender hands over one entry at a time, and the backlog follows only once one is
acknowledged: a lost acknowledgement then repeats one poll, not the whole backlog. The
``deliver`` callable is injected (production: :meth:`foreshock.ingest.kafka_bus.KafkaBus.deliver`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from foreshock.ingest.spool import Entry, Message, Spool

__all__ = ["Deliver", "Outbox", "OutboxSummary"]

log = logging.getLogger(__name__)

Deliver = Callable[[Sequence[Message], float | None], tuple[int, BaseException | None]]
"""Send ``messages`` in order and wait for the bus, at most ``timeout_s`` when given; return how many
of them, from the first, are durable, and the error that stopped the rest (None when all are)."""

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
DROP_LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class OutboxSummary:
    """What an outbox did over its life, for the exit line."""

    records_in: int
    records_sent: int
    records_dropped: int
    entries_dropped: int
    records_unsent: int  # still held at close, without a spool to keep them: lost
    records_spooled: int  # still held at close, left in the spool for the next start
    flush_s: float

    def line(self) -> str:
        left = (f"{self.records_spooled} left in the spool for the next start" if self.records_spooled
                else f"{self.records_unsent} unsent at exit")
        return (f"{self.records_in} records collected, {self.records_sent} delivered, "
                f"{self.records_dropped} dropped by a full buffer ({self.entries_dropped} polls), {left}; "
                f"final flush took {self.flush_s:.1f} s")


class Outbox:
    """See the module docstring. ``put`` from one thread (the poll loop); the sender runs on its own."""

    def __init__(self, deliver: Deliver, *, memory_bytes: int, spool: Spool | None = None,
                 chunk_bytes: int = 1 << 20, clock: Callable[[], float] = time.monotonic):
        if memory_bytes <= 0:
            raise ValueError("the outbox needs a positive memory size")
        self._deliver = deliver
        self.memory_bytes = memory_bytes
        self.spool = spool
        self.chunk_bytes = min(chunk_bytes, max(1, memory_bytes // 4))
        self._clock = clock
        self._lock = threading.Condition()
        self._memory: deque[Entry] = deque()  # oldest first; in front of the spool's entries
        self._in_flight: list[Entry] = []  # taken from the head of memory by the sender
        self._memory_used = 0  # of the entries in memory, not those in flight
        self._closing = False
        self._deadline: float | None = None
        self._abandoned = False  # close() gave up on the in-flight delivery and took its entries back
        self._thread = threading.Thread(target=self._run, name="outbox-sender", daemon=True)
        self._failing_since: float | None = None
        self._last_drop_log: float | None = None
        self.records_in = self.records_sent = 0
        self.records_dropped = self.entries_dropped = 0

    # the poll loop's side --------------------------------------------------------------------
    def start(self) -> Outbox:
        self._thread.start()
        return self

    def put(self, messages: list[Message], records: int) -> None:
        """Queue one poll's messages; returns at once (drops the oldest entries if the buffer is full)."""
        if not messages:
            return
        entry = Entry(messages, records)
        with self._lock:
            self.records_in += records
            if self.spool is None or (not self.spool and self._memory_used + entry.size <= self.memory_bytes):
                self._put_in_memory(entry)
            else:
                self._put_in_spool(entry)
            self._lock.notify_all()

    def _put_in_memory(self, entry: Entry) -> None:
        while self._memory_used + entry.size > self.memory_bytes and self._memory:
            self._drop_oldest_in_memory()
        if entry.size > self.memory_bytes:
            self._drop(entry)  # larger than the whole buffer
            return
        self._memory.append(entry)
        self._memory_used += entry.size

    def _put_in_spool(self, entry: Entry) -> None:
        spool = self.spool
        assert spool is not None
        if entry.size > spool.max_bytes:
            self._drop(entry)
            return
        while not spool.room(entry):
            if self._memory:  # memory holds the oldest entries
                self._drop_oldest_in_memory()
                self._promote()
            elif spool:
                self._drop(spool.pop())
            else:
                break
        if spool.room(entry):
            spool.append(entry)
        else:
            self._drop(entry)

    def _drop_oldest_in_memory(self) -> None:
        entry = self._memory.popleft()
        self._memory_used -= entry.size
        self._drop(entry)

    def _drop(self, entry: Entry | None) -> None:
        if entry is None:
            return
        self.records_dropped += entry.records
        self.entries_dropped += 1
        now = self._clock()
        if self._last_drop_log is None or now - self._last_drop_log >= DROP_LOG_EVERY_S:
            self._last_drop_log = now
            where = f"{self.memory_bytes} B in memory" + (
                f" and {self.spool.max_bytes} B on disk at {self.spool.directory}" if self.spool else "")
            log.warning("outbox full (%s): dropping the oldest polls; %d records dropped so far",
                        where, self.records_dropped)

    def _promote(self) -> None:
        """Move the spool's oldest entries into memory while they fit (keeps the order: memory is older);
        into an empty memory always, so an entry larger than memory still goes out."""
        spool = self.spool
        while spool:
            head = spool.peek()
            if head is None or (self._memory_used and self._memory_used + head.size > self.memory_bytes):
                return
            spool.pop()
            self._memory.append(head)
            self._memory_used += head.size

    # the sender's side -----------------------------------------------------------------------
    def _take_chunk(self) -> list[Entry]:
        """The next entries to deliver: up to ``chunk_bytes``, or one entry while the bus is failing."""
        self._promote()
        chunk, size = [], 0
        limit = 0 if self._failing_since is not None else self.chunk_bytes
        while self._memory and (not chunk or size + self._memory[0].size <= limit):
            entry = self._memory.popleft()
            chunk.append(entry)
            size += entry.size
        self._memory_used -= size
        self._in_flight = chunk
        return chunk

    def _settle(self, chunk: list[Entry], delivered: int) -> None:
        """Drop the first ``delivered`` messages of ``chunk``; put the rest back in front of memory."""
        self._in_flight = []
        rest: list[Entry] = []
        for entry in chunk:
            if delivered >= len(entry.messages):
                delivered -= len(entry.messages)
                self.records_sent += entry.records
                continue
            if delivered:  # partly delivered: the messages that went out leave the entry
                entry.messages = entry.messages[delivered:]
                delivered = 0
            rest.append(entry)
            self._memory_used += entry.size
        self._memory.extendleft(reversed(rest))

    def _run(self) -> None:
        retry_s = RETRY_FIRST_S
        while True:
            with self._lock:
                while not self._closing and not self._memory and not self.spool:
                    self._lock.wait(1.0)
                if self._abandoned:
                    return
                chunk = self._take_chunk()
                if not chunk:
                    return  # closing, and nothing left
                timeout = None if self._deadline is None else max(0.0, self._deadline - self._clock())
            messages = [m for entry in chunk for m in entry.messages]
            try:
                delivered, error = self._deliver(messages, timeout)
            except Exception as exc:  # noqa: BLE001 - a bug in deliver must not end the sender silently
                delivered, error = 0, exc
            with self._lock:
                if self._abandoned:
                    return
                self._settle(chunk, delivered)
                if error is None:
                    if self._failing_since is not None:
                        backlog = len(self._memory) + (len(self.spool) if self.spool else 0)
                        log.warning("bus reachable again after %.1f s; sending the backlog (%d entries)",
                                    self._clock() - self._failing_since, backlog)
                        self._failing_since = None
                    retry_s = RETRY_FIRST_S
                    continue
                if self._failing_since is None:
                    self._failing_since = self._clock()
                    log.warning("bus not delivering (%s); buffering and retrying", error)
                if self._deadline is not None and self._clock() >= self._deadline:
                    return
                self._lock.wait(retry_s)  # close() wakes it: the final flush does not wait out a back-off
                retry_s = min(2 * retry_s, RETRY_MAX_S)

    # shutdown --------------------------------------------------------------------------------
    def close(self, timeout_s: float) -> OutboxSummary:
        """Deliver what is left for at most ``timeout_s``, then spool or count the rest; returns in time."""
        started = self._clock()
        with self._lock:
            self._closing = True
            self._deadline = started + timeout_s
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_s))
        with self._lock:
            self._abandoned = True
            left = self._in_flight + list(self._memory)
            self._in_flight, self._memory = [], deque()
            self._memory_used = 0
            unsent = sum(e.records for e in left)
            spooled = 0
            if self.spool is not None:
                self.spool.prepend(left)
                spooled, unsent = self.spool.records, 0
            return OutboxSummary(self.records_in, self.records_sent, self.records_dropped,
                                 self.entries_dropped, unsent, spooled, self._clock() - started)

    def pending_records(self) -> int:
        """Records held now (memory, in flight and spool)."""
        with self._lock:
            return (sum(e.records for e in self._memory) + sum(e.records for e in self._in_flight)
                    + (self.spool.records if self.spool else 0))
