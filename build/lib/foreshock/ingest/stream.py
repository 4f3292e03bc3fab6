"""Typed reading and writing over any :class:`foreshock.ingest.bus.Bus`.

:func:`publish` groups records by topic and node into one message each (a scrape of eight
GPUs is one Kafka record). :class:`RecordStream` decodes what a consumer polls and sends what
does not decode to ``telemetry.deadletter`` with the original bytes, the topic, partition and
offset and the reason, so a bad record neither kills the consumer nor silently disappears. That
covers every message a foreign producer can write: a tombstone (no value) and a value too large
to carry whole in its dead letter (which then holds its head, its size and its hash) included.
The risk service and the mitigation service consume through it, so neither needs a case of its own.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from foreshock.ingest.bus import Bus, Consumer, Message
from foreshock.ingest.contract import DeadLetter, RecordError, Topic, decode, encode, topic_of

__all__ = ["publish", "Decoded", "RecordStream", "now_ms"]


def now_ms() -> int:
    """Wall-clock UTC in epoch milliseconds (the contract's time unit)."""
    return time.time_ns() // 1_000_000


def publish(bus: Bus, records: Iterable[Any]) -> int:
    """Send records, one message per (topic, node) holding all of that node's records; returns messages."""
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in records:
        groups[(topic_of(r), r.node)].append(r)
    for (topic, node), batch in groups.items():
        bus.send(topic, node, encode(batch))
    return len(groups)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A consumed message and its records (empty when it went to the dead-letter topic)."""

    message: Message
    records: list[Any]


class RecordStream:
    """Decode what a consumer polls; dead-letter what does not decode; commit after handling.

    Usage: ``for d in stream.poll(): handle(d.records)`` then ``stream.commit(polled)`` once
    the effect of the handled records is durable. Dead letters are flushed before the commit,
    so a crash between the two replays the bad message rather than losing it.
    """

    def __init__(self, bus: Bus, consumer: Consumer, clock: Callable[[], int] = now_ms):
        self.bus = bus
        self.consumer = consumer
        self.clock = clock
        self.dead_letters = 0
        self.records = 0

    def poll(self, timeout_s: float = 1.0, max_records: int = 10_000) -> list[Decoded]:
        out = []
        for m in self.consumer.poll(timeout_s, max_records):
            try:
                records = decode(m.topic, m.value)
            except RecordError as exc:
                self.dead_letter(m, exc.reason)
                records = []
            else:
                if m.key is not None and any(r.node != m.key for r in records if hasattr(r, "node")):
                    self.dead_letter(m, f"record node does not match message key {m.key!r}")
                    records = []
            self.records += len(records)
            out.append(Decoded(m, records))
        return out

    def dead_letter(self, m: Message, reason: str) -> None:
        """Send the (size-bounded, :meth:`DeadLetter.of`) letter of ``m``, keyed like ``m``."""
        letter = DeadLetter.of(ts=self.clock(), topic=m.topic, partition=m.partition, offset=m.offset,
                               key=m.key, reason=reason, value=m.value)
        self.bus.send(Topic.DEADLETTER, letter.key or "", encode(letter))
        self.dead_letters += 1

    def commit(self, decoded: Sequence[Decoded]) -> None:
        """Make dead letters durable, then commit the offsets of ``decoded``."""
        if self.dead_letters:
            self.bus.flush()
        self.consumer.commit(d.message for d in decoded)

    def close(self) -> None:
        self.consumer.close()
