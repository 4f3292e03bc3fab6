"""What one local Kafka broker costs to start: wall time and CPU-seconds, against the plain JVM.

    .venv/bin/python benchmarks/bench_kafka_start.py [--repeats 3] [--quick]

Each start runs in a fresh child process: ``LocalKafka(...).start()``, the project's topics
created, ``stop()``. The CPU-seconds are those of the JVMs it ran (the storage format tool and
the broker), from the child's ``RUSAGE_CHILDREN``. Three settings, measured in turns:

- ``plain``: no class archive, full JIT compiler (``class_sharing=False``): the baseline;
- ``archive``: the broker's classes mapped from the class-data-sharing archive in the jar cache
  (the default; the first clean stop writes it, so a warm-up start runs first when it is missing);
- ``archive + quick_start``: the same, compiled with the client compiler only (the tests' brokers).

Prints the median of each and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from foreshock.ingest.kafka_local import class_archive, fetch_jars  # noqa: E402

SETTINGS = {
    "plain": {"class_sharing": False},
    "archive": {},
    "archive + quick_start": {"quick_start": True},
}

_CHILD = """
import json, resource, sys, time
from foreshock.ingest.contract import Topic
from foreshock.ingest.kafka_bus import ensure_topics
from foreshock.ingest.kafka_local import LocalKafka
start = time.perf_counter()
broker = LocalKafka(**json.loads(sys.argv[1])).start()
up = time.perf_counter() - start
ensure_topics(broker.bootstrap, Topic.ALL, partitions=8)
broker.stop()
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"start_s": up, "cpu_s": used.ru_utime + used.ru_stime}))
"""


def one_start(kwargs: dict) -> dict[str, float]:
    """One broker's start, topics and stop in a fresh process: its start time and CPU-seconds."""
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kwargs)], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one start per setting")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    if not class_archive(fetch_jars()).exists():
        one_start({})  # its clean stop writes the archive
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for name, kwargs in SETTINGS.items():
            runs[name].append(one_start(kwargs))
    base = {k: statistics.median(r[k] for r in runs["plain"]) for k in ("start_s", "cpu_s")}
    print(f"{'setting':<24}{'start (s)':>10}{'CPU-s':>8}{'start / plain':>15}{'CPU / plain':>13}")
    for name, got in runs.items():
        start = statistics.median(r["start_s"] for r in got)
        cpu = statistics.median(r["cpu_s"] for r in got)
        ratios = f"{start / base['start_s']:>15.2f}{cpu / base['cpu_s']:>13.2f}"
        print(f"{name:<24}{start:>10.2f}{cpu:>8.2f}{ratios}")


if __name__ == "__main__":
    main()
