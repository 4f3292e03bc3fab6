"""One node, one partition, whoever produces: Foreshock's producer and a foreign one (kcat, librdkafka)
configured as the contract says (murmur2 over the node id, Java's default) put a node's records on
the same partition. kcat's own default partitioner does not, which is why the contract names one.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from foreshock.ingest.kafka_bus import KafkaBus, ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by `make services`")]

NODES = [f"node{i:04d}" for i in range(1, 65)]


def _kcat_produce(bootstrap: str, topic: str, lines: list[str], *options: str) -> None:
    subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K:", *options],
                   input="\n".join(lines).encode() + b"\n", check=True, timeout=60, capture_output=True)


def _partitions(bootstrap: str, topic: str, expected: int) -> dict[str, dict[str, int]]:
    """Per producer tag (the value), each key's partition, read back with kcat."""
    out = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-e", "-q", "-f", "%k\t%p\t%s\n"],
                         check=True, timeout=60, capture_output=True).stdout.decode().splitlines()
    assert len(out) == expected, out[:5]
    placed: dict[str, dict[str, int]] = {}
    for line in out:
        key, partition, tag = line.split("\t")
        placed.setdefault(tag, {})[key] = int(partition)
    return placed


def test_kcat_with_murmur2_puts_each_node_on_foreshocks_partition(kafka_bootstrap):
    topic = f"partitioning-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=8)
    bus = KafkaBus(kafka_bootstrap)
    try:
        for node in NODES:
            bus.send(topic, node, b"foreshock")
        bus.flush()
    finally:
        bus.close()
    murmur2 = "murmur2_random"  # librdkafka's name for Java's murmur2 (random only for keyless records)
    for tag, options in (("murmur2", ["-X", "topic.partitioner=" + murmur2]),
                         ("murmur2-short", ["-X", "partitioner=" + murmur2]), ("kcat-default", [])):
        _kcat_produce(kafka_bootstrap, topic, [f"{n}:{tag}" for n in NODES], *options)
    placed = _partitions(kafka_bootstrap, topic, 4 * len(NODES))

    assert placed["murmur2"] == placed["foreshock"]
    assert placed["murmur2-short"] == placed["foreshock"]  # `-X partitioner=` is the same property
    assert len(set(placed["foreshock"].values())) == 8  # 64 nodes spread over every partition
    moved = [n for n in NODES if placed["kcat-default"][n] != placed["foreshock"][n]]
    assert moved, "librdkafka's default partitioner (CRC32) happened to agree; the contract names murmur2"
