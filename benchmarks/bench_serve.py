"""The risk service under load: ingestion cost, API latency and end-to-end delay, on a real broker.

    .venv/bin/python benchmarks/bench_serve.py [--nodes 2048] [--seconds 30] [--processes 2]
                                               [--scrape FILE] [--profile] [--out DIR] [--quick]

This process runs ``--processes`` ``foreshock serve`` processes (one consumer group, topics of
``--partitions`` partitions) and only orchestrates and watches. Other processes (this file with
``--role``) make the load, bounded in count and time: one publishes GPU scrapes of ``--nodes``
nodes (8 GPUs each, each GPU's record what the dcgm collector makes of a real exposition,
``--scrape``), paced evenly at ``--samples-per-s`` and each stamped when sent (event
time = wall time), another calls the first service's API at ``--rps`` requests/s. Scoring runs
every ``--score-every`` of event time over every node.

Figures, each with a baseline measured in the same run:
- GPU samples per CPU-second of the service processes (every thread: loop, API, Kafka client),
  against a decode-only consumer (its own process, the same :class:`RecordStream`) draining the
  same topic after the services stop; with two processes, each one's share of the partitions,
  the records and the CPU;
- API latency p50/p99 of ``/v1/nodes/{node}`` and ``/v1/nodes``, against ``/healthz``;
- end-to-end delay: the publication time of a boundary's risk records minus the boundary (a
  record that arrived just after the previous boundary waits one scoring period more), against
  the bus's own publish -> consume delay;
- resident memory of each service, and its checkpoints: bytes on disk, time to write one
  partition, and how long the scoring loop stood still for each.
Targets: ratio >= 0.5; at 50,000 samples/s offered the service keeps up with a boundary's risk
records out < 2 s + the scoring period after it; API p99 < 20 ms at 500 requests/s.

``--profile`` samples the first service with py-spy for the window: the collapsed stacks, an
icicle graph (``serve-profile.html``) and the table of where the time went go to ``--out``.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from foreshock.ingest.collectors.dcgm import parse_exposition  # noqa: E402
from foreshock.ingest.contract import Topic, encode  # noqa: E402
from foreshock.ingest.stream import now_ms  # noqa: E402

GPUS = 8
_TS = 1_111_111_111_111  # placeholder time stamp in the pre-encoded scrapes
_ROOT = Path(__file__).resolve().parents[1]
# A real dcgm-exporter exposition (default counters and profiling series) of one data-centre GPU.
_SCRAPE = _ROOT / "tests" / "data" / "collectors" / "dcgm" / "cncf-upcloud-L40S.prom"


def _templates(nodes: int, scrape: Path) -> list[tuple[str, bytes]]:
    """Each node's message as the dcgm collector publishes it: one scrape of the node's GPUs, each
    GPU's record the one the collector makes of the first GPU of ``scrape``. Decoding then costs
    what real traffic costs, its strings and its series outside the contract included."""
    gpu = parse_exposition(scrape.read_bytes(), node="node", ts=_TS).records[0]
    names = [f"node{n:04d}" for n in range(nodes)]
    return [(name, encode([msgspec.structs.replace(gpu, node=name, gpu=g) for g in range(GPUS)]))
            for name in names]


def role_telemetry(bootstrap: str, nodes: int, seconds: float, per_s: float, scrape: Path) -> None:
    """Publish scrapes round-robin over the nodes, paced evenly and each stamped when sent, as
    nodes that scrape on their own timers would; bounded by time and count."""
    from foreshock.ingest.kafka_bus import KafkaBus

    bus = KafkaBus(bootstrap, client_id="bench-telemetry")
    templates = _templates(nodes, scrape)
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
    print(json.dumps({"messages": sent, "samples": sent * GPUS, "seconds": time.monotonic() - t0,
                      "bytes_per_sample": len(templates[0][1]) / GPUS}))


def role_api(url: str, rps: float, seconds: float, nodes: int) -> None:
    """Open-loop GETs paced at ``rps`` for ``seconds`` from a pool of keep-alive connections;
    prints the latencies (seconds) per kind. Bounded: every call times out after 5 s."""
    import http.client
    import itertools
    from urllib.parse import urlparse

    sys.setswitchinterval(0.0005)  # a thread whose answer came waits less for the other threads
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


def role_decode(bootstrap: str, seconds: float) -> None:
    """The baseline: a consumer that only decodes (no features, no model) drains the GPU topic
    from its start in a new group, until it is empty or ``seconds`` pass; prints the samples and
    the CPU-seconds of this process (every thread) from its first record on."""
    from foreshock.ingest.kafka_bus import KafkaBus
    from foreshock.ingest.stream import RecordStream

    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(f"bench-decode-{uuid.uuid4().hex[:6]}", [Topic.GPU]))
    t0, first, base, cpu0, empty = time.monotonic(), None, 0, 0.0, 0
    while time.monotonic() - t0 < seconds and empty < 3:
        got = stream.poll(0.5, 5_000)
        if got and first is None:
            first, base, cpu0 = time.monotonic(), stream.records, time.process_time()
        empty = 0 if got or first is None else empty + 1
    cpu, wall = time.process_time() - cpu0, time.monotonic() - (first or t0)
    stream.close()
    print(json.dumps({"samples": stream.records - base, "cpu_s": cpu, "wall_s": wall}))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["telemetry", "api", "decode"], help=argparse.SUPPRESS)
    ap.add_argument("--kafka", help="use this broker (fresh topics expected) instead of starting one")
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="a model folder (default: train a small one first)")
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    ap.add_argument("--samples-per-s", type=float, default=50_000.0, help="offered GPU samples/s")
    ap.add_argument("--rps", type=float, default=500.0)
    ap.add_argument("--score-every", type=float, default=10.0, help="seconds of event time")
    ap.add_argument("--scoring-nice", type=int, default=10, help="the services' --scoring-nice")
    ap.add_argument("--processes", type=int, default=1, help="service processes in the consumer group")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of each topic")
    ap.add_argument("--scrape", type=Path, default=_SCRAPE,
                    help="dcgm-exporter exposition whose first GPU every published GPU reports "
                    "(default: a real L40S scrape in tests/data)")
    ap.add_argument("--profile", action="store_true", help="sample the first service with py-spy")
    ap.add_argument("--out", type=Path, help="output folder (default: runs/bench_serve/<UTC time>)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 256 nodes, 8 s, 100 req/s, 2 s period")
    args = ap.parse_args()
    if args.role == "telemetry":
        role_telemetry(args.kafka, args.nodes, args.seconds, args.samples_per_s, args.scrape)
        return 0
    if args.role == "api":
        role_api(args.url, args.rps, args.seconds, args.nodes)
        return 0
    if args.role == "decode":
        role_decode(args.kafka, args.seconds)
        return 0
    if args.quick:
        args.nodes, args.seconds, args.rps, args.score_every = 256, 8.0, 100.0, 2.0
    args.out = args.out or _ROOT / "runs" / "bench_serve" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args)


def _metrics(url: str) -> dict[str, float]:
    """The service's own series from its /metrics (``name{labels}`` -> value), per-node gauges left out."""
    import httpx

    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith("foreshock_predictor_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _consumed(metrics: dict[str, float]) -> float:
    return metrics.get(f'foreshock_predictor_records_consumed_total{{topic="{Topic.GPU}"}}', 0.0)


def _wait(url: str, proc: subprocess.Popen, path: str, timeout: float = 180) -> None:
    """Until ``url + path`` answers 200 (``/readyz``: caught up; ``/healthz``: the loop runs)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("foreshock serve exited")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"foreshock serve did not answer {path}")


@dataclass
class _Service:
    """One ``foreshock serve`` process and what was read of it (:meth:`sample`)."""

    proc: subprocess.Popen
    url: str
    samples: list[dict] = field(default_factory=list)

    def sample(self) -> dict:
        """CPU and memory of the service's processes (the scoring process and its API process)."""
        main = psutil.Process(self.proc.pid)
        procs = [main, *main.children(recursive=True)]
        metrics = _metrics(self.url)
        times = [p.cpu_times() for p in procs]
        cpu = [t.user + t.system for t in times]
        out = {"t": time.monotonic(), "cpu": sum(cpu), "cpu_api": sum(cpu[1:]),
               "cpu_kernel": sum(t.system for t in times), "consumed": _consumed(metrics),
               "rss": sum(p.memory_info().rss for p in procs), "metrics": metrics}
        self.samples.append(out)
        return out


def _start_services(args: argparse.Namespace, bootstrap: str, model: Path, ckpt: Path, tag: str
                    ) -> list[_Service]:
    """``--processes`` services in one new consumer group, sharing the checkpoint folder ``ckpt``."""
    from foreshock.ingest.kafka_local import free_port

    group, services = f"bench-{tag}-{uuid.uuid4().hex[:6]}", []
    for i in range(args.processes):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "foreshock", "serve", "--kafka", bootstrap, "--model", str(model),
             "--port", str(port), "--score-every", f"{args.score_every:g}s", "--group", group,
             "--checkpoint-dir", str(ckpt), "--scoring-nice", str(args.scoring_nice),
             "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=(args.out / f"serve-{tag}-{i}.log").open("wb"))
        services.append(_Service(proc, f"http://127.0.0.1:{port}"))
    return services


def _stop(services: list[_Service]) -> None:
    """SIGTERM: each service checkpoints what it owns and leaves the group."""
    for s in services:
        s.proc.terminate()
    for s in services:
        s.proc.wait(120)


def run(args: argparse.Namespace) -> int:
    """Live phase (offered load, API calls), drain phase (fresh services catch up with everything the
    live phase published), then the decode-only consumer drains the same topic."""
    from foreshock.ingest.kafka_bus import ensure_topics
    from foreshock.ingest.kafka_local import LocalKafka

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    broker = None if args.kafka else LocalKafka(data_dir=tmp / "kafka").start()
    bootstrap = args.kafka or broker.bootstrap
    services: list[_Service] = []
    others: list[subprocess.Popen] = []
    stop = threading.Event()
    me = [sys.executable, __file__]
    try:
        ensure_topics(bootstrap, partitions=args.partitions)
        model = Path(args.model) if args.model else _train_model(tmp)
        live = services = _start_services(args, bootstrap, model, tmp / "ckpt-live", "live")
        for s in live:
            _wait(s.url, s.proc, "/readyz")
        delays, hops = _watch_risk(bootstrap, stop)
        warm = 2.5 * args.score_every
        load = subprocess.Popen(
            [*me, "--role", "telemetry", "--kafka", bootstrap, "--nodes", str(args.nodes),
             "--seconds", str(warm + args.seconds), "--samples-per-s", str(args.samples_per_s),
             "--scrape", str(args.scrape)],
            stdout=subprocess.PIPE, text=True)
        others.append(load)
        time.sleep(warm)  # first boundaries scored, every node known
        window_start_ms = now_ms()
        for s in live:
            s.sample()
        spies = {"live": _start_profile(live[0].proc.pid, args, "live", args.seconds)} if args.profile else {}
        caller = subprocess.Popen(
            [*me, "--role", "api", "--url", live[0].url, "--rps", str(args.rps),
             "--seconds", str(args.seconds), "--nodes", str(args.nodes)], stdout=subprocess.PIPE, text=True)
        others.append(caller)
        api = json.loads(caller.communicate(timeout=args.seconds + 60)[0])
        for s in live:
            s.sample()
        offered = json.loads(load.communicate(timeout=120)[0])
        time.sleep(min(3.0, args.score_every))  # the last boundary's records reach the watcher
        stop.set()
        _stop(live)

        drain = services = _start_services(args, bootstrap, model, tmp / "ckpt", "drain")
        for s in drain:
            _wait(s.url, s.proc, "/healthz")
            s.sample()
        if args.profile:
            spies["drain"] = _start_profile(drain[0].proc.pid, args, "drain", 600)
        _follow_drain(drain, offered["samples"], timeout=600)
        _stop(drain)
        for spy in spies.values():
            spy.wait(60)
        decode = subprocess.run([*me, "--role", "decode", "--kafka", bootstrap, "--seconds", "30"],
                                capture_output=True, text=True, timeout=120, check=True)
        baseline = json.loads(decode.stdout)
        window = [d for d in delays if d[0] >= window_start_ms]
        ckpt = _checkpoint_bytes(tmp / "ckpt")
        lines = _report(args, live, drain, offered, baseline, api, window, hops, ckpt)
        for tag in spies:
            lines += _profile_report(tag, args.out / f"serve-profile-{tag}.txt",
                                     args.out / f"serve-profile-{tag}.html")
        (args.out / "report.txt").write_text("\n".join(lines) + "\n")
        print(f"(report, profile and logs in {args.out})")
        return 0
    finally:
        stop.set()
        for p in [*others, *(s.proc for s in services)]:
            if p.poll() is None:
                p.kill()
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # about 1 GB of broker log and checkpoints per run


def _follow_drain(services: list[_Service], total: int, timeout: float) -> None:
    """Sample the services every second (each sample renders their /metrics, per-node series
    included) until together they have taken ``total`` samples and none took more in the last two
    seconds (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        for s in services:
            s.sample()
        settled = all(len(s.samples) > 2 and s.samples[-1]["consumed"] == s.samples[-3]["consumed"]
                      for s in services)
        if sum(s.samples[-1]["consumed"] for s in services) >= total and settled:
            return


def _drain_span(s: _Service) -> tuple[dict, dict]:
    """The samples around a service's drain: the last before its first record, the first after its last."""
    final = s.samples[-1]["consumed"]
    start = max((x for x in s.samples if x["consumed"] == 0), key=lambda x: x["t"], default=s.samples[0])
    end = next(x for x in s.samples if x["consumed"] == final)
    return start, end


def _checkpoint_bytes(root: Path) -> dict[int, int]:
    """Bytes of each partition's live checkpoint generation (engine + meta) under ``root``."""
    out = {}
    for part in sorted(root.glob("p[0-9]*")):
        current = part / "CURRENT"
        if current.exists():
            gen = part / current.read_text().strip()
            out[int(part.name[1:])] = sum(f.stat().st_size for f in gen.rglob("*") if f.is_file())
    return out


def _histogram(metrics: dict[str, float], name: str) -> tuple[float, float, float]:
    """(count, sum, upper bound of the largest observation) of a Prometheus histogram."""
    count = metrics.get(f"{name}_count", 0.0)
    top = float("nan")
    for key, value in metrics.items():
        if key.startswith(f"{name}_bucket") and value >= count > 0:
            le = float(re.search(r'le="([^"]+)"', key).group(1))
            top = le if np.isnan(top) else min(top, le)
    return count, metrics.get(f"{name}_sum", 0.0), top


def _report(args, live: list[_Service], drain: list[_Service], offered: dict, baseline: dict, api: dict,
            window: list, hops: list, ckpt: dict[int, int]) -> list[str]:
    lines: list[str] = []

    def say(text: str) -> None:
        print(text)
        lines.append(text)

    lag_key, owned_key = "foreshock_predictor_consumer_lag_records", "foreshock_predictor_partitions_owned"
    load = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
    say(f"risk service (foreshock serve) x {args.processes}, {psutil.cpu_count()} cores shared with the "
        f"broker and the load (load average {load}): {args.nodes} nodes x {GPUS} GPUs, {args.partitions} "
        f"partitions, scoring every {args.score_every:g} s of event time; GPU records of "
        f"{offered['bytes_per_sample']:.0f} bytes as the dcgm collector makes them of {args.scrape.name}")

    spans = [_drain_span(s) for s in drain]
    taken = [end["consumed"] - start["consumed"] for start, end in spans]
    cpu = [end["cpu"] - start["cpu"] for start, end in spans]
    wall = max(end["t"] for _, end in spans) - min(start["t"] for start, _ in spans)
    per_cpu, base_per_cpu = sum(taken) / sum(cpu), baseline["samples"] / baseline["cpu_s"]
    ratio = per_cpu / base_per_cpu
    say(f"drain       fresh services catch up with the {sum(taken):,.0f} GPU samples the live phase "
        f"published: {sum(taken) / wall:,.0f} samples/s in {wall:.1f} s")
    say(f"  per CPU-s {per_cpu:>10,.0f} GPU samples per CPU-second of the services (every thread)")
    say(f"  baseline  {base_per_cpu:>10,.0f} GPU samples per CPU-second, decode-only consumer draining the "
        f"same topic ({baseline['samples'] / baseline['wall_s']:,.0f} samples/s)")
    say(f"  ratio     {ratio:10.2f}   target >= 0.5: {'met' if ratio >= 0.5 else 'NOT met'}")
    for i, ((start, end), n, c) in enumerate(zip(spans, taken, cpu, strict=True)):
        owned = end["metrics"].get(owned_key, float("nan"))
        api_cpu, kernel_cpu = (end[k] - start[k] for k in ("cpu_api", "cpu_kernel"))
        say(f"  process {i} {owned:.0f} partitions, {n / sum(taken):.0%} of the samples at "
            f"{n / (end['t'] - start['t']):,.0f}/s, {c:.1f} CPU-s ({api_cpu:.1f} of them its API process's, "
            f"{kernel_cpu:.1f} in the kernel): {n / c:,.0f} samples per CPU-second")

    wall_live = [s.samples[1]["t"] - s.samples[0]["t"] for s in live]
    ingested = [(s.samples[1]["consumed"] - s.samples[0]["consumed"]) / w for s, w in zip(live, wall_live,
                                                                                           strict=True)]
    cpu_live = [(s.samples[1]["cpu"] - s.samples[0]["cpu"]) / w for s, w in zip(live, wall_live, strict=True)]
    rate = offered["samples"] / offered["seconds"]
    behind = max(s.samples[1]["metrics"].get(lag_key, 0) * GPUS for s in live)  # samples, about
    keeps_up = sum(ingested) >= 0.95 * rate and behind < 2 * rate
    say(f"live        {sum(ingested):,.0f} GPU samples/s taken of {rate:,.0f}/s offered over "
        f"{args.seconds:g} s, {sum(cpu_live):.2f} CPU-s/s ({sum(ingested) / sum(cpu_live):,.0f} samples per "
        f"CPU-second, the API's included); keeps up: {'yes' if keeps_up else 'NO'} (>= 95 % taken, lag "
        f"< 2 s of it)")
    for i, (x, c) in enumerate(zip(ingested, cpu_live, strict=True)):
        say(f"  process {i} {x:,.0f} samples/s ({x / sum(ingested):.0%}), {c:.2f} CPU-s/s")
    per_boundary: dict[int, int] = {}
    for t, n, _ in window:
        per_boundary[t] = per_boundary.get(t, 0) + n
    e2e = [d for _, _, d in window]
    period_s = args.score_every
    worst = _pct(e2e, 99) + period_s
    say(f"  scoring   {len(per_boundary)} boundaries in the window; nodes per boundary "
        f"{sorted(set(per_boundary.values()))}")
    say(f"end-to-end  boundary -> risk record p50 {_pct(e2e, 50):.2f} s, p99 {_pct(e2e, 99):.2f} s; "
        f"record -> risk record at worst (p99 + period) {worst:.2f} s   target < {2 + period_s:g} s: "
        f"{'met' if worst < 2 + period_s else 'NOT met'}")
    say(f"  baseline  bus publish -> consume p50 {_pct(hops, 50):.3f} s, p99 {_pct(hops, 99):.3f} s")
    say(f"API load    {api['sent_per_s'][0]:.0f} requests/s sent to process 0 (asked {args.rps:g}), "
        f"{api['lost'][0]:.0f} failed or timed out")
    health = api["healthz"]
    for kind in ("node", "list"):
        lat = api[kind]
        say(f"API {kind:<7} p50 {_pct(lat, 50) * 1e3:8.2f} ms  p99 {_pct(lat, 99) * 1e3:8.2f} ms  "
            f"({len(lat)} requests)   target p99 < 20 ms: {'met' if _pct(lat, 99) < 0.020 else 'NOT met'}")
    say(f"  baseline  /healthz p50 {_pct(health, 50) * 1e3:8.2f} ms  p99 {_pct(health, 99) * 1e3:8.2f} ms")

    for i, (_, end) in enumerate(spans):
        m = end["metrics"]
        n, write_s, top = _histogram(m, "foreshock_predictor_checkpoint_duration_seconds")
        n_stall, stall_s, stall_top = _histogram(m, "foreshock_predictor_checkpoint_stall_seconds")
        rss, idle = max(x["rss"] for x in drain[i].samples), drain[i].samples[0]["rss"]
        say(f"memory {i}    resident {rss / 2**20:,.0f} MiB at most in the drain ({idle / 2**20:,.0f} MiB "
            f"before its first record)")
        say(f"  checkpoints {n:.0f} partitions written, {write_s / max(n, 1) * 1e3:,.0f} ms each on average "
            f"(largest <= {top:g} s) on the writer thread; the loop stood still "
            f"{stall_s / max(n_stall, 1) * 1e3:,.1f} ms per checkpoint (largest <= {stall_top:g} s)")
    if ckpt:
        say(f"checkpoint  {sum(ckpt.values()) / 2**20:,.1f} MiB on disk for {args.nodes} nodes in "
            f"{len(ckpt)} partitions ({max(ckpt.values()) / 2**20:,.1f} MiB the largest)")
    figures = {
        "ratio": ratio, "per_cpu_s": per_cpu, "baseline_per_cpu_s": base_per_cpu,
        "drain_per_s": sum(taken) / wall,
        "drain_share": [n / sum(taken) for n in taken], "live_per_s": sum(ingested), "offered_per_s": rate,
        "keeps_up": keeps_up, "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99),
        "api_node_p99_s": _pct(api["node"], 99), "api_list_p99_s": _pct(api["list"], 99),
        "healthz_p99_s": _pct(health, 99), "checkpoint_bytes": ckpt, "load": psutil.getloadavg(),
        "rss": [max(x["rss"] for x in s.samples) for s in drain],
    }
    (args.out / "figures.json").write_text(json.dumps(figures, indent=1))
    return lines


def _start_profile(pid: int, args: argparse.Namespace, tag: str, seconds: float) -> subprocess.Popen:
    """py-spy (the dev extra) sampling ``pid`` for a phase, as collapsed stacks: whichever thread
    holds the interpreter lock (the process is bound by it), so each sample is a slice of the core."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[dev]'")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                             "--format", "raw", "--nolineno", "--gil", "--rate", "100",
                             "--output", str(args.out / f"serve-profile-{tag}.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# Where a sample of the scoring loop's thread goes: the deepest frame of its stack that one of
# these names (function, "" for any; file). Other threads: the HTTP API's, or the Kafka client's.
_STAGES = (
    ("Kafka consumer: fetch, record batches", "poll", "ingest/kafka_bus.py"),
    ("decode + validate (msgspec)", "decode", "ingest/contract.py"),
    ("records -> columns", "", "ingest/columns.py"),
    ("records -> columns", "", "features/frames.py"),
    ("decode: stream bookkeeping", "", "ingest/stream.py"),
    ("hold records (partition)", "", "predictor/partition.py"),
    ("hold records (partition)", "run_once", "predictor/service.py"),
    ("engine update: bucket statistics", "", "features/buckets.py"),
    ("engine update: other", "", "predictor/held.py"),
    ("engine update: other", "update_frames", "features/online.py"),
    ("features_at", "features_at", "features/online.py"),
    ("model: predict + SHAP", "score_frame", "predictor/scoring.py"),
    ("publish risk records", "publish", ""),
    ("checkpoint", "checkpoint", "predictor/service.py"),
    ("checkpoint", "", "predictor/checkpoint.py"),
    ("scoring: other", "_score_due", "predictor/service.py"),
)


def _stage(frames: list[str]) -> str:
    # py-spy names a frame "Class.function (package/file.py)"
    split = (f.partition(" (") for f in frames)
    parsed = [(name.rsplit(".", 1)[-1], where.rstrip(")")) for name, _, where in split]
    if not any(name == "run" and where == "predictor/service.py" for name, where in parsed):
        if any(w.startswith(("uvicorn/", "starlette/", "fastapi/", "asyncio/")) for _, w in parsed):
            return "HTTP API thread"
        return "Kafka client threads" if any(w.startswith("kafka/") for _, w in parsed) else "other threads"
    if any(name == "close" and where == "predictor/service.py" for name, where in parsed):
        return "shutdown: last checkpoint (after the measured span)"
    for name, where in reversed(parsed):
        for label, function, file in _STAGES:
            if (not function or name == function) and where.endswith(file):
                return label
    return "loop: other"


def _profile_report(tag: str, raw: Path, page: Path) -> list[str]:
    """Where the first service's samples went in a phase (by :data:`_STAGES`), and its icicle graph."""
    if not raw.exists():
        return ["profile     py-spy wrote nothing (could it attach?)"]
    tree: dict = {}
    stages: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        stages[_stage(frames)] = stages.get(_stage(frames), 0) + n
        node = tree
        for f in frames:
            node = node.setdefault(f, {"": 0})
            node[""] += n
    lines = [f"profile     {tag}: py-spy, {total:,} samples of process 0 holding the interpreter lock; "
             f"{page}"]
    for label, n in sorted(stages.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n / total:6.1%}  {label}")
    page.write_text(_icicle(tree, total))
    print("\n".join(lines))
    return lines


def _icicle(tree: dict, total: int) -> str:
    """A self-contained HTML icicle graph: each frame as wide as its share of the samples."""

    def block(name: str, node: dict) -> str:
        n = node[""]
        if n * 1000 < total:  # under 0.1 %: left out
            return ""
        kids = "".join(block(k, v) for k, v in sorted(node.items(), key=lambda kv: -kv[1][""] if kv[0] else 0)
                       if k)
        label = html.escape(name)
        width, share = 100 * n / total, f"{n / total:.1%}"
        return (f'<div class="f" style="width:{width:.3f}%" title="{label} - {share}">'
                f'<span>{label}</span><div class="k">{kids}</div></div>')

    root = "".join(block(k, v) for k, v in tree.items())
    style = ("body{font:11px monospace}.f{display:inline-block;vertical-align:top;overflow:hidden;"
             "box-sizing:border-box}.f>span{display:block;background:#f4b183;border:1px solid #fff;"
             "white-space:nowrap;overflow:hidden;height:15px}.k{display:flex;width:100%}")
    return (f"<!doctype html><meta charset=utf-8><title>foreshock serve profile</title><style>{style}</style>"
            f"<p>{total:,} samples; hover a frame for its share.</p><div style='display:flex'>{root}</div>")


def _watch_risk(bootstrap: str, stop: threading.Event) -> tuple[list, list]:
    """Consume risk.scores in a thread: (boundary, nodes, publication - boundary seconds), bus hops."""
    from kafka import KafkaConsumer, TopicPartition

    delays: list[tuple[int, int, float]] = []
    hops: list[float] = []
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    # assigned, not subscribed: no group to join, so a slow coordinator cannot make it miss the window
    logs = [TopicPartition(Topic.RISK, p) for p in sorted(consumer.partitions_for_topic(Topic.RISK))]
    consumer.assign(logs)
    consumer.seek_to_end()
    for tp in logs:  # the ends as of now, not as of the first poll
        consumer.position(tp)

    def run() -> None:
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
