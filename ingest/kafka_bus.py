"""The bus on Apache Kafka, through kafka-python.

Producer: batched (``linger_ms``), lz4-compressed, ``acks=all`` so ``flush`` means durable.
Keys go to partitions by murmur2, as the Java client's default partitioner does: the contract
asks every producer for that, so a node's records share one partition whoever wrote them.
A process that must not wait on the broker (a collector) takes :data:`BOUNDED_PRODUCER` and sends
with :meth:`KafkaBus.deliver`, which returns within a stated time whatever the broker does.
Consumer: a group member with auto-commit off; the application commits the offsets of what
it has handled, so a crash replays uncommitted records instead of losing them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from kafka.partitioner import DefaultPartitioner
from kafka.structs import OffsetAndMetadata, TopicPartition

from foreshock.ingest.bus import AssignListener, Message, commit_positions
from foreshock.ingest.contract import Topic

__all__ = ["BOUNDED_PRODUCER", "KafkaBus", "KafkaConsumerMember", "ensure_topics"]

log = logging.getLogger(__name__)

BOUNDED_PRODUCER = dict(
    max_block_ms=2_000,  # send() waits this long at most for metadata (kafka-python's default: 60 s)
    request_timeout_ms=4_000,
    delivery_timeout_ms=8_000,  # every record's future resolves within this (default: 120 s)
    reconnect_backoff_max_ms=1_000,  # back within a second of the broker (default: up to 30 s)
)
"""Producer settings for a process whose loop must not wait on the broker: during an outage a
send fails within ``delivery_timeout_ms`` instead of being retried for two minutes, and a broker
that is back is reconnected to within a second. Idempotence (kafka-python's default) stays on,
so the producer's own retries neither reorder nor duplicate."""


def ensure_topics(bootstrap: str, topics: Sequence[str] = Topic.ALL, partitions: int = 8) -> None:
    """Create the topics that do not exist yet (a no-op for those that do)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="foreshock-admin")
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics
                   if t not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


class KafkaBus:
    """Kafka-backed :class:`foreshock.ingest.bus.Bus`."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 20, batch_bytes: int = 1 << 20,
                 compression: str | None = "lz4", client_id: str = "foreshock",
                 producer_config: dict | None = None):
        self.bootstrap = bootstrap
        self._client_id = client_id
        self._producer: KafkaProducer | None = None
        self._producer_config = dict(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            linger_ms=linger_ms,
            batch_size=batch_bytes,
            compression_type=compression,
            max_request_size=8 << 20,
            partitioner=DefaultPartitioner(),  # murmur2, Java's: named, not left to a default
        )
        self._producer_config.update(producer_config or {})

    @property
    def producer(self) -> KafkaProducer:
        """Created on first send, so a consume-only process opens no producer connection."""
        if self._producer is None:
            self._producer = KafkaProducer(**self._producer_config)
        return self._producer

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.producer.send(topic, value=value, key=key.encode())

    def flush(self) -> None:
        if self._producer is not None:
            self._producer.flush()

    def deliver(self, messages: Sequence[tuple[str, str, bytes]], timeout_s: float | None = None
                ) -> tuple[int, BaseException | None]:
        """Send ``messages`` in order and wait for their acknowledgements; return how many, from the
        first, are durable, and the error that stopped the rest (None: all of them).

        ``timeout_s`` bounds the wait (None: until every future resolves, which the producer's
        ``delivery_timeout_ms`` bounds). Waiting on each future against one deadline, not on
        ``flush(timeout)``, keeps the bound: kafka-python applies a flush timeout to each batch in turn.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        futures, error = [], None
        try:
            for topic, key, value in messages:
                futures.append(self.producer.send(topic, value=value, key=key.encode()))
        except KafkaError as exc:  # no metadata within max_block_ms, no broker to bootstrap from
            error = exc
        delivered = 0
        for future in futures:
            try:
                future.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except KafkaError as exc:
                return delivered, exc
            delivered += 1
        return delivered, error

    def consumer(self, group: str, topics: Sequence[str], **config) -> KafkaConsumerMember:
        return KafkaConsumerMember(self.bootstrap, group, topics, client_id=self._client_id, **config)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush and close the producer, waiting at most ``timeout_s`` (None: until flushed)."""
        if self._producer is None:
            return
        producer, self._producer = self._producer, None
        if timeout_s is None:
            producer.flush()
            producer.close()
            return
        try:
            producer.close(timeout=timeout_s)
        except KafkaTimeoutError:
            # kafka-python's close() raises from its flush when records are still unacknowledged
            # and leaves its sender running; force it closed, as Java's close(timeout) does.
            log.warning("Kafka producer closed with records unacknowledged after %.1f s", timeout_s)
            sender = getattr(producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            producer._closed = True  # close() had unhooked it from atexit; a second close() is a no-op


class KafkaConsumerMember:
    """A consumer-group member with manual commits; see :class:`foreshock.ingest.bus.Consumer`."""

    def __init__(self, bootstrap: str, group: str, topics: Sequence[str], *, client_id: str = "foreshock",
                 on_assign: AssignListener | None = None, **config):
        settings = dict(
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 << 20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
        )
        settings.update(config)
        self._consumer = KafkaConsumer(**settings)
        # Learn every topic's partitions before joining the group. The member that leads a
        # rebalance assigns from its own metadata; one that joined before its first metadata
        # response assigned nothing ("No partition metadata for topic") and left a new member
        # idle until a later refresh (seen in CI: two `foreshock serve` started together).
        for topic in topics:
            self._consumer.partitions_for_topic(topic)
        self._on_assign = on_assign
        self._ends: dict[TopicPartition, int] = {}  # asked of the broker where no fetch reported them
        self._ends_due = 0.0
        self._handover = threading.Lock()
        self._pending: set[tuple[str, int]] | None = None
        listener = None if on_assign is None else _AssignListener(self._hand_over)
        self._consumer.subscribe(list(topics), listener=listener)

    def _hand_over(self, assigned: set[tuple[str, int]]) -> None:
        """kafka-python 3 calls rebalance listeners on its IO thread, while the application may be
        mid-cycle on its own; so the new assignment is only handed over here, and :meth:`poll`
        gives it to ``on_assign`` on the caller's thread (the :data:`foreshock.ingest.bus.AssignListener`
        contract). Returning at once also keeps the IO thread's heartbeats on time."""
        with self._handover:
            self._pending = assigned

    def poll(self, timeout_s: float = 1.0, max_records: int = 10_000) -> list[Message]:
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        self._resume_stalled_join()
        out: list[Message] = []
        for tp, records in batches.items():
            # A key that is not UTF-8 (a foreign producer's) must not raise here, where no dead
            # letter can be sent: its undecodable bytes read as U+FFFD and the message meets the
            # usual checks (RecordStream dead-letters a record whose node differs from the key).
            out.extend(
                Message(tp.topic, tp.partition, r.offset,
                        r.key.decode(errors="replace") if r.key else None, r.value,
                        r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None)
                for r in records
            )
        with self._handover:
            assigned, self._pending = self._pending, None
        if assigned is None or self._on_assign is None:
            return out
        # A rebalance landed during this poll. Give back what it read of the new assignment (the
        # next poll reads it again), then let the listener restore state and seek: it sees the
        # assignment before any record of it, as the Bus contract promises.
        first: dict[tuple[str, int], int] = {}
        for m in out:
            if (m.topic, m.partition) in assigned:
                first.setdefault((m.topic, m.partition), m.offset)
        self.seek(first)
        self._on_assign(assigned)
        return []

    def _resume_stalled_join(self) -> None:
        """Work around a kafka-python 3.0.12 bug, the client side of KAFKA-9815 (fixed in the Java
        client): a rejoin that the group leader starts because topic metadata changed does not set
        ``rejoin_needed``. When its JoinGroup/SyncGroup round trip outlives the poll that sent
        it, no later poll collects the result: the member stays mid-rebalance with heartbeats off
        until the broker drops it, and meanwhile keeps reading the partitions it had (seen in CI
        as two ``foreshock serve`` processes that both owned every partition). Asking for the
        rejoin, as the Java client does, makes the next poll finish it."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        if getattr(coordinator, "_join_task", None) is not None and not coordinator.rejoin_needed:
            log.warning("consumer group %s: a rejoin was left unfinished; asking for it again",
                        coordinator.group_id)
            coordinator.request_rejoin()

    def commit(self, messages: Iterable[Message]) -> None:
        offsets = {
            TopicPartition(t, p): OffsetAndMetadata(pos, "", -1)
            for (t, p), pos in commit_positions(messages).items()
        }
        if offsets:
            self._consumer.commit(offsets)

    def seek(self, positions: dict[tuple[str, int], int]) -> None:
        """Move to explicit offsets (a service restoring a checkpoint that recorded them); a
        partition that a newer rebalance has already taken away is left alone."""
        owned = self._consumer.assignment()
        for (t, p), pos in positions.items():
            if TopicPartition(t, p) in owned:
                self._consumer.seek(TopicPartition(t, p), pos)

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def lag(self) -> dict[tuple[str, int], int | None]:
        """Records between this member's position and the partition's last known end, per owned
        partition; None until a fetch or the broker (:meth:`_ask_ends`) has reported the end."""
        assigned = self._consumer.assignment()
        self._ask_ends([tp for tp in assigned if self._consumer.highwater(tp) is None])
        positions = self._positions(assigned)
        out: dict[tuple[str, int], int | None] = {}
        for tp in assigned:
            high, pos = self._consumer.highwater(tp), positions.get(tp)
            high = self._ends.get(tp) if high is None else high
            out[(tp.topic, tp.partition)] = None if high is None or pos is None else max(0, high - pos)
        return out

    def _positions(self, assigned: set[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Each assigned partition's next offset (None where unknown).

        ``KafkaConsumer.position`` refreshes committed offsets, runs pending resets and validates
        positions on every call, and the lag is read every cycle for every owned partition (a busy
        risk service spent more on that than on its features). So that runs once, and the
        positions are read where ``position`` reads them, the consumer's subscription state
        (kafka-python 3).
        """
        if not assigned:
            return {}
        try:
            self._consumer.position(next(iter(assigned)), timeout_ms=0)
        except KafkaError:  # a rebalance in flight: unknown this cycle
            return {}
        state = self._consumer._subscription.assignment  # may change under us: the IO thread rebalances
        out: dict[TopicPartition, int | None] = {}
        for tp in assigned:
            kept = state.get(tp)
            out[tp] = None if kept is None or kept.position is None else kept.position.offset
        return out

    def _ask_ends(self, unknown: list[TopicPartition]) -> None:
        """The ends of partitions no fetch has reported, from the broker, at most once a second.

        An incremental fetch session (KIP-227) leaves out of its responses the partitions with nothing
        new, and kafka-python forgets a kept partition's end at a rebalance: a member that had read a
        partition to its end before a rebalance would otherwise never learn it again (seen in CI: a
        serve never ready after a second one joined its group, in a full test run).
        """
        if not unknown or time.monotonic() < self._ends_due:
            return
        self._ends_due = time.monotonic() + 1.0
        try:
            self._ends.update(self._consumer.end_offsets(unknown, timeout_ms=500))
        except KafkaError:  # no broker: the lag stays unknown, as before
            pass

    def reachable(self) -> bool:
        """Whether this member holds an open connection to at least one broker of the cluster.

        For readiness probes (safe from another thread: it only reads connection states). While no
        broker answers, polls return nothing and the lag keeps the last ends it saw, so neither
        shows the outage; the connections do, within the client's reconnect attempts.
        """
        client = getattr(self._consumer, "_client", None)  # kafka-python keeps its client private
        if client is None:
            return True
        return any(client.connected(b.node_id) for b in client.cluster.brokers())  # brokers(): a copy

    def close(self) -> None:
        self._consumer.close(autocommit=False)


class _AssignListener(ConsumerRebalanceListener):
    """Adapts an :data:`foreshock.ingest.bus.AssignListener` to kafka-python's rebalance callbacks."""

    def __init__(self, on_assign: AssignListener):
        self._on_assign = on_assign

    def on_partitions_revoked(self, revoked) -> None:
        """Nothing to do: the new assignment says everything the listener needs."""

    def on_partitions_assigned(self, assigned) -> None:
        self._on_assign({(tp.topic, tp.partition) for tp in assigned})
