"""GPU samples/s through the project's bus on a real broker, against Kafka's own producer tool.

    .venv/bin/python benchmarks/bench_bus.py [--samples 800000] [--quick]

Starts a local broker (or uses FORESHOCK_KAFKA_BOOTSTRAP), publishes GPU samples the way a
collector does (one message per node scrape of 8 GPUs, JSON, lz4, acks=all), consumes them
back through a consumer group with validation, then runs
``org.apache.kafka.tools.ProducerPerformance`` from the same jars with the same record size and
producer settings. Prints both rates and the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from foreshock.ingest.contract import GpuSample, Topic, encode  # noqa: E402
from foreshock.ingest.kafka_bus import KafkaBus, ensure_topics  # noqa: E402
from foreshock.ingest.kafka_local import LocalKafka, fetch_jars  # noqa: E402
from foreshock.ingest.stream import RecordStream, publish  # noqa: E402

GPUS = 8


def scrape(node: int, step: int) -> list[GpuSample]:
    """One node's 8 GPUs at one instant, with the fields a dcgm-exporter scrape fills."""
    ts = 1_760_000_000_000 + step * 30_000
    return [
        GpuSample(node=f"node{node:04d}", ts=ts, gpu=g, gpu_temp=55.0 + g, memory_temp=60.0,
                  power_usage=640.5,
                  sm_clock=1980.0, mem_clock=2619.0, gpu_util=97.0, mem_copy_util=41.0, fb_used=70_123.0,
                  ecc_sbe_vol_total=3, ecc_dbe_vol_total=0, pcie_replay_counter=0,
                  nvlink_crc_flit_error_count_total=0, xid_errors=0)
        for g in range(GPUS)
    ]


def bench_produce(bus: KafkaBus, samples: int, nodes: int) -> tuple[float, float, int]:
    """(wall seconds, process CPU seconds, mean message bytes) to publish and flush ``samples``."""
    steps = samples // (nodes * GPUS)
    batches = [scrape(n, 0) for n in range(nodes)]  # encode cost is paid per send below
    size = sum(len(encode(b)) for b in batches) // nodes
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(steps):
        for n in range(nodes):
            publish(bus, scrape(n, step))
    bus.flush()
    return time.perf_counter() - t0, time.process_time() - c0, size


def bench_consume(bus: KafkaBus, expected: int) -> float:
    stream = RecordStream(bus, bus.consumer(f"bench-{uuid.uuid4().hex[:6]}", [Topic.GPU]))
    got, t0 = 0, time.perf_counter()
    deadline = t0 + 300
    while got < expected and time.perf_counter() < deadline:
        decoded = stream.poll(timeout_s=1.0, max_records=5_000)
        got += sum(len(d.records) for d in decoded)
        stream.commit(decoded)
    elapsed = time.perf_counter() - t0
    stream.close()
    if got < expected:
        raise RuntimeError(f"consumed {got} of {expected}")
    return elapsed


def bench_java(bootstrap: str, records: int, size: int) -> float:
    out = subprocess.run(
        ["java", "-Xmx1g", "-cp", str(fetch_jars() / "*"), "org.apache.kafka.tools.ProducerPerformance",
         "--topic", "bench.java", "--num-records", str(records), "--record-size", str(size),
         "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
         "linger.ms=20", "batch.size=1048576", "compression.type=lz4"],
        capture_output=True, text=True, check=True,
    ).stdout
    final = [line for line in out.splitlines() if "records sent" in line][-1]
    return float(re.search(r"([\d.]+) records/sec", final).group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=800_000)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="smoke run with 80,000 samples")
    args = parser.parse_args()
    samples = 81_920 if args.quick else args.samples
    external = os.environ.get("FORESHOCK_KAFKA_BOOTSTRAP")
    broker = None if external else LocalKafka(heap_mb=1024).start()
    bootstrap = external or broker.bootstrap
    try:
        ensure_topics(bootstrap)
        bus = KafkaBus(bootstrap)
        publish(bus, scrape(0, 0))  # connect and fetch metadata outside the timed part
        bus.flush()
        wall, cpu, size = bench_produce(bus, samples, args.nodes)
        sent = (samples // (args.nodes * GPUS)) * args.nodes * GPUS
        consume = bench_consume(bus, sent + GPUS)
        bus.close()
        messages = sent // GPUS
        java_rate = bench_java(bootstrap, messages, size)
    finally:
        if broker:
            broker.stop()
    ours_msgs = messages / wall
    print(f"message size: {size} bytes (one node scrape of {GPUS} GPU samples, JSON)")
    print(f"foreshock producer : {sent / wall:12,.0f} GPU samples/s  {ours_msgs:10,.0f} messages/s  "
          f"({sent / cpu:,.0f} samples per CPU-second of this process)")
    print(f"foreshock consumer : {sent / consume:12,.0f} GPU samples/s (decoded and validated)")
    print(f"Java ProducerPerformance: {java_rate:10,.0f} records/s of {size} bytes "
          f"(= {java_rate * GPUS:,.0f} GPU samples/s at {GPUS} per record)")
    print(f"ratio foreshock/java (records/s): {ours_msgs / java_rate:.2f}")


if __name__ == "__main__":
    main()
