"""Simulator throughput and memory: GPU samples generated per second and peak memory.

Each case runs in a fresh process (one core: BLAS/OpenMP threads pinned to 1) so its peak RSS
is its own. Figures: generation alone (all telemetry tables built as Arrow, nothing written),
then generation plus writing parquet. The baseline, measured in the same run, is the simplest
vectorised generator there is: one fresh float64 normal draw for every GPU field of every sample
(``rng.standard_normal((samples, fields))``), in the same chunk sizes. Peak memory is reported
for the same cluster over half a day and two days: it must not grow with the number of days.

Usage: ``.venv/bin/python benchmarks/bench_simulate.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_SAMPLES_PER_S = 5_000_000


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(kind: str, nodes: int, hours: float) -> dict:
    """One case in this process; returns its figures (wall and CPU seconds, peak RSS)."""
    import numpy as np

    from foreshock.ingest.contract import GPU_FIELDS
    from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

    profile = load_profile(ROOT / "datasets" / "profiles" / "llama3.toml")
    sim = Simulator(
        profile,
        nodes=nodes,
        duration_ms=int(hours * 3_600_000),
        interval_ms=30_000,
        seed=7,
        rate_multiplier=50,
    )
    rss0 = _rss_mib()
    wall, cpu = time.perf_counter(), time.process_time()
    if kind == "generate":
        samples = sum(chunk.gpu.num_rows for chunk in sim.chunks())
    elif kind == "write":
        with tempfile.TemporaryDirectory() as out:
            write_dataset(sim, out, overwrite=True)
        samples = sim.gpu_samples
    else:  # baseline: one fresh normal per field per sample, same chunking
        rng = np.random.default_rng(7)
        rows_per_chunk = sim.steps_per_chunk * nodes * sim.gpus
        samples = 0
        while samples < sim.gpu_samples:
            rows = min(rows_per_chunk, sim.gpu_samples - samples)
            rng.standard_normal((rows, len(GPU_FIELDS)))
            samples += rows
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "kind": kind,
        "nodes": nodes,
        "hours": hours,
        "samples": samples,
        "wall_s": wall,
        "cpu_s": cpu,
        "per_s": samples / wall,
        "per_cpu_s": samples / cpu,
        "peak_rss_mib": _rss_mib(),
        "import_rss_mib": rss0,
    }


def run_case(kind: str, nodes: int, hours: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, str(nodes), str(hours)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small cases")
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "NODES", "HOURS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, nodes, hours = args.worker
        print(json.dumps(worker(kind, int(nodes), float(hours))))
        return
    scale = 0.1 if args.quick else 1.0
    # hours per size so that each case generates 3-6 million GPU samples
    sizes = {64: 48.0 * scale, 512: 12.0 * scale, 2048: 3.0 * scale}
    print(f"simulator benchmark: llama3 x50, 30 s interval, one process per case{' [quick]' * args.quick}")
    print(
        "rates in GPU-samples/s: wall clock (CPU time of the process); baseline = one float64 normal draw per"
    )
    print("GPU field per sample; peak = peak RSS (of which imports)")
    print(
        f"{'nodes':>6} {'samples':>11} {'generate':>22} {'baseline':>22} {'ratio':>6} {'generate+write':>22} "
        f"{'peak MiB':>14}"
    )
    gen_by_size = {}
    for nodes, hours in sizes.items():
        gen = gen_by_size[nodes] = run_case("generate", nodes, hours)
        base = run_case("baseline", nodes, hours)
        write = run_case("write", nodes, hours)
        print(
            f"{nodes:>6} {gen['samples']:>11,} {_rate(gen):>22} {_rate(base):>22} "
            f"{gen['per_cpu_s'] / base['per_cpu_s']:>6.2f} {_rate(write):>22} "
            f"{gen['peak_rss_mib']:>6.0f} ({gen['import_rss_mib']:.0f})"
        )
    short = gen_by_size[512]
    long = run_case("generate", 512, sizes[512] * 4)
    print(
        f"peak memory, 512 nodes: {short['hours'] / 24:g} day(s) {short['peak_rss_mib']:.0f} MiB, "
        f"{long['hours'] / 24:g} day(s) {long['peak_rss_mib']:.0f} MiB "
        f"(ratio {long['peak_rss_mib'] / short['peak_rss_mib']:.2f}: bounded if about 1)"
    )
    worst = min(gen_by_size.values(), key=lambda g: g["per_cpu_s"])
    print(
        f"target >= {TARGET_SAMPLES_PER_S:,} GPU-samples/s per core at every size: lowest "
        f"{worst['per_cpu_s']:,.0f} per CPU-second ({worst['nodes']} nodes)"
    )


def _rate(case: dict) -> str:
    return f"{case['per_s'] / 1e6:.2f}M ({case['per_cpu_s'] / 1e6:.2f}M cpu)"


if __name__ == "__main__":
    main()
