"""Decoding a poll into columns (foreshock.ingest.columns, ``RecordStream.poll_batches``) decides
exactly as decoding each message into contract records: the same messages accepted, the same
reasons for the refused, the same values (NaN where a record holds None). Inputs: the fuzzing
suite's real messages and their mutations (tests/unit/test_contract_fuzz.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.columns import ColumnDecoder, column_kinds, record_columns
from foreshock.ingest.contract import TELEMETRY_TOPICS, GpuSample, RecordError, Topic, decode, encode
from foreshock.ingest.stream import RecordStream, publish
from tests.unit.test_contract_fuzz import REPO, SETTINGS, _byte_mutations, _json_mutations

pytestmark = pytest.mark.timeout(300)

SEEDS = [(t, v) for t, v in REPO if t in TELEMETRY_TOPICS]


def _outcome(decoder, topic: str, data: bytes | None) -> tuple[str, object]:
    try:
        records = decoder(topic, data)
    except RecordError as exc:
        return "refused", exc.reason
    return "records", record_columns(topic, records, list(column_kinds(topic)))


def _same_columns(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        if a[name].dtype == np.float64:
            assert np.array_equal(a[name], b[name], equal_nan=True), name
        else:
            assert a[name].tolist() == b[name].tolist(), name


def check_same(topic: str, data: bytes | None) -> None:
    contract = _outcome(decode, topic, data)
    columnar = _outcome(lambda t, d: ColumnDecoder(t).decode(d), topic, data)
    assert contract[0] == columnar[0]
    if contract[0] == "refused":
        assert contract[1] == columnar[1]
    else:
        _same_columns(contract[1], columnar[1])


def test_the_seeds_decode_to_the_same_columns():
    assert {t for t, _ in SEEDS} == set(TELEMETRY_TOPICS)
    for topic, data in SEEDS:
        check_same(topic, data)
    check_same(Topic.GPU, None)


@SETTINGS
@given(st.one_of(_byte_mutations(SEEDS), _json_mutations(SEEDS)))
def test_mutated_messages_are_decided_alike(message):
    check_same(*message)


def test_absent_numbers_read_as_nan_and_integers_keep_their_type():
    sample = GpuSample(node="n1", ts=5, gpu=3, gpu_temp=61.5, ecc_sbe_vol_total=7)
    cols = record_columns(Topic.GPU, ColumnDecoder(Topic.GPU).decode(encode(sample)),
                          ["node", "ts", "gpu", "gpu_temp", "power_usage", "ecc_sbe_vol_total"])
    assert cols["node"].tolist() == ["n1"] and cols["ts"].dtype == cols["gpu"].dtype == np.int64
    assert cols["gpu_temp"][0] == 61.5 and cols["ecc_sbe_vol_total"][0] == 7
    assert np.isnan(cols["power_usage"][0])


def test_a_poll_in_batches_dead_letters_what_a_poll_by_message_does():
    bus = InMemoryBus(partitions=2)
    good = [GpuSample(node=f"n{i % 5}", ts=1_000 + i, gpu=i % 8, gpu_temp=50.0 + i) for i in range(40)]
    publish(bus, good[:20])
    bus.send(Topic.GPU, "n1", None)  # a tombstone
    bus.send(Topic.GPU, "n2", encode([GpuSample(node="n3", ts=1, gpu=0)]))  # not its key's node
    bus.send(Topic.GPU, "n4", b'{"node": "n4", "ts": -1, "gpu": 0}')  # out of bounds
    bus.send(Topic.GPU, "n0", b"[]")  # an empty batch
    publish(bus, good[20:])
    by_message = RecordStream(bus, bus.consumer("a", [Topic.GPU]), clock=lambda: 7)
    polled = by_message.poll(timeout_s=0)
    letters = sorted(m.value for m in bus.messages(Topic.DEADLETTER))
    batches = RecordStream(bus, bus.consumer("b", [Topic.GPU]), clock=lambda: 7)
    got = batches.poll_batches({Topic.GPU: ("gpu", "gpu_temp")}, timeout_s=0)
    assert len(letters) == 4
    assert sorted(m.value for m in bus.messages(Topic.DEADLETTER)) == sorted(letters * 2)
    assert batches.records == by_message.records == 40 and batches.dead_letters == 4
    for b in got:
        mine = [d for d in polled if d.message.partition == b.partition]
        assert [m.offset for m in b.messages] == [d.message.offset for d in mine] == b.offsets.tolist()
        assert b.counts.tolist() == [len(d.records) for d in mine]
        records = [r for d in mine for r in d.records]
        _same_columns(b.columns, record_columns(Topic.GPU, records, ["node", "ts", "gpu", "gpu_temp"]))
