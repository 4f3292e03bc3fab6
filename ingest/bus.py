"""The bus: one interface, two implementations (in-memory and Apache Kafka).

Semantics are Kafka's in both: topics split into partitions, the record key (the node id)
picks the partition so one node's records stay ordered and one consumer owns its state,
consumers join a group and own a share of the partitions, and offsets are committed by the
application *after* a record's effect is durable (at-least-once). The in-memory bus exists so
the embedded demo and unit tests run without a broker; integration tests run the same code
against a real broker.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from foreshock.ingest.contract import partition_of

__all__ = ["Message", "Consumer", "Bus", "InMemoryBus", "partition_for", "AssignListener"]

AssignListener = Callable[[set[tuple[str, int]]], None]
"""Called with a member's whole new assignment after every rebalance, inside ``poll`` and before
it returns any record, so a stateful consumer can restore state and ``seek`` (Kafka's
``on_partitions_assigned``). Optional ``on_assign=`` argument of ``Bus.consumer``."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as consumed: where it sits in the log and its raw bytes (None: a tombstone,
    which any Kafka producer may write; :func:`foreshock.ingest.contract.decode` refuses it).

    ``timestamp``: the log's time of the message (epoch ms; Kafka's CreateTime or LogAppendTime),
    None where the bus keeps none. It is part of the log, so every read of the message sees it.
    """

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes | None
    timestamp: int | None = None


class Consumer(Protocol):
    """A member of a consumer group."""

    def poll(self, timeout_s: float = 1.0, max_records: int = 10_000) -> list[Message]:
        """Messages from the partitions this member owns, in log order per partition."""
        ...

    def commit(self, messages: Iterable[Message]) -> None:
        """Mark these messages handled: the group resumes after the highest offset per partition."""
        ...

    def assignment(self) -> set[tuple[str, int]]:
        """The (topic, partition) pairs this member owns right now."""
        ...

    def close(self) -> None:
        """Leave the group; its partitions move to the other members."""
        ...


class Bus(Protocol):
    """Producer side plus a factory for consumers."""

    def send(self, topic: str, key: str, value: bytes) -> None:
        """Queue one message (batched and compressed where the implementation can)."""
        ...

    def flush(self) -> None:
        """Block until every queued message is durable on the bus."""
        ...

    def consumer(self, group: str, topics: Sequence[str]) -> Consumer:
        """Join ``group`` on ``topics``; a new group starts from the earliest offset."""
        ...

    def close(self) -> None: ...


def commit_positions(messages: Iterable[Message]) -> dict[tuple[str, int], int]:
    """Next offset to read per partition after handling ``messages`` (Kafka's commit convention)."""
    positions: dict[tuple[str, int], int] = {}
    for m in messages:
        tp = (m.topic, m.partition)
        if m.offset + 1 > positions.get(tp, -1):
            positions[tp] = m.offset + 1
    return positions


def partition_for(key: str, partitions: int) -> int:
    """Key -> partition of the in-memory bus: the contract's partitioner (murmur2, as Kafka's Java
    client), so a node shares a partition, and peer group, with the same nodes as on a broker."""
    return partition_of(key, partitions)


class InMemoryBus:
    """A thread-safe, in-process bus with Kafka's partition and consumer-group semantics.

    Partitions are assigned round-robin to the members of a group and reassigned whenever a
    member joins or leaves; a member resumes from the group's committed offsets, so records
    handled but not committed by a member that left are delivered again (at-least-once).
    """

    def __init__(self, partitions: int = 8):
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self._logs: dict[tuple[str, int], list[tuple[str | None, bytes]]] = defaultdict(list)
        self._committed: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
        self._members: dict[str, list[_InMemoryConsumer]] = defaultdict(list)
        self._lock = threading.Condition()

    # producer side -------------------------------------------------------------------------
    def send(self, topic: str, key: str, value: bytes) -> None:
        with self._lock:
            self._logs[(topic, partition_for(key, self.partitions))].append((key, value))
            self._lock.notify_all()

    def flush(self) -> None:
        """Nothing to do: a sent message is already in the log."""

    def close(self) -> None:
        """Nothing to release."""

    # consumer side -------------------------------------------------------------------------
    def consumer(self, group: str, topics: Sequence[str], on_assign: AssignListener | None = None
                 ) -> _InMemoryConsumer:
        member = _InMemoryConsumer(self, group, tuple(topics), on_assign)
        with self._lock:
            self._members[group].append(member)
            self._rebalance(group)
        return member

    def messages(self, topic: str) -> list[Message]:
        """Every message of a topic, partition by partition (for tests and the demo's report)."""
        with self._lock:
            return [
                Message(topic, p, off, key, value)
                for p in range(self.partitions)
                for off, (key, value) in enumerate(self._logs.get((topic, p), ()))
            ]

    def _rebalance(self, group: str) -> None:
        members = self._members[group]
        for m in members:
            m._owned = {}
            m._assignment_changed = True
        if not members:
            return
        topics = sorted({t for m in members for t in m.topics})
        slots = [(t, p) for t in topics for p in range(self.partitions)]
        for i, tp in enumerate(slots):
            owners = [m for m in members if tp[0] in m.topics]
            if owners:
                owner = owners[i % len(owners)]
                owner._owned[tp] = self._committed[group].get(tp, 0)

    def _leave(self, member: _InMemoryConsumer) -> None:
        with self._lock:
            members = self._members[member.group]
            if member in members:
                members.remove(member)
                self._rebalance(member.group)


class _InMemoryConsumer:
    def __init__(self, bus: InMemoryBus, group: str, topics: tuple[str, ...],
                 on_assign: AssignListener | None = None):
        self._bus = bus
        self.group = group
        self.topics = topics
        self._on_assign = on_assign
        self._assignment_changed = False
        self._owned: dict[tuple[str, int], int] = {}  # partition -> next position to read

    def poll(self, timeout_s: float = 1.0, max_records: int = 10_000) -> list[Message]:
        if self._on_assign is not None:
            with self._bus._lock:
                changed, self._assignment_changed = self._assignment_changed, False
                owned = set(self._owned)
            if changed:
                self._on_assign(owned)
        with self._bus._lock:
            if self._on_assign is not None and self._assignment_changed:
                return []  # rebalanced meanwhile: the next poll tells the listener first
            out = self._take(max_records)
            if not out and timeout_s > 0:
                self._bus._lock.wait(timeout_s)
                if self._on_assign is None or not self._assignment_changed:
                    out = self._take(max_records)
            return out

    def _take(self, max_records: int) -> list[Message]:
        out: list[Message] = []
        for tp, pos in sorted(self._owned.items()):
            log = self._bus._logs.get(tp, ())
            end = min(len(log), pos + max_records - len(out))
            out.extend(Message(tp[0], tp[1], off, *log[off]) for off in range(pos, end))
            self._owned[tp] = end
            if len(out) >= max_records:
                break
        return out

    def commit(self, messages: Iterable[Message]) -> None:
        with self._bus._lock:
            self._bus._committed[self.group].update(commit_positions(messages))

    def assignment(self) -> set[tuple[str, int]]:
        with self._bus._lock:
            return set(self._owned)

    def seek(self, positions: dict[tuple[str, int], int]) -> None:
        """Move owned partitions to explicit offsets (see ``KafkaConsumerMember.seek``)."""
        with self._bus._lock:
            for tp, pos in positions.items():
                if tp in self._owned:
                    self._owned[tp] = pos

    def lag(self) -> dict[tuple[str, int], int | None]:
        """Records not yet polled, per owned partition."""
        with self._bus._lock:
            return {tp: len(self._bus._logs.get(tp, ())) - pos for tp, pos in self._owned.items()}

    def close(self) -> None:
        self._bus._leave(self)
