"""Heartbeats over a real TCPStore: a rank that stops beating, or a store that goes away, is caught."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from foreshock.mitigator.tiers.heartbeat import Heartbeat


def _store() -> tuple[dist.TCPStore, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False), port


def _client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))


def test_a_rank_that_stops_beating_is_declared_lost_within_the_timeout_and_an_ended_one_is_not():
    master, port = _store()
    lost: list[tuple[float, str]] = []
    got = threading.Event()

    def on_lost(reason: str) -> None:
        lost.append((time.monotonic(), reason))
        got.set()

    watcher = Heartbeat(_client(port), 0, 3, interval_s=0.1, timeout_s=0.6, on_lost=on_lost)
    ended = Heartbeat(_client(port), 1, 3, interval_s=0.1, timeout_s=0.6, on_lost=on_lost)
    frozen = Heartbeat(_client(port), 2, 3, interval_s=0.1, timeout_s=0.6, on_lost=on_lost)
    time.sleep(0.5)
    assert not lost  # everyone beating
    ended.close()  # a clean end: not a failure
    frozen._stop.set()  # a hung node: its thread stops beating, it says nothing
    stopped = time.monotonic()
    assert got.wait(5)
    at, reason = lost[0]
    assert "rank 2 missed its heartbeats" in reason
    assert 0.6 - 0.1 <= at - stopped < 3.0  # its last beat may have come up to one interval earlier
    watcher.close()
    del master


def test_a_store_that_stops_answering_counts_as_a_lost_node():
    master, port = _store()
    lost: list[str] = []
    got = threading.Event()
    beat = Heartbeat(_client(port), 0, 2, interval_s=0.1, timeout_s=0.5,
                     on_lost=lambda r: (lost.append(r), got.set()))
    time.sleep(0.3)
    del master  # the node hosting the store is gone
    assert got.wait(15) and "store stopped answering" in lost[0]
    beat.close()
