"""The topic channel reads ``mitigation.events`` through the record stream: bad messages are set aside."""

from __future__ import annotations

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import Topic, decode
from foreshock.mitigator.channels import Command, TopicChannel


def test_a_tombstone_or_garbage_on_the_command_topic_is_dead_lettered_and_commands_still_arrive():
    bus = InMemoryBus()
    hook_side = TopicChannel(bus, since_ms=0)
    mitigator_side = TopicChannel(bus, since_ms=0)
    bus.send(Topic.MITIGATION, "n1", None)  # a tombstone from some other producer
    bus.send(Topic.MITIGATION, "n1", b"{not json")
    mitigator_side.send(Command("migrate:n1:job:1", "job", "leave", "n1", 1))
    got = []
    for _ in range(20):
        got += hook_side.poll("job")
        if got:
            break
    assert [c.action_id for c in got] == ["migrate:n1:job:1"]
    letters = [r for m in bus.consumer("check", [Topic.DEADLETTER]).poll(1.0)
               for r in decode(Topic.DEADLETTER, m.value)]
    assert len(letters) == 2 and letters[0].value is None and "tombstone" in letters[0].reason
