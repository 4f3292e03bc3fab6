"""The local broker counts as up only once something listens on its port, not when a connect lands
on itself (a port from the ephemeral range can be picked as the connect's own source)."""

from __future__ import annotations

import socket

from foreshock.ingest import kafka_local
from foreshock.ingest.kafka_local import free_port


def test_a_listening_port_accepts_and_a_closed_one_does_not():
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert kafka_local._accepts(server.getsockname()[1])
    assert not kafka_local._accepts(free_port())


def test_a_connect_that_landed_on_itself_is_no_broker(monkeypatch):
    port = free_port()

    def self_connected(address, timeout):
        sock = socket.socket()
        sock.bind(address)
        sock.connect(address)  # TCP simultaneous open with itself: connected, and nothing listens
        return sock

    monkeypatch.setattr(kafka_local.socket, "create_connection", self_connected)
    assert not kafka_local._accepts(port)
