"""Goodput simulator speed: replays per second of a 349-day, 16,384-GPU trace.

Baseline, measured in the same run: a naive discrete-event replay that steps through every
checkpoint of the job one by one (what a straightforward simulator does). The benchmark checks
both give the same ETTR, then prints the figures and the speed-up.

    .venv/bin/python benchmarks/bench_goodput.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from foreshock.models.goodput import (
    JobParams,
    OperatingPoint,
    from_profile,
    load_profile,
    run_strategies,
    simulate,
)
from foreshock.models.goodput.simulate import reference_periodic_ettr
from foreshock.models.reliability import daly_interval_seconds

PROFILE = Path(__file__).resolve().parents[1] / "datasets" / "profiles" / "llama3.toml"


def timed(fn, repeat: int) -> tuple[float, object]:
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return (time.perf_counter() - start) / repeat, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 30 days, one repeat")
    args = parser.parse_args()
    days, repeat = (30.0, 1) if args.quick else (349.0, 5)
    trace = from_profile(load_profile(PROFILE), gpus=16384, days=days, seed=0)
    params = JobParams()
    interval = daly_interval_seconds(params.checkpoint_s, trace.mtbf_s)
    fast_s, fast = timed(lambda: simulate(trace, interval, params), repeat)
    naive_s, naive_ettr = timed(lambda: reference_periodic_ettr(trace, interval, params), repeat)
    all_s, _ = timed(lambda: run_strategies(trace, params, OperatingPoint()), repeat)
    assert abs(fast.ettr - naive_ettr) < 1e-9, (fast.ettr, naive_ettr)
    print(f"trace: llama3 profile, 16,384 GPUs, {days:g} days, {len(trace)} failures, "
          f"Daly interval {interval / 60:.1f} min, ETTR {fast.ettr:.4f} (both replays agree)")
    print(f"simulate (periodic)        : {fast_s * 1e3:8.2f} ms per replay")
    print(f"naive per-checkpoint replay: {naive_s * 1e3:8.2f} ms per replay (baseline)")
    print(f"speed-up over baseline     : {naive_s / fast_s:8.1f}x")
    print(f"all four strategies        : {all_s * 1e3:8.2f} ms per trace ({all_s / fast_s:.1f}x one replay)")


if __name__ == "__main__":
    main()
