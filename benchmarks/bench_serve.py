"""The risk service under load: ingestion, API latency and end-to-end delay, on a real broker.

    .venv/bin/python benchmarks/bench_serve.py [--nodes 2048] [--seconds 30] [--quick]

This process runs the service (consumer loop + HTTP API) as ``foreshock serve`` does. Two other
processes (this file with ``--role``) make the load, both bounded in count and time: one
publishes GPU scrapes of ``--nodes`` nodes (8 GPUs each), paced evenly at ``--samples-per-s``
and each stamped when sent (event time = wall time), the other calls the API at ``--rps``
requests/s. Scoring runs every ``--score-every`` of event time over every node.

Figures, each with a baseline measured in the same run:
- GPU samples/s ingested by the service, against a decode-only consumer draining the same topic;
- API latency p50/p99 of ``/v1/nodes/{node}`` and ``/v1/nodes``, against ``/healthz``;
- end-to-end delay: telemetry record -> the risk record it changes (publication time of the
  risk record minus the boundary it is for, plus the scoring period for a record that arrived
  just after the previous boundary), against the bus's own publish->consume delay.
Targets: >= 50,000 GPU samples/s, p99 < 20 ms, end-to-end < 2 s + the scoring period.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from foreshock.ingest.contract import GpuSample, Topic, encode  # noqa: E402
from foreshock.ingest.stream import now_ms  # noqa: E402

GPUS = 8
_TS = 1_111_111_111_111  # placeholder time stamp in the pre-encoded scrapes


def _template(node: int) -> bytes:
    return encode([GpuSample(node=f"node{node:04d}", ts=_TS, gpu=g, gpu_temp=55.0 + g, memory_temp=60.0,
                             power_usage=640.5, sm_clock=1980.0, gpu_util=97.0, fb_used=70_123.0,
                             ecc_sbe_vol_total=3, ecc_dbe_vol_total=0, pcie_replay_counter=0,
                             nvlink_crc_flit_error_count_total=0, xid_errors=0) for g in range(GPUS)])


def role_telemetry(bootstrap: str, nodes: int, seconds: float, per_s: float) -> None:
    """Publish scrapes round-robin over the nodes, paced evenly and each stamped when sent, as
    nodes that scrape on their own timers would; bounded by time and count."""
    from foreshock.ingest.kafka_bus import KafkaBus

    bus = KafkaBus(bootstrap, client_id="bench-telemetry")
    templates = [(f"node{n:04d}", _template(n)) for n in range(nodes)]
    stamp = str(_TS).encode()
    sent, t0 = 0, time.monotonic()
    limit = int(per_s * seconds / GPUS)
    while time.monotonic() - t0 < seconds and sent < limit:
        key, body = templates[sent % nodes]
        bus.send(Topic.GPU, key, body.replace(stamp, str(now_ms()).encode()))
        sent += 1
        if sent % 64 == 0:  # pace in small steps: a whole round sent at once would stamp it all alike
            ahead = sent * GPUS / per_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    bus.flush()
    bus.close()
    print(json.dumps({"messages": sent, "samples": sent * GPUS, "seconds": time.monotonic() - t0}))


def role_api(url: str, rps: float, seconds: float, nodes: int) -> None:
    """Open-loop GETs paced at ``rps`` for ``seconds`` from a pool of keep-alive connections;
    prints the latencies (seconds) per kind. Bounded: every call times out after 5 s."""
    import http.client
    import itertools
    from urllib.parse import urlparse

    target = urlparse(url)
    paths = [("node", lambda i: f"/v1/nodes/node{i % nodes:04d}"), ("list", lambda i: "/v1/nodes?limit=20"),
             ("healthz", lambda i: "/healthz")]
    out: dict[str, list[float]] = {"node": [], "list": [], "healthz": []}
    slots, lock, t0 = itertools.count(), threading.Lock(), time.perf_counter()
    lost = [0]

    def worker() -> None:
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
        while True:
            with lock:
                i = next(slots)
            due = t0 + i / rps
            if due - t0 > seconds:
                return
            time.sleep(max(0.0, due - time.perf_counter()))
            kind, path = paths[i % 3]
            start = time.perf_counter()
            try:
                conn.request("GET", path(i))
                conn.getresponse().read()
                out[kind].append(time.perf_counter() - start)
            except OSError:
                lost[0] += 1
                conn.close()
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=5)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    sent = sum(len(v) for v in out.values()) + lost[0]
    print(json.dumps({**out, "lost": [float(lost[0])], "sent_per_s": [sent / (time.perf_counter() - t0)]}))


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _train_model(tmp: Path) -> Path:
    from foreshock.commands.simulate import profile_path
    from foreshock.ingest.simulator import Simulator, load_profile, write_dataset
    from foreshock.models.train import train_from_dataset

    sim = Simulator(load_profile(profile_path("llama3")), nodes=12, duration_ms=86_400_000,
                    interval_ms=60_000, seed=1, rate_multiplier=300)
    train_from_dataset(write_dataset(sim, tmp / "ds"), tmp / "train", register=False)
    return tmp / "train" / "model"


def _decode_only_rate(bootstrap: str, seconds: float) -> float:
    """Baseline: GPU samples/s a consumer that only decodes (no features, no model) drains."""
    from foreshock.ingest.kafka_bus import KafkaBus
    from foreshock.ingest.stream import RecordStream

    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(f"bench-decode-{uuid.uuid4().hex[:6]}", [Topic.GPU]))
    t0, first = time.monotonic(), None
    while time.monotonic() - t0 < seconds:
        got = stream.poll(0.5)
        if got and first is None:
            first, base = time.monotonic(), stream.records
    rate = (stream.records - base) / (time.monotonic() - first) if first else float("nan")
    stream.close()
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["telemetry", "api"], help=argparse.SUPPRESS)
    ap.add_argument("--kafka", help="use this broker (fresh topics expected) instead of starting one")
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="a model folder (default: train a small one first)")
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    ap.add_argument("--samples-per-s", type=float, default=80_000.0, help="offered GPU samples/s (cap)")
    ap.add_argument("--rps", type=float, default=500.0)
    ap.add_argument("--score-every", type=float, default=10.0, help="seconds of event time")
    ap.add_argument("--quick", action="store_true", help="smoke run: 256 nodes, 8 s, 100 req/s, 2 s period")
    args = ap.parse_args()
    if args.role == "telemetry":
        role_telemetry(args.kafka, args.nodes, args.seconds, args.samples_per_s)
        return 0
    if args.role == "api":
        role_api(args.url, args.rps, args.seconds, args.nodes)
        return 0
    if args.quick:
        args.nodes, args.seconds, args.rps, args.score_every = 256, 8.0, 100.0, 2.0
    return run(args)


def _consumed(url: str) -> float:
    """The service's GPU records consumed so far, read from its /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=60).text
    for line in text.splitlines():
        if line.startswith("foreshock_predictor_records_consumed_total") and Topic.GPU in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("foreshock serve exited")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("foreshock serve did not become ready")


def run(args: argparse.Namespace) -> int:
    """The service is a ``foreshock serve`` process; this process only orchestrates and watches."""
    from foreshock.ingest.kafka_bus import ensure_topics
    from foreshock.ingest.kafka_local import LocalKafka, free_port

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    broker = None if args.kafka else LocalKafka(data_dir=tmp / "kafka").start()
    bootstrap = args.kafka or broker.bootstrap
    procs: list[subprocess.Popen] = []
    stop = threading.Event()
    try:
        ensure_topics(bootstrap)
        model = Path(args.model) if args.model else _train_model(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = subprocess.Popen(
            [sys.executable, "-m", "foreshock", "serve", "--kafka", bootstrap, "--model", str(model),
             "--port", str(port), "--score-every", f"{args.score_every:g}s", "--group",
             f"bench-{uuid.uuid4().hex[:6]}", "--checkpoint-dir", str(tmp / "ckpt"),
             "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=(tmp / "serve.log").open("wb"))
        procs.append(serve)
        _wait_ready(url, serve)
        delays, hops = _watch_risk(bootstrap, stop)
        warm = 2.5 * args.score_every
        me = [sys.executable, __file__]
        load = subprocess.Popen(
            [*me, "--role", "telemetry", "--kafka", bootstrap, "--nodes", str(args.nodes),
             "--seconds", str(warm + args.seconds), "--samples-per-s", str(args.samples_per_s)],
            stdout=subprocess.PIPE, text=True)
        procs.append(load)
        time.sleep(warm)  # first boundaries scored, every node known
        cpu = psutil.Process(serve.pid)
        c0, t0, window_start_ms, cpu0 = _consumed(url), time.monotonic(), now_ms(), _cpu_seconds(cpu)
        caller = subprocess.Popen(
            [*me, "--role", "api", "--url", url, "--rps", str(args.rps), "--seconds", str(args.seconds),
             "--nodes", str(args.nodes)], stdout=subprocess.PIPE, text=True)
        procs.append(caller)
        api = json.loads(caller.communicate(timeout=args.seconds + 60)[0])
        c1, t1, cpu1 = _consumed(url), time.monotonic(), _cpu_seconds(cpu)
        offered = json.loads(load.communicate(timeout=120)[0])
        time.sleep(min(3.0, args.score_every))  # the last boundary's records reach the watcher
        stop.set()
        serve.terminate()
        serve.wait(60)
        ingest = (c1 - c0) / (t1 - t0)
        share = (cpu1 - cpu0) / (t1 - t0)  # cores the service process got (all its threads)
        baseline = _decode_only_rate(bootstrap, 5.0)
        _report(args, ingest, share, offered, baseline, api, [d for d in delays if d[0] >= window_start_ms],
                hops)
        return 0
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # about 1 GB of broker log and checkpoints per run


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _report(args, ingest: float, share: float, offered: dict, baseline: float, api: dict, window: list,
            hops: list) -> None:
    per_boundary: dict[int, int] = {}
    for t, n, _ in window:
        per_boundary[t] = per_boundary.get(t, 0) + n
    e2e = [d for _, _, d in window]
    period_s = args.score_every
    print(f"risk service (foreshock serve), {psutil.cpu_count()} cores shared with the broker and the load: "
          f"{args.nodes} nodes x {GPUS} GPUs, scoring every {period_s:g} s of event time, "
          f"window {args.seconds:g} s")
    rate = offered["samples"] / offered["seconds"]
    print(f"ingest      {ingest:>10,.0f} GPU samples/s  (offered {rate:,.0f}/s)"
          f"   target >= 50,000: {'met' if ingest >= 50_000 else 'NOT met'}")
    print(f"  per core  {ingest / share:>10,.0f} GPU samples per CPU-second of the service process, "
          f"which got {share:.2f} of the {psutil.cpu_count()} cores (the broker and the load share them)")
    print(f"  baseline  {baseline:>10,.0f} GPU samples/s decode-only consumer; ratio {ingest / baseline:.2f}")
    print(f"scoring     {len(per_boundary)} boundaries in the window; nodes per boundary "
          f"{sorted(set(per_boundary.values()))}")
    print(f"API load    {api['sent_per_s'][0]:.0f} requests/s sent (asked {args.rps:g}), "
          f"{api['lost'][0]:.0f} failed or timed out")
    health = api["healthz"]
    for kind in ("node", "list"):
        lat = api[kind]
        print(f"API {kind:<7} p50 {_pct(lat, 50) * 1e3:8.2f} ms  p99 {_pct(lat, 99) * 1e3:8.2f} ms  "
              f"({len(lat)} requests); p99 ratio to /healthz {_pct(lat, 99) / _pct(health, 99):.2f}   "
              f"target p99 < 20 ms: {'met' if _pct(lat, 99) < 0.020 else 'NOT met'}")
    print(f"  baseline  /healthz p50 {_pct(health, 50) * 1e3:8.2f} ms  p99 {_pct(health, 99) * 1e3:8.2f} ms")
    worst = _pct(e2e, 99) + period_s
    print(f"end-to-end  boundary -> risk record p50 {_pct(e2e, 50):.2f} s, p99 {_pct(e2e, 99):.2f} s; "
          f"record -> risk record at worst (p99 + period) {worst:.2f} s   target < {2 + period_s:g} s: "
          f"{'met' if worst < 2 + period_s else 'NOT met'}")
    print(f"  baseline  bus publish -> consume p50 {_pct(hops, 50):.3f} s, p99 {_pct(hops, 99):.3f} s; "
          f"ratio of p99s {_pct(e2e, 99) / max(_pct(hops, 99), 1e-3):.1f}")


def _watch_risk(bootstrap: str, stop: threading.Event) -> tuple[list, list]:
    """Consume risk.scores in a thread: (boundary, nodes, publication - boundary seconds), bus hops."""
    from kafka import KafkaConsumer

    delays: list[tuple[int, int, float]] = []
    hops: list[float] = []

    def run() -> None:
        consumer = KafkaConsumer(Topic.RISK, bootstrap_servers=bootstrap, auto_offset_reset="latest",
                                 group_id=f"bench-risk-{uuid.uuid4().hex}", enable_auto_commit=False)
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=200).values():
                for m in records:
                    rows = json.loads(m.value)
                    rows = rows if isinstance(rows, list) else [rows]
                    for row in rows:
                        delays.append((row["ts"], 1, (m.timestamp - row["ts"]) / 1000))
                    hops.append((now_ms() - m.timestamp) / 1000)
        consumer.close()

    threading.Thread(target=run, daemon=True).start()
    return delays, hops


if __name__ == "__main__":
    sys.exit(main())
