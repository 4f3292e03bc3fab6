"""The telemetry contract: every record that crosses the bus, its topic and its wire form.

Records are msgspec Structs so that decoding *is* validation: a record that does not match
its type, carries another schema version, a negative timestamp or an empty node id raises
:class:`RecordError` naming the field, and never reaches a feature engine half-formed.

Physical bounds. A reading no device can produce (``gpu_temp = -1e308``, ``fb_used = -5``) is
refused like a wrong type: the whole record, with a reason naming the field and the bound (such
as ``Expected `float` >= 0.0 - at `$[0].fb_used```), so every consumer dead-letters it with its
original bytes. The rule is the same for every field, deliberately: such a value means the
sensor or the producer is broken, so the other readings of the same sample are suspect too,
and a dead letter per scrape shows the fault where a silently emptied field would hide it (and,
through the peer features, shift other nodes' scores). The bounds are wide, to refuse only the
impossible, never a hot or busy GPU:

- ``gpu_temp``, ``memory_temp``: -50 to 200 °C;
- ``power_usage``: 0 to 10,000 W;
- ``sm_clock``, ``mem_clock``: 0 to 100,000 MHz;
- ``gpu_util``, ``mem_copy_util``: 0 to 100 %;
- ``fb_used``, ``fb_free``: 0 to 2^24 MiB (16 TiB);
- every counter and count, ``clocks_event_reasons``, ``xid_errors``, the row-remap flags: >= 0;
- ``LinkSample.rate_gbps``: 0 to 100,000 Gb/s.

A field the device does not report stays ``None``; ``extra`` (series the contract does not
name, which no feature reads) is not bounded.

On the wire a Kafka message is UTF-8 JSON holding either one record or an array of records of
the topic's type for one node (one scrape of a node's eight GPUs is one message). Timestamps
are integer epoch milliseconds, UTC. GPU field names are DCGM's (``DCGM_FI_DEV_GPU_TEMP`` ->
``gpu_temp``), so a dcgm-exporter scrape, an NVML poll and the simulator fill the same columns.

Versions and compatibility. Every encoded record carries its schema version ``v`` (now 1), so a
consumer in any language can tell which contract a record follows; other fields equal to their
default are left out. ``v`` is the *major* version: it changes only when a change would make an
older consumer misread a record (a field renamed, retyped, given a new meaning or made required).
Adding an optional field is not such a change, so within one major version:

- a consumer ignores fields it does not know, and a newer producer that adds one is still read
  by older consumers (forward compatible). A field name misspelt by a producer is therefore
  ignored, not refused: the fields the consumer knows are still validated;
- a record without ``v`` (written before ``v`` was always sent) decodes as version 1;
- a record whose ``v`` is not one this consumer knows (a higher major version) is refused with
  a reason naming ``$.v`` and the versions it knows, and is dead-lettered like any invalid record.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "SCHEMA_VERSION",
    "MAX_EPOCH_MS",
    "Topic",
    "TELEMETRY_TOPICS",
    "GpuSample",
    "XidEvent",
    "LinkSample",
    "NodeEvent",
    "UNAVAILABLE_EVENTS",
    "RETURN_EVENTS",
    "KUBE_DRAIN_TAINT",
    "FeatureContribution",
    "RiskScore",
    "MitigationEvent",
    "DeadLetter",
    "DEAD_LETTER_MAX_VALUE",
    "DEAD_LETTER_MAX_TEXT",
    "Record",
    "RecordError",
    "RECORD_TYPES",
    "GPU_FIELDS",
    "LINK_COUNTERS",
    "encode",
    "decode",
    "TOMBSTONE_REASON",
    "topic_of",
    "partition_of",
]

SCHEMA_VERSION: Final = 1


class Topic:
    """Kafka topic names. Every record is keyed by its node id."""

    GPU: Final = "telemetry.gpu"
    XID: Final = "telemetry.xid"
    LINK: Final = "telemetry.link"
    NODE_EVENTS: Final = "node.events"
    RISK: Final = "risk.scores"
    MITIGATION: Final = "mitigation.events"
    DEADLETTER: Final = "telemetry.deadletter"

    ALL: Final = (GPU, XID, LINK, NODE_EVENTS, RISK, MITIGATION, DEADLETTER)


TELEMETRY_TOPICS: Final = (Topic.GPU, Topic.XID, Topic.LINK, Topic.NODE_EVENTS)

MAX_EPOCH_MS: Final = 2**53
"""The latest timestamp a record may carry (the largest integer a float64 holds exactly)."""

Version = Literal[1]
EpochMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_EPOCH_MS)]
NodeId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Celsius = Annotated[float, msgspec.Meta(ge=-50.0, le=200.0)]
Watts = Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)]
MHz = Annotated[float, msgspec.Meta(ge=0.0, le=100_000.0)]
Percent = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
MiB = Annotated[float, msgspec.Meta(ge=0.0, le=float(2**24))]


def _schema_version() -> int:
    """The default of ``v``, given as a factory on purpose: ``omit_defaults`` leaves out a field
    equal to a plain default, which kept ``v`` off the wire; a value made by a factory is always
    encoded. A record decoded without ``v`` still gets it."""
    return SCHEMA_VERSION


class _Record(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True, gc=False):
    """Fields every record carries: schema version, node id, epoch-ms timestamp.

    Unknown fields are ignored (not ``forbid_unknown_fields``): see the module docstring.
    """

    v: Version = msgspec.field(default_factory=_schema_version)
    node: NodeId
    ts: EpochMs


class GpuSample(_Record):
    """All of one GPU's fields at one instant. A field the GPU does not report stays ``None``.

    Names follow DCGM (``DCGM_FI_DEV_<NAME>`` lower-cased). Cumulative counters (ECC totals,
    retired pages, remapped rows, PCIe replays, NVLink errors, violations) are reported as the
    device reports them; the feature pipeline turns them into reset-aware increases.
    """

    gpu: Annotated[int, msgspec.Meta(ge=0, le=1024)]
    uuid: str | None = None
    pci_bus_id: str | None = None
    model_name: str | None = None
    # gauges (physical bounds: see the module docstring)
    gpu_temp: Celsius | None = None
    memory_temp: Celsius | None = None
    power_usage: Watts | None = None
    sm_clock: MHz | None = None
    mem_clock: MHz | None = None
    gpu_util: Percent | None = None
    mem_copy_util: Percent | None = None
    fb_used: MiB | None = None
    fb_free: MiB | None = None
    clocks_event_reasons: Count | None = None
    xid_errors: Count | None = None
    row_remap_failure: Count | None = None
    row_remap_pending: Count | None = None
    # cumulative counters
    ecc_sbe_vol_total: Count | None = None
    ecc_dbe_vol_total: Count | None = None
    ecc_sbe_agg_total: Count | None = None
    ecc_dbe_agg_total: Count | None = None
    retired_sbe: Count | None = None
    retired_dbe: Count | None = None
    retired_pending: Count | None = None
    correctable_remapped_rows: Count | None = None
    uncorrectable_remapped_rows: Count | None = None
    pcie_replay_counter: Count | None = None
    nvlink_crc_flit_error_count_total: Count | None = None
    nvlink_crc_data_error_count_total: Count | None = None
    nvlink_replay_error_count_total: Count | None = None
    nvlink_recovery_error_count_total: Count | None = None
    power_violation: Count | None = None
    thermal_violation: Count | None = None
    total_energy_consumption: Count | None = None
    # series a source reports that the contract does not name (kept, never dropped)
    extra: dict[str, float] | None = None


class XidEvent(_Record):
    """One Xid (or a folded run of identical ones: ``count`` > 1 between ``first_ts`` and ``last_ts``).

    ``xid`` 79 also stands for "GPU has fallen off the bus" lines, which is what that code means.
    """

    xid: Annotated[int, msgspec.Meta(ge=0, le=100_000)]
    gpu: int | None = None
    pci_bus_id: str | None = None
    pid: int | None = None
    process: str | None = None
    message: str = ""
    count: Annotated[int, msgspec.Meta(ge=1)] = 1
    first_ts: EpochMs | None = None
    last_ts: EpochMs | None = None
    # the Xid policy applied at collection time (foreshock.ingest.collectors.xid_policy); None when unset
    severity: str | None = None
    action: str | None = None


class LinkSample(_Record):
    """One InfiniBand port or NVLink link: state and cumulative error counters at one instant.

    Counter names are the InfiniBand sysfs names (``/sys/class/infiniband/*/ports/*/counters``).
    ``deltas`` holds per-interval increases when the collector computed them (reset-aware).
    """

    port: Annotated[str, msgspec.Meta(min_length=1)]
    kind: Literal["ib", "nvlink", "eth"] = "ib"
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: Annotated[float, msgspec.Meta(ge=0.0, le=100_000.0)] | None = None
    symbol_error: Count | None = None
    link_error_recovery: Count | None = None
    link_downed: Count | None = None
    port_rcv_errors: Count | None = None
    port_rcv_remote_physical_errors: Count | None = None
    port_xmit_discards: Count | None = None
    local_link_integrity_errors: Count | None = None
    excessive_buffer_overrun_errors: Count | None = None
    extra: dict[str, int] | None = None
    deltas: dict[str, int] | None = None


NodeEventKind = Literal["up", "down", "failed", "drained", "repaired"]


class NodeEvent(_Record):
    """Node lifecycle. ``failed`` carries the cause; the simulator's ground truth also says
    whether the failure showed foreshocks (``detectable``)."""

    event: NodeEventKind
    cause: str | None = None
    detectable: bool | None = None
    detail: str | None = None


UNAVAILABLE_EVENTS: Final = frozenset({"failed", "down", "drained"})
"""Events after which a node is out of service (not scored, not labelled) until it returns."""
RETURN_EVENTS: Final = frozenset({"repaired", "up"})
"""Events that bring a node back into service: its feature windows start afresh there."""
KUBE_DRAIN_TAINT: Final = "foreshock.io/failure-risk"
"""The Kubernetes taint that keeps a node Foreshock drained out of service until it is undrained
(the mitigator sets and removes it; the node-state collector reads it as ``drained``)."""


class FeatureContribution(msgspec.Struct, frozen=True, kw_only=True):
    """One feature's value and its SHAP contribution (log-odds) to a node's risk."""

    name: str
    value: float | None
    contribution: float


class RiskScore(_Record):
    """A node's probability of failing within ``horizon_minutes``, as the predictor published it."""

    probability: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
    alert: bool
    threshold: float
    horizon_minutes: int = 60
    model_version: str = ""
    top_features: list[FeatureContribution] = []


class MitigationEvent(_Record):
    """One step of one mitigation action, for the audit trail. ``action_id`` makes it idempotent.

    ``fault`` / ``observed`` records a node's failure the mitigator counted (for its burn-in)."""

    action_id: str
    action: Literal["checkpoint", "drain", "undrain", "migrate", "pin", "unpin", "breaker", "record", "fault"]
    status: Literal[
        "planned", "started", "succeeded", "failed", "skipped",
        "partial", "abandoned", "blocked", "rejected", "tripped", "reset", "observed",
    ]
    job: str | None = None
    reason: str = ""
    dry_run: bool = False
    attempt: int = 1


DEAD_LETTER_MAX_VALUE: Final = 256 << 10
"""Bytes of a bad message's value that its dead letter carries at most (:meth:`DeadLetter.of`)."""
DEAD_LETTER_MAX_TEXT: Final = 4096
"""Characters of a bad message's key, and of the reason, that its dead letter carries at most."""


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A message that could not be decoded: its original bytes, where it came from, and why.

    ``value`` is None for a tombstone (a Kafka message without a value). Build one with
    :meth:`of`: it bounds the letter's size, so a dead letter always fits where the bad message
    did not have to. ``size`` and ``sha256`` describe the whole original value even when
    ``truncated`` says that ``value`` holds only its first :data:`DEAD_LETTER_MAX_VALUE` bytes.
    """

    v: Version = msgspec.field(default_factory=_schema_version)
    ts: EpochMs
    topic: str
    partition: int | None
    offset: int | None
    key: str | None
    reason: str
    value: bytes | None  # JSON encodes bytes as base64
    size: int | None = None  # bytes of the original value
    sha256: str | None = None  # hex digest of the original value
    truncated: bool = False  # value holds only the original's first DEAD_LETTER_MAX_VALUE bytes

    @classmethod
    def of(cls, *, ts: int, topic: str, partition: int | None, offset: int | None, key: str | None,
           reason: str, value: bytes | None) -> DeadLetter:
        """The dead letter of one message: under half a MiB of JSON, however large the message.

        Why bounded: the broker may accept a message (10 MiB here) that the dead letter, base64
        and all, would not fit into (the producer's 8 MiB ``max_request_size``, 1 MiB by Kafka's
        default); a letter that cannot be sent would stop the consumer on the message it was
        meant to set aside. The head of a bad value shows what went wrong; the size and hash
        identify the whole. Key and reason are clipped too (a foreign producer chooses the key,
        and a reason may quote it).
        """
        size = digest = None
        truncated = False
        if value is not None:
            size, digest = len(value), hashlib.sha256(value).hexdigest()
            truncated = size > DEAD_LETTER_MAX_VALUE
            value = bytes(value[:DEAD_LETTER_MAX_VALUE])
        return cls(ts=ts, topic=topic[:DEAD_LETTER_MAX_TEXT], partition=partition, offset=offset,
                   key=None if key is None else key[:DEAD_LETTER_MAX_TEXT],
                   reason=reason[:DEAD_LETTER_MAX_TEXT], value=value, size=size, sha256=digest,
                   truncated=truncated)


Record = GpuSample | XidEvent | LinkSample | NodeEvent | RiskScore | MitigationEvent

RECORD_TYPES: Final[dict[str, type]] = {
    Topic.GPU: GpuSample,
    Topic.XID: XidEvent,
    Topic.LINK: LinkSample,
    Topic.NODE_EVENTS: NodeEvent,
    Topic.RISK: RiskScore,
    Topic.MITIGATION: MitigationEvent,
    Topic.DEADLETTER: DeadLetter,
}

_TOPIC_OF: Final[dict[type, str]] = {t: topic for topic, t in RECORD_TYPES.items()}

_NON_FIELDS: Final = {"v", "node", "ts", "gpu", "uuid", "pci_bus_id", "model_name", "extra"}
GPU_FIELDS: Final[tuple[str, ...]] = tuple(f for f in GpuSample.__struct_fields__ if f not in _NON_FIELDS)
"""Numeric GPU fields, in contract order: the columns features may read."""

LINK_COUNTERS: Final[tuple[str, ...]] = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


class RecordError(ValueError):
    """A message that is not a valid record of its topic. ``reason`` names the field."""

    def __init__(self, topic: str, reason: str):
        super().__init__(f"invalid record on {topic}: {reason}")
        self.topic = topic
        self.reason = reason


_encoder = msgspec.json.Encoder()
_decoders: dict[str, msgspec.json.Decoder] = {
    topic: msgspec.json.Decoder(t | list[t]) for topic, t in RECORD_TYPES.items()  # type: ignore[operator]
}


def topic_of(record: Any) -> str:
    """The topic a record type travels on."""
    return _TOPIC_OF[type(record)]


@lru_cache(maxsize=1 << 16)
def partition_of(node: str, partitions: int) -> int:
    """The partition of a topic with ``partitions`` partitions that ``node``'s records go to.

    The contract's partitioner is Kafka's Java default: murmur2 over the UTF-8 key, sign bit
    cleared, modulo the partition count (computed by the Kafka client's own ``murmur2``, imported
    only when asked, so the training-side hook that reads this module loads no Kafka client).
    Every producer must place records this way, because one node's records must share a
    partition; the in-memory bus places them the same way, and the peer features group nodes by
    it (:attr:`foreshock.features.spec.FeatureSet.peer_partitions`).

    >>> partition_of("node0001", 8) == partition_of("node0001", 8) < 8
    True
    """
    from kafka.partitioner.default import murmur2

    return (murmur2(node.encode()) & 0x7FFFFFFF) % partitions


def encode(records: Any) -> bytes:
    """JSON bytes for one record or a list of records of one topic."""
    return _encoder.encode(records)


TOMBSTONE_REASON: Final = "tombstone: the message has no value (null), and the contract defines no deletion"


def decode(topic: str, data: bytes | None, *, decoder: msgspec.json.Decoder | None = None) -> list[Any]:
    """Decode and validate a message of ``topic``; always returns a list of records.

    ``decoder``: one for a type derived from the topic's record type that accepts and refuses the
    same messages (:class:`foreshock.ingest.columns.ColumnDecoder`); default: the topic's own.

    Raises :class:`RecordError` with a reason such as ``Expected `int` >= 0 - at `$.ts```, and
    nothing else, whatever the bytes.

    ``data=None`` is a Kafka tombstone (a message without a value). Any producer may write one,
    so it must not kill a consumer, but it is bad input here, not a message to skip: our topics
    are not compacted and no record type means "forget this node", so a tombstone says that
    some producer is misconfigured. It raises :class:`RecordError` like any invalid message,
    so every consumer dead-letters it with this reason and commits past it (the contract's
    rule: a bad record is never silently dropped).
    """
    if decoder is None:
        try:
            decoder = _decoders[topic]
        except KeyError:
            raise RecordError(topic, f"unknown topic {topic!r}") from None
    if data is None:
        raise RecordError(topic, TOMBSTONE_REASON)
    try:
        out = decoder.decode(data)
    except msgspec.ValidationError as exc:
        reason = str(exc)
        if reason.endswith(".v`"):  # e.g. "Invalid enum value 2 - at `$[0].v`"
            reason = f"unsupported schema version (this consumer knows v{SCHEMA_VERSION}): {reason}"
        raise RecordError(topic, reason) from None
    except msgspec.DecodeError as exc:
        raise RecordError(topic, f"malformed JSON: {exc}") from None
    if isinstance(out, list):
        if not out:
            raise RecordError(topic, "empty batch")
        return out
    return [out]
