"""Messages any Kafka producer can write never stop a consumer: a tombstone (no value) and a value
too large for its dead letter to carry whole are dead-lettered with the reason, and the consumer
commits past them. The same checks against a real broker and a foreign producer (kcat) are in
tests/integration/test_poison_messages.py."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import (
    DEAD_LETTER_MAX_VALUE,
    RECORD_TYPES,
    TOMBSTONE_REASON,
    DeadLetter,
    GpuSample,
    RecordError,
    RiskScore,
    Topic,
    decode,
    encode,
)
from foreshock.ingest.simulator import stream
from foreshock.ingest.stream import RecordStream, publish
from tests.fixtures.predictor import simulator
from tests.unit.test_mitigator_policy import job, rig
from tests.unit.test_predictor_service import by_key, drain, make_service

OVERSIZE = 7 << 20  # the 7 MB: its base64 dead letter (9.33 MB) outgrew the producer's 8 MiB


def oversize_invalid(node: str, size: int = OVERSIZE) -> bytes:
    """A JSON array of ``node``'s GPU samples, ``size`` bytes or more, whose last sample is invalid."""
    one = encode(GpuSample(node=node, ts=1_767_225_600_000, gpu=0, gpu_temp=61.5, power_usage=420.0))
    n = size // (len(one) + 1) + 1
    return b"[" + b",".join([one] * n) + b"," + one.replace(b'"ts":1767225600000', b'"ts":-1') + b"]"


@pytest.mark.parametrize("topic", sorted(RECORD_TYPES))
def test_a_tombstone_is_a_record_error_on_every_topic(topic):
    with pytest.raises(RecordError) as info:
        decode(topic, None)
    assert info.value.reason == TOMBSTONE_REASON and "tombstone" in info.value.reason


def test_a_large_value_is_cut_in_its_dead_letter_with_its_size_and_hash():
    value = oversize_invalid("n1")
    letter = DeadLetter.of(ts=1, topic=Topic.GPU, partition=3, offset=7, key="n1", reason="bad", value=value)
    wire = encode(letter)
    assert len(wire) < 512 << 10  # fits any producer's max_request_size, Kafka's default 1 MiB too
    back = msgspec.json.decode(wire, type=DeadLetter)
    assert back.truncated and back.value == value[:DEAD_LETTER_MAX_VALUE]
    assert back.size == len(value) and back.sha256 == hashlib.sha256(value).hexdigest()
    huge_key = "k" * (1 << 20)  # a foreign producer picks the key; a reason may quote it
    letter = DeadLetter.of(ts=1, topic=Topic.GPU, partition=0, offset=0, key=huge_key, reason=huge_key,
                           value=value)
    assert len(encode(letter)) < 512 << 10


def test_a_small_value_travels_whole_and_a_tombstone_as_null():
    letter = DeadLetter.of(ts=1, topic=Topic.GPU, partition=0, offset=0, key="n1", reason="bad",
                           value=b"\xff\x00")
    back = msgspec.json.decode(encode(letter), type=DeadLetter)
    assert (back.value, back.truncated, back.size) == (b"\xff\x00", False, 2)
    assert back.sha256 == hashlib.sha256(b"\xff\x00").hexdigest()
    tomb = DeadLetter.of(ts=1, topic=Topic.GPU, partition=0, offset=0, key="n1", reason=TOMBSTONE_REASON,
                         value=None)
    assert decode(Topic.DEADLETTER, encode(tomb)) == [tomb]
    assert tomb.value is None and tomb.size is None and not tomb.truncated


def test_the_stream_dead_letters_poison_and_commits_past_it():
    bus = InMemoryBus(partitions=1)
    publish(bus, [GpuSample(node="n1", ts=1, gpu=0)])
    bus.send(Topic.GPU, "n1", None)  # a tombstone, as KafkaConsumerMember hands it over
    big = oversize_invalid("n1")
    bus.send(Topic.GPU, "n1", big)
    publish(bus, [GpuSample(node="n1", ts=2, gpu=0)])
    stream = RecordStream(bus, bus.consumer("g", [Topic.GPU]), clock=lambda: 42)
    decoded = stream.poll(timeout_s=0)
    stream.commit(decoded)
    assert [r.ts for d in decoded for r in d.records] == [1, 2]
    letters = [decode(Topic.DEADLETTER, m.value)[0] for m in bus.messages(Topic.DEADLETTER)]
    assert [(d.offset, d.value, d.reason) for d in letters[:1]] == [(1, None, TOMBSTONE_REASON)]
    assert letters[1].offset == 2 and letters[1].truncated and letters[1].size == len(big)
    assert "$[" in letters[1].reason and ".ts" in letters[1].reason
    again = RecordStream(bus, bus.consumer("g", [Topic.GPU]))  # a restart resumes after all four
    assert again.poll(timeout_s=0) == []


def test_the_risk_service_scores_as_if_the_poison_were_not_there(risk_model_dir, tmp_path):
    sim = simulator(minutes=30)
    clean = InMemoryBus(partitions=2)
    stream(sim, clean)
    expected = by_key(drain(make_service(clean, risk_model_dir, tmp_path / "clean")))
    bus = InMemoryBus(partitions=2)
    bus.send(Topic.GPU, "node0001", None)
    bus.send(Topic.GPU, "node0002", oversize_invalid("node0002"))
    stream(sim, bus)
    bus.send(Topic.XID, "node0003", None)
    svc = make_service(bus, risk_model_dir, tmp_path / "poisoned")
    assert by_key(drain(svc)) == expected
    assert svc.readiness() == (True, "ready")
    letters = [decode(Topic.DEADLETTER, m.value)[0] for m in bus.messages(Topic.DEADLETTER)]
    assert sorted((d.key, d.topic, d.truncated) for d in letters) == [
        ("node0001", Topic.GPU, False), ("node0002", Topic.GPU, True), ("node0003", Topic.XID, False)]
    svc.checkpoint()
    assert b"foreshock_predictor_dead_letters_total 3.0" in svc.metrics.render()


def test_the_mitigation_service_survives_a_tombstone_and_commits_past_it(tmp_path):
    service, bus, _ = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])], dry_run=True)
    t0 = 1_700_000_000_000
    bus.send(Topic.RISK, "n1", None)
    publish(bus, [RiskScore(node="n1", ts=t0 + i, probability=p, alert=p >= 0.8, threshold=0.8)
                  for i, p in enumerate([0.5, 0.9, 0.95])])
    assert service.poll_once(timeout_s=0) == 3
    assert [(o.action.kind, o.status) for o in service.outcomes] == [("migrate", "skipped"),
                                                                      ("drain", "skipped")]
    letters = [decode(Topic.DEADLETTER, m.value)[0] for m in bus.messages(Topic.DEADLETTER)]
    assert [(d.topic, d.key, d.reason) for d in letters] == [(Topic.RISK, "n1", TOMBSTONE_REASON)]
    service.close()
    restarted = bus.consumer("foreshock-mitigator", [Topic.RISK])  # the group's committed offsets
    assert restarted.poll(timeout_s=0) == []
