"""The collector's outbox and its disk spool against a stand-in bus that can be taken down."""

from __future__ import annotations

import threading
import time

import pytest

from foreshock.commands.sizes import parse_size
from foreshock.ingest.outbox import Outbox
from foreshock.ingest.spool import Entry, Spool


class FlakyBus:
    """``deliver`` that acknowledges everything while up and nothing while down (like a dead broker,
    after a short wait)."""

    def __init__(self):
        self.up = threading.Event()
        self.up.set()
        self.log: list[bytes] = []
        self.calls = 0

    def deliver(self, messages, timeout_s):
        self.calls += 1
        if not self.up.is_set():
            time.sleep(min(0.02, timeout_s if timeout_s is not None else 0.02))
            return 0, ConnectionError("broker down")
        self.log.extend(value for _, _, value in messages)
        return len(messages), None


def _msg(i: int, pad: int = 0) -> list[tuple[str, str, bytes]]:
    return [("telemetry.gpu", "node0001", f"{i:06d}".encode() + b"x" * pad)]


def _wait(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_put_never_waits_for_a_dead_bus_and_the_backlog_goes_out_in_order():
    bus = FlakyBus()
    bus.up.clear()
    outbox = Outbox(bus.deliver, memory_bytes=1 << 20).start()
    started = time.monotonic()
    for i in range(200):
        outbox.put(_msg(i), 1)
    assert time.monotonic() - started < 0.5  # 200 polls queued while every delivery fails
    _wait(lambda: bus.calls >= 3)
    assert bus.log == []
    bus.up.set()
    _wait(lambda: len(bus.log) == 200)
    summary = outbox.close(1.0)
    assert bus.log == [f"{i:06d}".encode() for i in range(200)]
    assert (summary.records_in, summary.records_sent, summary.records_dropped, summary.records_unsent) == \
        (200, 200, 0, 0)


def test_a_full_memory_drops_the_oldest_and_counts_them(caplog):
    bus = FlakyBus()
    bus.up.clear()
    size = Entry(_msg(0, pad=100), 3).size
    outbox = Outbox(bus.deliver, memory_bytes=10 * size, chunk_bytes=size)
    for i in range(50):
        outbox.put(_msg(i, pad=100), 3)
    summary = outbox.start().close(0.2)
    assert summary.records_dropped == 3 * 40 and summary.entries_dropped == 40
    assert summary.records_unsent == 30 and summary.records_sent == 0
    assert "outbox full" in caplog.text and "dropping the oldest" in caplog.text
    assert "120 dropped by a full buffer (40 polls)" in summary.line()


def test_the_newest_polls_are_kept_when_the_buffer_overflows():
    bus = FlakyBus()
    bus.up.clear()
    size = Entry(_msg(0), 1).size
    outbox = Outbox(bus.deliver, memory_bytes=5 * size, chunk_bytes=size)
    for i in range(20):  # the sender is not started: nothing is in flight
        outbox.put(_msg(i), 1)
    bus.up.set()
    outbox.start()
    _wait(lambda: len(bus.log) == 5)
    outbox.close(1.0)
    assert bus.log == [f"{i:06d}".encode() for i in range(15, 20)]


def test_a_hanging_delivery_does_not_make_the_newest_polls_the_dropped_ones():
    in_flight, release, sent = threading.Event(), threading.Event(), []

    def deliver(messages, timeout_s):
        if not release.is_set():  # the first chunk hangs until its timeout, then fails
            in_flight.set()
            release.wait(5)
            return 0, TimeoutError("delivery timed out")
        sent.extend(v for _, _, v in messages)
        return len(messages), None

    size = Entry(_msg(0), 1).size
    outbox = Outbox(deliver, memory_bytes=4 * size, chunk_bytes=size).start()
    outbox.put(_msg(0), 1)
    in_flight.wait(5)
    for i in range(1, 11):  # memory keeps the newest four; poll 0 in flight is out of the count
        outbox.put(_msg(i), 1)
    assert outbox.records_dropped == 6
    release.set()  # poll 0 comes back in front of memory and goes first
    _wait(lambda: len(sent) == 5)
    outbox.put(_msg(11), 1)
    _wait(lambda: len(sent) == 6)
    summary = outbox.close(1.0)
    assert sent == [f"{i:06d}".encode() for i in (0, 7, 8, 9, 10, 11)] and summary.records_dropped == 6


def test_memory_overflows_into_the_spool_in_order_and_a_restart_sends_what_was_left(tmp_path):
    bus = FlakyBus()
    bus.up.clear()
    size = Entry(_msg(0, pad=200), 1).size
    outbox = Outbox(bus.deliver, memory_bytes=4 * size,
                    spool=Spool(tmp_path, max_bytes=1 << 20, segment_bytes=3 * size)).start()
    for i in range(40):
        outbox.put(_msg(i, pad=200), 1)
    assert len(outbox.spool) >= 35  # all but memory's four (and any in flight) went to disk
    summary = outbox.close(0.2)
    assert summary.records_unsent == 0 and summary.records_spooled == 40 and summary.records_dropped == 0

    bus.up.set()  # the next start sends the previous run's backlog before its own polls
    again = Outbox(bus.deliver, memory_bytes=4 * size, spool=Spool(tmp_path, max_bytes=1 << 20)).start()
    again.put(_msg(40, pad=200), 1)
    _wait(lambda: len(bus.log) == 41)
    assert again.close(1.0).records_spooled == 0
    assert [v[:6] for v in bus.log] == [f"{i:06d}".encode() for i in range(41)]
    assert list(tmp_path.glob("*.spool")) == []


def test_a_full_spool_drops_the_oldest_and_keeps_within_its_bound(tmp_path):
    bus = FlakyBus()
    bus.up.clear()
    size = Entry(_msg(0, pad=500), 1).size
    spool = Spool(tmp_path, max_bytes=20 * size, segment_bytes=2 * size)
    outbox = Outbox(bus.deliver, memory_bytes=2 * size, spool=spool)
    for i in range(100):
        outbox.put(_msg(i, pad=500), 1)
        assert spool.bytes <= spool.max_bytes
    assert outbox.records_dropped > 0
    kept = outbox.pending_records()
    assert kept + outbox.records_dropped == 100
    bus.up.set()
    outbox.start()
    _wait(lambda: len(bus.log) == kept)
    outbox.close(1.0)
    got = [int(v[:6]) for v in bus.log]
    assert got == list(range(100 - kept, 100))  # the newest polls, in order, without a gap


def test_a_torn_tail_is_skipped_and_the_rest_is_read(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(3):
        spool.append(Entry(_msg(i), 2))
    (segment,) = tmp_path.glob("*.spool")
    segment.write_bytes(segment.read_bytes()[:-3])  # killed mid-write
    again = Spool(tmp_path, max_bytes=1 << 20)
    got = []
    while (entry := again.pop()) is not None:
        got.append(entry.messages[0][2])
    assert got == [b"000000", b"000001"] and again.records == 0 and len(again) == 0


def test_while_the_bus_fails_one_poll_at_a_time_is_handed_over_then_the_backlog_at_once():
    bus = FlakyBus()
    bus.up.clear()
    sizes: list[int] = []

    def deliver(messages, timeout_s):
        sizes.append(len(messages))
        return bus.deliver(messages, timeout_s)

    outbox = Outbox(deliver, memory_bytes=1 << 20)
    outbox.put(_msg(0), 1)
    outbox.start()
    _wait(lambda: len(sizes) >= 1)
    for i in range(1, 50):
        outbox.put(_msg(i), 1)
    _wait(lambda: len(sizes) >= 3)  # failed attempts, after the back-off
    bus.up.set()
    _wait(lambda: len(bus.log) == 50)
    outbox.close(1.0)
    # failed attempts and the first acknowledged one carry one poll (a lost acknowledgement would
    # repeat that poll only); the acknowledgement ends the failure and the rest go together
    assert sizes[:-1] == [1] * (len(sizes) - 1) and sizes[-1] == 49, sizes
    assert bus.log == [f"{i:06d}".encode() for i in range(50)]


def test_partly_delivered_polls_resend_only_what_did_not_go():
    sent: list[bytes] = []
    fail_once = [True]

    def deliver(messages, timeout_s):
        if fail_once[0]:
            fail_once[0] = False
            sent.append(messages[0][2])
            return 1, ConnectionError("broker went away mid-batch")
        sent.extend(v for _, _, v in messages)
        return len(messages), None

    outbox = Outbox(deliver, memory_bytes=1 << 20)
    outbox.put([("telemetry.gpu", "a", b"a1"), ("telemetry.xid", "a", b"a2")], 2)
    outbox.start()
    _wait(lambda: len(sent) == 2)
    summary = outbox.close(1.0)
    assert sent == [b"a1", b"a2"] and summary.records_sent == 2


def test_close_returns_within_its_bound_while_a_delivery_hangs():
    release = threading.Event()

    def deliver(messages, timeout_s):
        release.wait(10)  # a bus that ignores its timeout
        return 0, TimeoutError()

    outbox = Outbox(deliver, memory_bytes=1 << 20).start()
    outbox.put(_msg(1), 4)
    time.sleep(0.05)
    started = time.monotonic()
    summary = outbox.close(0.3)
    release.set()
    assert time.monotonic() - started < 1.0 and summary.records_unsent == 4


@pytest.mark.parametrize("text, size", [("4096", 4096), ("4KiB", 4096), ("1.5MB", 1_500_000),
                                        ("1GiB", 1 << 30)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_a_bad_size_is_refused():
    with pytest.raises(ValueError, match="not a size"):
        parse_size("12 parsecs")
