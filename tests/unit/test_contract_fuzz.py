"""Fuzzing the contract's decoders: whatever a message holds, ``decode`` returns valid records of
its topic or raises :class:`RecordError`, and nothing else; and ``RecordStream`` either hands the
records over or dead-letters the message (never raises, never drops it silently).

Inputs: random bytes, None (a tombstone), and mutations of real messages: the JSON the contract
encodes for records parsed from the repo's captured test data (tests/data/collectors), from the
simulator and from the contract tests, plus real captures in ../shared/realdata when that folder
is there (it is in CI; that part is skipped without it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.collectors import CollectorOptions, parser_for
from foreshock.ingest.contract import RECORD_TYPES, Topic, decode, encode, topic_of
from foreshock.ingest.contract import RecordError as ContractRecordError
from foreshock.ingest.simulator import stream
from foreshock.ingest.stream import RecordStream
from tests.fixtures.predictor import simulator
from tests.unit.test_contract import SAMPLES

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parents[1] / "data" / "collectors"
REALDATA = Path(__file__).parents[2].parent / "shared" / "realdata"
OPTIONS = CollectorOptions(node="node0001", clock=lambda: 1_767_225_600_000)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOPICS = sorted(RECORD_TYPES)


def _parsed(kind: str, path: Path) -> list:
    return list(parser_for(kind)(iter(path.read_bytes().splitlines(keepends=True)), OPTIONS).records)


def _messages(records: list) -> list[tuple[str, bytes]]:
    """(topic, value) of each record alone and of each topic's first records as one batch."""
    out = [(topic_of(r), encode(r)) for r in records]
    by_topic: dict[str, list] = {}
    for r in records:
        by_topic.setdefault(topic_of(r), []).append(r)
    out += [(t, encode(rs[:8])) for t, rs in by_topic.items()]
    return out


def _repo_messages() -> list[tuple[str, bytes]]:
    records = list(SAMPLES)
    records += _parsed("kmsg", DATA / "xid" / "xid_lines.txt")
    records += _parsed("kmsg", DATA / "xid" / "dmesg-xid48-63-94-sequence.log")
    records += _parsed("dcgm", DATA / "dcgm" / "cncf-kops-L4.prom")
    records += _parsed("ib", DATA / "ib" / "sys-class-infiniband-h100.flat.txt")
    bus = InMemoryBus(partitions=1)
    stream(simulator(minutes=3, nodes=2), bus)  # the simulator's own messages, one scrape each
    sim = [(t, m.value) for t in TOPICS for m in bus.messages(t)[:20]]
    return _messages(records) + sim


def _realdata_messages() -> list[tuple[str, bytes]]:
    records: list = []
    for prom in sorted((REALDATA / "dcgm-metrics").glob("*.prom")):
        records += _parsed("dcgm", prom)
    records += _parsed("kmsg", REALDATA / "xid" / "xid_lines.txt")
    for log in sorted((REALDATA / "gpud-testdata").glob("*dmesg*.log")):
        records += _parsed("kmsg", log)
    records += _parsed("ib", REALDATA / "gpud-testdata" / "sys-class-infiniband-h100.flat.txt")
    return _messages(records)


REPO = _repo_messages()
REAL = _realdata_messages() if REALDATA.is_dir() else []
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def check_decode(topic: str, data: bytes | None) -> None:
    """The property: valid records of ``topic`` (each one survives its own round trip, so its
    constraints hold) or RecordError; any other exception fails the test."""
    try:
        records = decode(topic, data)
    except ContractRecordError as exc:
        assert exc.topic == topic and exc.reason
        return
    assert records and all(type(r) is RECORD_TYPES[topic] for r in records)
    for r in records:
        assert decode(topic, encode(r)) == [r]


def check_stream(topic: str, data: bytes | None) -> None:
    bus = InMemoryBus(partitions=1)
    bus.send(topic, "node0001", data)
    s = RecordStream(bus, bus.consumer("fuzz", [topic]), clock=lambda: 1)
    polled = s.poll(timeout_s=0)
    s.commit(polled)
    assert len(polled) == 1
    sent = bus.messages(Topic.DEADLETTER)[1 if topic == Topic.DEADLETTER else 0:]  # not the input itself
    assert bool(polled[0].records) != bool(sent)
    for m in sent:
        letter = decode(Topic.DEADLETTER, m.value)[0]
        assert letter.topic == topic and letter.reason and len(m.value) < 512 << 10


def _byte_mutations(seeds: list[tuple[str, bytes]]) -> st.SearchStrategy[tuple[str, bytes]]:
    """A real message cut, with bytes inserted, overwritten or spliced, or sent to another topic."""
    seed = st.sampled_from(seeds)

    def cut(draw_seed, at):
        return draw_seed[0], draw_seed[1][:at]

    return st.one_of(
        seed,
        st.tuples(seed, st.integers(0, 2_000)).map(lambda t: cut(t[0], t[1])),
        st.tuples(seed, st.integers(0, 2_000), st.binary(min_size=1, max_size=16))
        .map(lambda t: (t[0][0], t[0][1][: t[1]] + t[2] + t[0][1][t[1]:])),
        st.tuples(seed, st.integers(0, 2_000), st.binary(min_size=1, max_size=8))
        .map(lambda t: (t[0][0], t[0][1][: t[1]] + t[2] + t[0][1][t[1] + len(t[2]):])),
        st.tuples(seed, seed, st.integers(0, 2_000))
        .map(lambda t: (t[0][0], t[0][1][: t[2]] + t[1][1][t[2]:])),
        st.tuples(seed, st.sampled_from(TOPICS)).map(lambda t: (t[1], t[0][1])),
    )


def _mutate_json(doc, path: list[int], value, action: str):
    """Set, drop or add one field or item somewhere in a decoded message (``path`` picks where)."""
    target = doc
    for step in path[:-1]:
        inner = [c for c in (target.values() if isinstance(target, dict) else target)
                 if isinstance(c, dict | list) and c]
        if not inner:
            break
        target = inner[step % len(inner)]
    at = path[-1]
    if isinstance(target, dict) and target:
        key = sorted(target)[at % len(target)]
        if action == "drop":
            del target[key]
        elif action == "add":
            target[f"{key}_x"] = value
        else:
            target[key] = value
    elif isinstance(target, list) and target:
        i = at % len(target)
        if action == "drop":
            del target[i]
        elif action == "add":
            target.insert(i, value)
        else:
            target[i] = value
    return doc


def _json_mutations(seeds: list[tuple[str, bytes]]) -> st.SearchStrategy[tuple[str, bytes]]:
    """A real message with one field given another JSON value, dropped or added."""
    return st.tuples(
        st.sampled_from(seeds), st.lists(st.integers(0, 50), min_size=1, max_size=4), JSON_VALUES,
        st.sampled_from(["set", "drop", "add"]),
    ).map(lambda t: (t[0][0], json.dumps(_mutate_json(json.loads(t[0][1]), t[1], t[2], t[3])).encode()))


def test_the_seeds_are_real_and_valid():
    assert len(REPO) > 50 and {t for t, _ in REPO} >= {Topic.GPU, Topic.XID, Topic.LINK, Topic.NODE_EVENTS}
    for topic, data in REPO + REAL:
        assert decode(topic, data)


@SETTINGS
@given(st.sampled_from([*TOPICS, "no.such.topic"]), st.one_of(st.none(), st.binary(max_size=600)))
def test_random_bytes_and_tombstones(topic, data):
    check_decode(topic, data)
    if topic in RECORD_TYPES:
        check_stream(topic, data)


@SETTINGS
@given(_byte_mutations(REPO))
def test_byte_mutations_of_repo_messages(message):
    check_decode(*message)
    check_stream(*message)


@SETTINGS
@given(_json_mutations(REPO))
def test_field_mutations_of_repo_messages(message):
    check_decode(*message)
    check_stream(*message)


@pytest.mark.skipif(not REAL, reason=f"no real captures at {REALDATA}")
@SETTINGS
@given(st.one_of(_byte_mutations(REAL or REPO), _json_mutations(REAL or REPO)))
def test_mutations_of_realdata_messages(message):
    check_decode(*message)
    check_stream(*message)
