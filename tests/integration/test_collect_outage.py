"""``foreshock collect --source dcgm --kafka`` through a real broker outage: stop the broker, start it
again on the same port and log dir, SIGTERM the collector soon after.

The module runs a broker of its own (not the shared ``kafka_bootstrap`` one), so stopping it
disturbs no other test. The dcgm source scrapes a real exporter capture served over HTTP.

What at-least-once allows here: a poll whose batch the broker wrote just before it stopped, but
whose acknowledgement was lost, is sent again; so a sample may appear twice, and only one sent
while the broker was going down. Nothing else may repeat, nothing may be missing, and the first
copies are in poll order.
"""

from __future__ import annotations

import http.server
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from foreshock.ingest.contract import Topic
from foreshock.ingest.kafka_bus import KafkaBus, ensure_topics
from foreshock.ingest.kafka_local import LocalKafka
from foreshock.ingest.stream import RecordStream, now_ms

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SCRAPE = (Path(__file__).parents[1] / "data" / "collectors" / "dcgm" / "cncf-upcloud-L40S.prom").read_bytes()
SUMMARY = re.compile(r"(\d+) records collected, (\d+) delivered, (\d+) dropped by a full buffer "
                     r"\((\d+) polls\), (\d+) (?:unsent at exit|left in the spool)")
"""The collector's exit line; the last number is what it could not deliver (lost, or kept in the spool)."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka-outage"), quick_start=True).start()
    try:
        ensure_topics(kafka.bootstrap, [Topic.GPU], partitions=8)
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture
def up(broker: LocalKafka) -> LocalKafka:
    """The module's broker, started again if an earlier test left it down."""
    if broker.process is None or broker.process.poll() is not None:
        broker.start()
    return broker


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """A dcgm-exporter stand-in: a real capture served on ``/metrics``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(SCRAPE)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()


@contextmanager
def _collector(bootstrap: str, url: str, node: str, *args: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "foreshock", "collect", "--source", "dcgm", "--url", url,
                             "--node", node, "--kafka", bootstrap, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _samples(bootstrap: str, group: str, node: str, at_least: int, timeout_s: float) -> list:
    """``node``'s GPU samples in log order, read from the start by a fresh group."""
    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(group, [Topic.GPU]))
    seen: list = []
    try:
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            got = [r for d in stream.poll(timeout_s=0.5) for r in d.records if r.node == node]
            seen.extend(got)
            if len(seen) >= at_least:
                quiet_until = quiet_until or time.monotonic() + 2.0  # then read on a little, for duplicates
                if time.monotonic() >= quiet_until:
                    break
        assert stream.dead_letters == 0
    finally:
        stream.close()
        bus.close()
    return seen


def _stop(proc: subprocess.Popen) -> tuple[int, str, float]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode(errors="replace"), time.monotonic() - started


def _outage(broker: LocalKafka, seconds: float) -> tuple[int, int]:
    """Stop the broker, keep it down ``seconds``, start it again; (down, up) in epoch ms."""
    down = now_ms()
    broker.stop()  # SIGTERM, waits for the JVM to exit; the log dir is kept (the fixture made it)
    time.sleep(max(0.0, seconds - (now_ms() - down) / 1000))
    broker.start()
    return down, now_ms()


def _wait_for_one_after(proc: subprocess.Popen, bootstrap: str, node: str, group: str, ts_ms: int,
                        timeout_s: float = 120) -> None:
    """Until ``node`` has a sample stamped at or after ``ts_ms`` in the topic: the collector got
    through to a broker that was started again (slow to take writes, and a new consumer group slow
    to join, on a loaded machine). On a timeout the failure carries the collector's log."""
    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(group, [Topic.GPU]))
    try:
        deadline = time.monotonic() + timeout_s
        while not any(r.node == node and r.ts >= ts_ms
                      for d in stream.poll(timeout_s=0.5) for r in d.records):
            if time.monotonic() >= deadline:
                _, err, _ = _stop(proc)
                pytest.fail(f"the collector delivered nothing after the broker came back:\n{err[-4000:]}")
    finally:
        stream.close()
        bus.close()


def _wait_for_first(bootstrap: str, node: str, group: str) -> None:
    assert _samples(bootstrap, group, node, 2, 60), "the collector published nothing before the outage"


def test_an_outage_leaves_no_hole_and_sigterm_delivers_the_backlog(up, exporter, group_id):
    interval_ms, node = 500, f"outage-{group_id}"
    with _collector(up.bootstrap, exporter, node, "--interval", f"{interval_ms}ms",
                    "--flush-timeout", "10s") as proc:
        _wait_for_first(up.bootstrap, node, group_id + "-first")
        down, back = _outage(up, 12)
        time.sleep(0.5)  # SIGTERM as soon as the broker is back: the backlog goes out in the final flush
        sigterm = now_ms()
        rc, err, flush_s = _stop(proc)
    assert rc == 0, err
    collected, delivered, dropped, dropped_polls, unsent = map(int, SUMMARY.search(err).groups())
    assert dropped == dropped_polls == 0 and unsent == 0 and delivered == collected, err
    assert flush_s < 10 + 3, err  # --flush-timeout, plus closing the producer and the interpreter

    seen = _samples(up.bootstrap, group_id, node, collected, 60)
    stamps = [s.ts for s in seen]
    counts = Counter(stamps)
    distinct = sorted(counts)
    assert len(distinct) == collected, "a poll the collector counted as delivered is not in the topic"
    assert list(dict.fromkeys(stamps)) == distinct, "the backlog was not sent in poll order"
    repeated = [ts for ts, n in counts.items() if n > 1]
    assert all(counts[ts] == 2 for ts in repeated) and len(repeated) <= 4, repeated
    assert all(down - 2 * interval_ms <= ts <= down + 10_000 for ts in repeated), (down, repeated)

    gaps = [b - a for a, b in zip(distinct, distinct[1:], strict=False)]
    during = [ts for ts in distinct if down <= ts <= back]
    assert distinct[0] < down and distinct[-1] >= sigterm - 2 * interval_ms
    assert max(gaps) <= 2 * interval_ms, f"a hole of {max(gaps)} ms"
    assert len(during) >= (back - down) / interval_ms - 2
    print(f"\noutage {(back - down) / 1000:.1f} s; largest gap between samples {max(gaps)} ms; "
          f"{len(during)} polls taken during the outage delivered, {collected} in all; "
          f"{len(repeated)} sent twice; SIGTERM to exit {flush_s:.2f} s")


def test_a_tiny_buffer_drops_the_oldest_counts_and_reports_them(up, exporter, group_id):
    interval_ms, node = 250, f"tiny-{group_id}"
    with _collector(up.bootstrap, exporter, node, "--interval", f"{interval_ms}ms", "--buffer", "2KiB",
                    "--flush-timeout", "5s") as proc:
        _wait_for_first(up.bootstrap, node, group_id + "-first")
        down, back = _outage(up, 6)
        _wait_for_one_after(proc, up.bootstrap, node, group_id + "-back", back)
        rc, err, flush_s = _stop(proc)
    assert rc == 0, err
    collected, delivered, dropped, dropped_polls, unsent = map(int, SUMMARY.search(err).groups())
    during = (back - down) / interval_ms
    assert dropped_polls >= during - 6 and dropped == dropped_polls, err  # one record per poll
    assert collected == delivered + dropped + unsent, err
    assert "outbox full" in err and "dropping the oldest polls" in err

    seen = _samples(up.bootstrap, group_id, node, delivered, 60)
    distinct = sorted({s.ts for s in seen})
    assert len(distinct) == delivered
    # the buffer (two polls, and one in flight) lost polls of the outage only, none after it
    holes = [(a, b) for a, b in zip(distinct, distinct[1:], strict=False) if b - a > 2 * interval_ms]
    assert holes and all(down - interval_ms <= a and b <= back + 5_000 for a, b in holes), (down, back, holes)
    assert len([ts for ts in distinct if down + interval_ms < ts < back]) <= 6
    print(f"\noutage {(back - down) / 1000:.1f} s with a 2 KiB buffer: {dropped} of {collected} records "
          f"dropped and reported; holes {[b - a for a, b in holes]} ms")


def test_sigterm_during_an_outage_keeps_its_bound_and_the_spool_carries_the_backlog(up, exporter, group_id,
                                                                                    tmp_path):
    interval_ms, node, spool = 500, f"spool-{group_id}", tmp_path / "spool"
    args = ("--interval", f"{interval_ms}ms", "--buffer", "4KiB", "--spool-dir", str(spool))
    with _collector(up.bootstrap, exporter, node, *args, "--flush-timeout", "3s") as proc:
        _wait_for_first(up.bootstrap, node, group_id + "-first")
        up.stop()
        time.sleep(5)  # ten polls: memory holds about five, the spool the rest
        rc, err, flush_s = _stop(proc)
    assert rc == 0, err
    first, delivered, dropped, _, spooled = map(int, SUMMARY.search(err).groups())
    assert flush_s < 3 + 2, err  # --flush-timeout, and no wait for the dead broker beyond it
    assert dropped == 0 and spooled >= 8 and delivered + spooled == first and "left in the spool" in err, err
    assert list(spool.glob("*.spool"))

    up.start()
    with _collector(up.bootstrap, exporter, node, *args, "--flush-timeout", "10s") as proc:
        time.sleep(4)
        rc, err, _ = _stop(proc)
    assert rc == 0, err
    second, delivered, dropped, _, left = map(int, SUMMARY.search(err).groups())
    assert (dropped, left) == (0, 0) and delivered == second + spooled, err  # its own polls and the backlog
    seen = _samples(up.bootstrap, group_id, node, first + second, 60)
    stamps = [s.ts for s in seen]
    distinct = sorted(set(stamps))
    assert len(distinct) == first + second, "a spooled poll was lost"
    assert list(dict.fromkeys(stamps)) == distinct, "the spooled backlog did not go first"
    holes = [b - a for a, b in zip(distinct, distinct[1:], strict=False) if b - a > 2 * interval_ms]
    assert len(holes) == 1  # only while no collector ran (between the two processes)
    assert list(spool.glob("*.spool")) == []
    print(f"\nSIGTERM {flush_s:.2f} s into a dead broker; {spooled} records left in the spool, "
          f"delivered first by the next start")
