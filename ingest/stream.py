"""Typed reading and writing over any :class:`foreshock.ingest.bus.Bus`.

:func:`publish` groups records by topic and node into one message each (a scrape of eight
GPUs is one Kafka record). :class:`RecordStream` decodes what a consumer polls and sends what
does not decode to ``telemetry.deadletter`` with the original bytes, the topic, partition and
offset and the reason, so a bad record neither kills the consumer nor silently disappears. That
covers every message a foreign producer can write: a tombstone (no value) and a value too large
to carry whole in its dead letter (which then holds its head, its size and its hash) included.
The risk service and the mitigation service consume through it, so neither needs a case of its own.

:meth:`RecordStream.poll_batches` hands out a poll a log at a time, the records as numpy columns
(:mod:`foreshock.ingest.columns`), for a consumer that computes on many records at once.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from foreshock.ingest.bus import Bus, Consumer, Message
from foreshock.ingest.columns import ColumnDecoder, record_columns
from foreshock.ingest.contract import RECORD_TYPES, DeadLetter, RecordError, Topic, decode, encode, topic_of

__all__ = ["publish", "Decoded", "Batch", "RecordStream", "now_ms"]


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


@dataclass(frozen=True, slots=True)
class Batch:
    """One poll's messages of one log (topic, partition), in log order, their records as columns.

    Message ``i`` holds the next ``counts[i]`` rows of ``columns``: none when it went to the
    dead-letter topic (its offset is still read).
    """

    topic: str
    partition: int
    messages: list[Message]
    offsets: np.ndarray
    counts: np.ndarray
    columns: dict[str, np.ndarray]

    def without(self, refused: Iterable[int]) -> Batch:
        """The batch with no rows for the messages at the indices ``refused``."""
        drop = np.zeros(len(self.messages), dtype=bool)
        drop[list(refused)] = True
        keep = ~np.repeat(drop, self.counts)
        return Batch(self.topic, self.partition, self.messages, self.offsets, np.where(drop, 0, self.counts),
                     {k: v[keep] for k, v in self.columns.items()})


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
        self._decoders: dict[str, ColumnDecoder] = {}

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

    def poll_batches(self, fields: Mapping[str, Sequence[str]], timeout_s: float = 1.0,
                     max_records: int = 10_000) -> list[Batch]:
        """Like :meth:`poll`, a log at a time: the records' ``node``, ``ts`` and ``fields[topic]``
        as columns (topics whose records name a node: the telemetry topics). The same messages go
        to the dead-letter topic, with the same reasons."""
        logs: dict[tuple[str, int], list[Message]] = {}
        for m in self.consumer.poll(timeout_s, max_records):
            logs.setdefault((m.topic, m.partition), []).append(m)
        return [self._batch(topic, partition, messages, fields.get(topic, ()))
                for (topic, partition), messages in logs.items()]

    def _batch(self, topic: str, partition: int, messages: list[Message], fields: Sequence[str]) -> Batch:
        known = topic in RECORD_TYPES
        if known and topic not in self._decoders:
            self._decoders[topic] = ColumnDecoder(topic)
        counts = np.zeros(len(messages), dtype=np.int64)
        records: list[Any] = []
        refused: dict[int, str] = {}
        for i, m in enumerate(messages):
            try:
                got = self._decoders[topic].decode(m.value) if known else decode(topic, m.value)
            except RecordError as exc:
                refused[i] = exc.reason
                continue
            counts[i] = len(got)
            records.extend(got)
        names = list(dict.fromkeys(["node", "ts", *fields]))
        batch = Batch(topic, partition, messages, np.array([m.offset for m in messages]), counts,
                      record_columns(topic, records, names) if known else {})
        keys = np.empty(len(messages), dtype=object)
        keys[:] = [m.key for m in messages]
        wrong = np.repeat(keys, counts) != batch.columns["node"] if counts.any() else np.zeros(0, bool)
        if wrong.any():  # a record's node must be its message's key (a message without a key: any)
            for i in np.unique(np.repeat(np.arange(len(messages)), counts)[wrong]).tolist():
                if messages[i].key is not None:
                    refused[i] = f"record node does not match message key {messages[i].key!r}"
        for i in sorted(refused):
            self.dead_letter(messages[i], refused[i])
        if refused:
            batch = batch.without(refused)
        self.records += int(batch.counts.sum())
        return batch

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
