"""The in-memory bus keeps Kafka's semantics: key order, group ownership, commit-then-resume."""

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import GpuSample, Topic
from foreshock.ingest.stream import RecordStream, publish


def _samples(nodes: int, steps: int):
    return [GpuSample(node=f"n{n}", ts=t, gpu=g)
            for t in range(steps) for n in range(nodes) for g in range(2)]


def test_each_node_is_ordered_and_owned_by_one_member():
    bus = InMemoryBus(partitions=4)
    a, b = bus.consumer("g", [Topic.GPU]), bus.consumer("g", [Topic.GPU])
    for t in range(20):
        publish(bus, [GpuSample(node=f"n{n}", ts=t, gpu=0) for n in range(10)])
    seen: dict[str, list[tuple[str, int]]] = {}
    for member, name in ((a, "a"), (b, "b")):
        for d in RecordStream(bus, member).poll(timeout_s=0):
            for r in d.records:
                seen.setdefault(r.node, []).append((name, r.ts))
    assert len(seen) == 10
    for node, hits in seen.items():
        assert len({m for m, _ in hits}) == 1, f"{node} consumed by two members"
        assert [ts for _, ts in hits] == list(range(20))
    assert a.assignment() and b.assignment() and not a.assignment() & b.assignment()


def test_uncommitted_records_are_redelivered_after_a_member_leaves():
    bus = InMemoryBus(partitions=2)
    publish(bus, _samples(nodes=4, steps=5))
    first = bus.consumer("g", [Topic.GPU])
    polled = first.poll(timeout_s=0)
    first.commit(polled[:1])
    first.close()
    second = bus.consumer("g", [Topic.GPU])
    again = second.poll(timeout_s=0)
    assert len(again) == len(polled) - 1
    assert {(m.partition, m.offset) for m in again} == {(m.partition, m.offset) for m in polled[1:]}


def test_bad_messages_go_to_dead_letters_and_consumption_goes_on():
    bus = InMemoryBus(partitions=1)
    publish(bus, [GpuSample(node="n1", ts=1, gpu=0)])
    bus.send(Topic.GPU, "n1", b"not json")
    bus.send(Topic.GPU, "n2", b'{"v":1,"node":"n1","ts":2,"gpu":0}')
    publish(bus, [GpuSample(node="n1", ts=3, gpu=0)])
    stream = RecordStream(bus, bus.consumer("g", [Topic.GPU]), clock=lambda: 42)
    decoded = stream.poll(timeout_s=0)
    stream.commit(decoded)
    assert [r.ts for d in decoded for r in d.records] == [1, 3]
    letters = bus.messages(Topic.DEADLETTER)
    assert len(letters) == 2 and stream.dead_letters == 2
    assert b"malformed JSON" in letters[0].value and b"does not match message key" in letters[1].value
