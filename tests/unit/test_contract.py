"""The contract decodes what it encodes and refuses, by field, what it must not accept."""

import gc

import msgspec
import pytest

from foreshock.ingest.contract import (
    GPU_FIELDS,
    RECORD_TYPES,
    SCHEMA_VERSION,
    DeadLetter,
    GpuSample,
    LinkSample,
    NodeEvent,
    RecordError,
    RiskScore,
    Topic,
    XidEvent,
    decode,
    encode,
    topic_of,
)

SAMPLES = [
    GpuSample(node="n1", ts=1_700_000_000_000, gpu=3, gpu_temp=61.5, ecc_sbe_vol_total=12,
              extra={"DCGM_FI_DEV_NEW_THING": 1.0}),
    XidEvent(node="n1", ts=5, xid=79, gpu=0, pci_bus_id="0000:3b:00.0", message="fallen off the bus",
             count=3, first_ts=1, last_ts=5),
    LinkSample(node="n1", ts=5, port="mlx5_0:1", state="ACTIVE", symbol_error=4, deltas={"symbol_error": 1}),
    NodeEvent(node="n1", ts=5, event="failed", cause="gpu_hbm", detectable=True),
    RiskScore(node="n1", ts=5, probability=0.4, alert=False, threshold=0.5, model_version="3"),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip_single_and_batch(record):
    topic = topic_of(record)
    assert decode(topic, encode(record)) == [record]
    assert decode(topic, encode([record, record])) == [record, record]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_decoded_records_are_not_tracked_by_the_garbage_collector(record):
    # a service holds millions of them between boundaries; tracked, each full collection would
    # walk them all while holding the interpreter lock (the API then waits 100+ ms)
    assert not gc.is_tracked(decode(topic_of(record), encode(record))[0])


def test_every_topic_has_a_record_type():
    assert set(RECORD_TYPES) == set(Topic.ALL)


def test_gpu_fields_are_numeric_contract_columns():
    assert "gpu_temp" in GPU_FIELDS and "ecc_dbe_vol_total" in GPU_FIELDS
    assert not {"node", "ts", "gpu", "v", "extra", "uuid"} & set(GPU_FIELDS)


@pytest.mark.parametrize(
    "payload, field",
    [
        (b'{"v":2,"node":"n1","ts":1,"gpu":0}', "$.v"),
        (b'{"v":1,"node":"n1","ts":-5,"gpu":0}', "$.ts"),
        (b'{"v":1,"ts":1,"gpu":0}', "node"),
        (b'{"v":1,"node":"","ts":1,"gpu":0}', "$.node"),
        (b'{"v":1,"node":"n1","ts":1,"gpu":0,"gpu_temp":"hot"}', "$.gpu_temp"),
        (b'[{"v":1,"node":"n1","ts":1,"gpu":0},{"v":1,"node":"n1","ts":"x","gpu":0}]', "$[1].ts"),
    ],
)
def test_invalid_records_name_the_field(payload, field):
    with pytest.raises(RecordError) as info:
        decode(Topic.GPU, payload)
    assert field in info.value.reason


@pytest.mark.parametrize("payload", [b"\xff\xfe garbage", b'{"v":1,"node":"n1","ts":', b"", b"[]"])
def test_garbage_and_truncation_are_record_errors(payload):
    with pytest.raises(RecordError):
        decode(Topic.GPU, payload)


def test_dead_letter_keeps_original_bytes():
    letter = DeadLetter(ts=1, topic=Topic.GPU, partition=2, offset=9, key="n1", reason="bad",
                        value=b"\xff\x00")
    assert msgspec.json.decode(encode(letter), type=DeadLetter).value == b"\xff\x00"


_EVERY_KIND = [*SAMPLES, DeadLetter.of(ts=1, topic=Topic.GPU, partition=0, offset=3, key="n1", reason="bad",
                                       value=b"{")]


@pytest.mark.parametrize("record", _EVERY_KIND, ids=lambda r: type(r).__name__)
def test_the_schema_version_is_on_the_wire_in_every_record(record):
    # a consumer in another language reads the version from the bytes, not from our defaults
    for data in (encode(record), encode([record, record])):
        decoded = msgspec.json.decode(data)
        for item in decoded if isinstance(decoded, list) else [decoded]:
            assert item["v"] == SCHEMA_VERSION


def test_a_record_without_a_version_from_an_older_producer_still_decodes_as_v1():
    [record] = decode(Topic.GPU, b'{"node":"n1","ts":1,"gpu":0,"gpu_temp":50.0}')
    assert record.v == SCHEMA_VERSION and record.gpu_temp == 50.0


def test_a_newer_producers_extra_field_is_ignored_and_the_known_fields_still_checked():
    [record] = decode(Topic.GPU, b'{"v":1,"node":"n1","ts":1,"gpu":0,"gpu_temp":50.0,"added_in_v1_5":[1]}')
    assert record == GpuSample(node="n1", ts=1, gpu=0, gpu_temp=50.0)
    with pytest.raises(RecordError, match=r"\$\.gpu_temp"):
        decode(Topic.GPU, b'{"v":1,"node":"n1","ts":1,"gpu":0,"gpu_temp":"hot","added":1}')
    score = b'{"v":1,"node":"n1","ts":1,"probability":0.5,"alert":false,"threshold":0.5,' \
            b'"top_features":[{"name":"f","value":1.0,"contribution":0.1,"rank":1}]}'
    assert decode(Topic.RISK, score)[0].top_features[0].name == "f"


@pytest.mark.parametrize("topic, payload", [
    (Topic.GPU, b'{"v":2,"node":"n1","ts":1,"gpu":0}'),
    (Topic.RISK, b'[{"v":7,"node":"n1","ts":1,"probability":0.5,"alert":false,"threshold":0.5}]'),
])
def test_a_higher_major_version_is_refused_with_a_reason_naming_it(topic, payload):
    with pytest.raises(RecordError) as info:
        decode(topic, payload)
    assert "unsupported schema version" in info.value.reason and "v1" in info.value.reason
    assert ".v`" in info.value.reason


@pytest.mark.parametrize(
    "field, value",
    [("gpu_temp", 1e308), ("gpu_temp", -1e308), ("memory_temp", 250.0), ("fb_used", -5), ("fb_free", 2.0**40),
     ("power_usage", -1.0), ("gpu_util", 100.5), ("sm_clock", 1e9), ("ecc_dbe_vol_total", -1),
     ("pcie_replay_counter", -3), ("clocks_event_reasons", -1)],
)
def test_a_reading_no_device_can_produce_is_refused_naming_the_field(field, value):
    payload = msgspec.json.encode([{"v": 1, "node": "n1", "ts": 1, "gpu": 0, "gpu_temp": 60.0},
                                   {"v": 1, "node": "n1", "ts": 1, "gpu": 1, field: value}])
    with pytest.raises(RecordError) as info:
        decode(Topic.GPU, payload)
    assert f"$[1].{field}" in info.value.reason and ("<=" in info.value.reason or ">=" in info.value.reason)


def test_the_bounds_refuse_only_the_impossible():
    hot_and_busy = GpuSample(node="n1", ts=1, gpu=0, gpu_temp=199.0, memory_temp=-40.0, power_usage=2_700.0,
                             sm_clock=3_000.0, gpu_util=100.0, mem_copy_util=0.0, fb_used=196_608.0,
                             fb_free=0.0, ecc_sbe_vol_total=2**63, total_energy_consumption=10**15)
    assert decode(Topic.GPU, encode(hot_and_busy)) == [hot_and_busy]
    with pytest.raises(RecordError, match=r"\$\.rate_gbps"):
        decode(Topic.LINK, b'{"v":1,"node":"n1","ts":1,"port":"mlx5_0:1","rate_gbps":-400}')
    with pytest.raises(RecordError, match=r"\$\.symbol_error"):
        decode(Topic.LINK, b'{"v":1,"node":"n1","ts":1,"port":"mlx5_0:1","symbol_error":-1}')
