"""Batch training at scale: simulate, features, train, evaluate and calibrate, with nodes and days
varied separately.

Each stage runs as ``foreshock`` does, in a fresh process pinned to one core (bar ``--full``'s
features, below), from a dataset the llama3 profile simulates at 60 s with ``--rate-multiplier
60``: ``features --out TABLE``, then ``train --features TABLE``, ``evaluate --features TABLE`` and
``calibrate --features TABLE --budget 1`` (the trained model's threshold set again on the same
rows, as an operator sets it on a new cluster's).
For every size and stage it prints wall time, peak RSS (the process's high-water mark) and rows;
for each series (nodes varied at fixed days, days varied at fixed nodes) the growth exponents of
time and peak RSS against rows (1 = linear, 0 = flat). Two same-run ratios:

- ``train`` against bare ``lightgbm.train``: the time ``train`` spends inside ``lightgbm.train``
  (every tree model it fits, on the same rows, Dataset construction included), measured in the
  same process;
- ``features`` end to end (GPU samples per second of the whole command, reading and writing
  included) against the batch kernel: ``compute_features`` on frames already in memory, both on
  the dataset itself (its first 32 nodes, every day) and on ``bench_features``' synthetic
  telemetry (48 nodes x 6 h at 30 s), measured in this run.

With ``--subsampling`` it also trains on 128 nodes x 4 days on every row and with
``--negative-rate 0.1``, at the same seed, and judges both on three held-out days of another
seed, against the stated tolerances.

    .venv/bin/python benchmarks/bench_batch.py            # 32-128 nodes, 2-8 days: ~4 minutes
    .venv/bin/python benchmarks/bench_batch.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_batch.py --growth   # 256 x 7 and 1,024 x 14: under an hour
    .venv/bin/python benchmarks/bench_batch.py --full --workdir DIR   # 2,048 nodes x 30 days: hours

``--growth`` measures the growth exponents of time and peak RSS between 256 nodes x 7 days and
1,024 x 14 (16 times the rows), trained with ``--negative-rate 0.1``: a peak that stays flat there
is bounded by a constant, not by the rows. ``--full`` is a fleet's month at the llama3 profile's
own failure rate (x 1: 2,048 nodes are its 16,384 GPUs) on the whole machine: its features on two
Dask workers, one per core, the other stages on one core; trained with ``--negative-rate 0.1``.
Each stage's figures are written to ``DIR/NODESxDAYS-s1/stages.json`` as it ends; ``--resume``
keeps the stages already recorded there (their outputs in place) and runs only the rest, and
``--until STAGE`` stops after one, so that an hours-long run can be taken in parts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {"nodes": [(32, 2), (64, 2), (128, 2)], "days": [(32, 2), (32, 4), (32, 8)]}
QUICK = {"nodes": [(16, 1), (32, 1)], "days": [(16, 1), (16, 2)]}
FULL = {"full": [(2048, 30)]}
GROWTH = {"growth": [(256, 7), (1024, 14)]}
STAGES = ("simulate", "features", "train", "evaluate", "calibrate")
# --full: a fleet's month at the llama3 profile's own failure rate (2,048 nodes are its 16,384 GPUs:
# 7.8 interruptions a day), trained with the far negatives thinned (the tolerances below bound what
# thinning changes)
FULL_RATE = 1
FULL_TRAIN_FLAGS = ("--negative-rate", "0.1")
# --full: features on both cores, a Dask worker each writing its own partitions (every other stage,
# and features at the other sizes, on one core)
FULL_FEATURE_WORKERS = 2
SIMULATE = ["--profile", "llama3", "--interval", "60s"]
RATE = 60  # failure rate multiplier (--quick: 300, so that a day of 16 nodes fails in every period)
KERNEL_NODES = 32
# --subsampling: the subsampled model's figures on the held-out dataset stay within these of the
# model trained on every row (absolute differences; false alarms per 1,000 node-days, lead in min)
TOLERANCES = {
    "pr_auc": 0.05,
    "recall_at_budget": 0.10,
    "false_alarms_per_1000_node_days": 1.0,
    "median_lead_minutes": 10.0,
}
SUBSAMPLE_RATE = 0.1
SUBSAMPLE_SIZE = (128, 4, 3)  # nodes, days to train on, days held out
SUBSAMPLE_FAILURE_RATE = 60  # most rows are then far from any failure, as in a fleet (x 300 in --quick)


def _one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def run_stage(name: str, argv: list[str], workdir: Path, one_core: bool = True) -> dict[str, Any]:
    """Run one ``foreshock`` command in a fresh process, on one core unless ``one_core`` is False:
    wall seconds, peak RSS (bytes: the largest of the process and its children), and what the
    stage measured of itself (``lightgbm.train`` seconds for train)."""
    report = workdir / f".stage-{name}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, __file__, "--stage", str(report), "--", *argv]
    log = report.with_suffix(".log")
    start = time.perf_counter()
    with log.open("w") as err:
        pin = _one_core if one_core else None
        proc = subprocess.Popen(cmd, preexec_fn=pin, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{name} failed: {log.read_text()[-2000:]}")
    own = json.loads(report.read_text()) if report.exists() else {}
    return {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024, **own}


def _stage_main(report: str, argv: list[str]) -> None:
    """The child side of :func:`run_stage`: time ``lightgbm.train``, then run the command."""
    import lightgbm

    spent = {"lightgbm_train_seconds": 0.0, "lightgbm_train_calls": 0}
    bare = lightgbm.train

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return bare(*args, **kwargs)
        finally:
            spent["lightgbm_train_seconds"] += time.perf_counter() - start
            spent["lightgbm_train_calls"] += 1

    lightgbm.train = timed
    from foreshock.cli import app  # imports the stage's command module alone

    try:
        app(argv, standalone_mode=False)
    finally:
        Path(report).write_text(json.dumps(spent))


def _simulate(nodes: int, days: int, seed: int, rate: float, data: Path, workdir: Path) -> dict[str, Any]:
    flags = ["--rate-multiplier", str(rate), "--nodes", str(nodes), "--days", str(days), "--seed", str(seed)]
    return run_stage("simulate", ["simulate", *SIMULATE, *flags, "--out", str(data), "--overwrite"], workdir)


def _features(data: Path, table: Path, workdir: Path, workers: int = 1) -> dict[str, Any]:
    argv = ["features", "--data", str(data), "--out", str(table), "--overwrite"]
    if workers > 1:
        argv += ["--dask", "local", "--workers", str(workers)]
    return {**run_stage("features", argv, workdir, one_core=workers == 1), "workers": workers}


def _train(data: Path, table: Path, model: Path, workdir: Path, *flags: str) -> dict[str, Any]:
    argv = ["train", "--data", str(data), "--out", str(model), "--features", str(table), "--no-register"]
    return run_stage("train", [*argv, *flags], workdir)


def _evaluate(model: Path, data: Path, table: Path, out: Path, workdir: Path) -> dict[str, Any]:
    argv = [
        "evaluate",
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
        "--features",
        str(table),
    ]
    return run_stage("evaluate", argv, workdir)


def _calibrate(model: Path, data: Path, table: Path, out: Path, workdir: Path) -> dict[str, Any]:
    argv = ["calibrate", "--model", str(model), "--data", str(data), "--features", str(table),
            "--budget", "1", "--no-register", "--out", str(out)]
    return run_stage("calibrate", argv, workdir)


def measure_size(
    nodes: int,
    days: int,
    workdir: Path,
    seed: int = 1,
    rate: float = RATE,
    train_flags: tuple[str, ...] = (),
    resume: bool = False,
    until: str = "evaluate",
    feature_workers: int = 1,
) -> dict[str, Any] | None:
    """simulate, features (on ``feature_workers`` Dask workers when more than one), train,
    evaluate, calibrate at one size; each stage's figures go to ``stages.json`` as it ends, and with
    ``resume`` the stages recorded there are not run again. None when it stopped after ``until``,
    before calibrate."""
    from foreshock.features.table import FeatureTable
    from foreshock.features.timeslices import gpu_rows

    base = workdir / f"{nodes}x{days}-s{seed}"
    data, table, model, evaluation, calibration = (
        base / p for p in ("data", "table", "model", "evaluation", "calibration")
    )
    record = base / "stages.json"
    out: dict[str, Any] = {"nodes": nodes, "days": days, "data": str(data)}
    if resume and record.exists():
        out |= json.loads(record.read_text())

    def stage(name: str, run: Any, rows: Any) -> bool:
        """Run one stage unless it is recorded; False once ``until`` is done."""
        if STAGES.index(name) > STAGES.index(until):
            return False
        if name in out:
            print(f"  {nodes} x {days}: {name} kept from {record}", flush=True)
            return True
        out[name] = run()
        out[name]["rows"] = rows()
        base.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({k: v for k, v in out.items() if isinstance(v, dict)}))
        print(f"  {nodes} x {days}: {name} {_fmt_stage(out[name])}", flush=True)
        return True

    stage("simulate", lambda: _simulate(nodes, days, seed, rate, data, workdir), lambda: gpu_rows(data))
    stage("features", lambda: _features(data, table, workdir, feature_workers),
          lambda: FeatureTable.open(table).rows)

    def trained_rows() -> int:
        metrics = json.loads((model / "metrics.json").read_text())
        return sum(v for k, v in metrics["_info"]["rows"].items() if k != "test_unseen_nodes")

    stage("train", lambda: _train(data, table, model, workdir, *train_flags), trained_rows)

    def evaluated_rows() -> int:  # calibrate scores the same rows
        return json.loads((evaluation / "metrics.json").read_text())["model"]["rows"]

    stage("evaluate", lambda: _evaluate(model, data, table, evaluation, workdir), evaluated_rows)
    if not stage("calibrate", lambda: _calibrate(model, data, table, calibration, workdir), evaluated_rows):
        return None
    out["gpu_samples"] = out["simulate"]["rows"]
    return out


def kernel_on_dataset(data: str, nodes: int = KERNEL_NODES) -> float:
    """GPU samples per second of ``compute_features`` on frames in memory: the dataset's first
    ``nodes`` nodes, every day (best of two)."""
    import pyarrow.parquet as pq

    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.features.batch import compute_features, read_frames
    from foreshock.ingest.dataset import part_paths, read_events

    first = pq.read_table(part_paths(data, "gpu")[0], columns=["node"]).column("node").unique().to_pylist()
    chosen = sorted(map(str, first))[:nodes]
    frames = read_frames(data, DEFAULT_FEATURE_SET, chosen)
    events = read_events(data)
    best = math.inf
    for _ in range(2):
        start = time.perf_counter()
        compute_features(**frames, events=events[events["node"].isin(chosen)])
        best = min(best, time.perf_counter() - start)
    return len(frames["gpu"]) / best


def kernel_of_bench_features(quick: bool) -> tuple[float, float]:
    """``bench_features``' batch figure: GPU samples and feature rows per second on its synthetic
    telemetry (30 s samples: twice the samples per feature row of a 60 s dataset)."""
    spec = importlib.util.spec_from_file_location(
        "bench_features", Path(__file__).with_name("bench_features.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = module.bench_batch(8, 2.0, 1) if quick else module.bench_batch(48, 6.0, 3)
    return r["gpu_samples"] / r["full_s"], r["rows"] / r["full_s"]


def exponent(a: dict[str, Any], b: dict[str, Any], stage: str, key: str) -> float:
    """Growth exponent of ``key`` against the stage's rows from size ``a`` to size ``b``."""
    ra, rb = a[stage]["rows"], b[stage]["rows"]
    return math.log(b[stage][key] / a[stage][key]) / math.log(rb / ra)


def subsampling(workdir: Path, quick: bool) -> dict[str, Any]:
    """Train on every row and with the far negatives thinned, at the same seed, on a dataset rich
    in failures, and judge both models on a held-out dataset of another seed."""
    nodes, days, held_days = (32, 2, 1) if quick else SUBSAMPLE_SIZE
    failure_rate = 300 if quick else SUBSAMPLE_FAILURE_RATE
    base = workdir / "subsampling"
    sets = {}
    for name, seed, span in (("train", 1, days), ("held-out", 2, held_days)):
        data, table = base / name / "data", base / name / "table"
        _simulate(nodes, span, seed, failure_rate, data, workdir)
        _features(data, table, workdir)
        sets[name] = (data, table)
    figures, info = {}, {}
    for name, flags in (("every row", ()), ("thinned", ("--negative-rate", str(SUBSAMPLE_RATE)))):
        model = base / f"model-{name.replace(' ', '-')}"
        _train(*sets["train"], model, workdir, *flags)
        info[name] = json.loads((model / "metrics.json").read_text())["_info"]
        out = base / f"held-out-{name.replace(' ', '-')}"
        _evaluate(model, *sets["held-out"], out, workdir)
        m = json.loads((out / "metrics.json").read_text())["model"]
        figures[name] = {k: m.get(k) for k in TOLERANCES} | {"failures": m.get("failures")}
    thinned = info["thinned"]
    return {
        "size": [nodes, days, held_days, failure_rate],
        "figures": figures,
        "rows_used": {k: v["train_rows_used"] for k, v in info.items()},
        "rows_represented": thinned["negative_subsampling"]["train_rows_represented"],
    }


def _fmt_stage(s: dict[str, Any]) -> str:
    return f"{s['seconds']:.1f} s / {s['peak_rss'] / 2**30:.2f} GiB"


def report(
    series: dict[str, list[dict[str, Any]]], kernels: dict[str, float], sub: dict[str, Any] | None
) -> None:
    print("| nodes x days | GPU samples | feature rows | " + " | ".join(STAGES) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in STAGES) + " |")
    seen = set()
    for runs in series.values():
        for r in runs:
            if (r["nodes"], r["days"]) in seen:
                continue
            seen.add((r["nodes"], r["days"]))
            rows = f"{r['gpu_samples'] / 1e6:.2f} M | {r['features']['rows'] / 1e6:.3f} M"
            stages = " | ".join(_fmt_stage(r[st]) for st in STAGES)
            print(f"| {r['nodes']} x {r['days']} | {rows} | {stages} |")
    for name, runs in series.items():
        if len(runs) < 2:
            continue
        a, b = runs[0], runs[-1]
        parts = [
            f"{st} time {exponent(a, b, st, 'seconds'):.2f}, RSS {exponent(a, b, st, 'peak_rss'):.2f}"
            for st in STAGES
        ]
        print(
            f"growth exponents, {name} varied ({a['nodes']}x{a['days']} -> {b['nodes']}x{b['days']}): "
            + "; ".join(parts)
        )
    print()
    for r in (runs[-1] for runs in series.values()):
        t = r["train"]
        lgb_s, rate = t["lightgbm_train_seconds"], r["gpu_samples"] / r["features"]["seconds"]
        print(
            f"{r['nodes']} x {r['days']}: train {t['seconds']:.1f} s, of which lightgbm.train {lgb_s:.1f} s "
            f"({t['lightgbm_train_calls']} calls): {t['seconds'] / lgb_s:.2f}x bare LightGBM (target <= 1.5)"
        )
        workers = r["features"].get("workers", 1)
        rate /= workers
        row_rate = r["features"]["rows"] / r["features"]["seconds"] / workers
        print(
            f"{r['nodes']} x {r['days']}: features end to end, per core ({workers} in use), "
            f"{rate:,.0f} GPU samples/s = "
            f"{rate / kernels['dataset']:.2f} of the kernel on this dataset ({kernels['dataset']:,.0f}/s), "
            f"{rate / kernels['bench_features']:.2f} of bench_features' "
            f"({kernels['bench_features']:,.0f}/s); "
            f"{row_rate:,.0f} feature rows/s = {row_rate / kernels['bench_features_rows']:.2f} of "
            f"bench_features' ({kernels['bench_features_rows']:,.0f}/s) (target >= 0.5)"
        )
    if sub is not None:
        nodes, days, held, failure_rate = sub["size"]
        every, thin = sub["figures"]["every row"], sub["figures"]["thinned"]
        print()
        used = sub["rows_used"]
        print(
            f"subsampling: {nodes} nodes x {days} days at rate x {failure_rate}; the trees saw "
            f"{used['every row']:,} rows, or {used['thinned']:,} with --negative-rate {SUBSAMPLE_RATE} "
            f"(standing for {sub['rows_represented']:,}); on {held} held-out days of another seed "
            f"({every['failures']} failures):"
        )
        for k, tol in TOLERANCES.items():
            a, b = every[k], thin[k]
            within = (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tol)
            print(f"  {k}: every row {a}, thinned {b} (tolerance {tol}: {'within' if within else 'OUTSIDE'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--full", action="store_true", help="2,048 nodes x 30 days (hours; the whole machine)"
    )
    parser.add_argument(
        "--growth", action="store_true", help="256 x 7 and 1,024 x 14 days (under an hour)"
    )
    parser.add_argument(
        "--subsampling", action="store_true", help="also check --negative-rate on held-out data"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where datasets go (default: a temporary folder)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--resume", action="store_true", help="keep the stages already recorded in --workdir")
    parser.add_argument(
        "--until", choices=STAGES, default=STAGES[-1], help="stop after this stage (go on with --resume)"
    )
    args = parser.parse_args()
    sizes = FULL if args.full else GROWTH if args.growth else QUICK if args.quick else SIZES
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-batch-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir {workdir}; load average {os.getloadavg()[0]:.2f}", flush=True)
    done: dict[tuple[int, int], dict[str, Any]] = {}
    series: dict[str, list[dict[str, Any]]] = {}
    for name, points in sizes.items():
        for size in points:
            if size not in done:
                done[size] = measure_size(
                    *size,
                    workdir,
                    rate=FULL_RATE if args.full else 300 if args.quick else RATE,
                    train_flags=FULL_TRAIN_FLAGS if args.full or args.growth else (),
                    resume=args.resume,
                    until=args.until,
                    feature_workers=FULL_FEATURE_WORKERS if args.full else 1,
                )
                if done[size] is None:
                    print(f"stopped after {args.until}; go on with --resume --workdir {workdir}")
                    return
                print(
                    f"  {size[0]} x {size[1]} done: "
                    + ", ".join(
                        f"{st} {_fmt_stage(done[size][st])}"
                        for st in STAGES
                    ),
                    flush=True,
                )
            series.setdefault(name, []).append(done[size])
    _one_core()
    largest = max(done, key=lambda s: s[0] * s[1])
    samples, rows = kernel_of_bench_features(args.quick)
    kernels = {
        "dataset": kernel_on_dataset(done[largest]["data"]),
        "bench_features": samples,
        "bench_features_rows": rows,
    }
    sub = subsampling(workdir, args.quick) if args.subsampling else None
    report(series, kernels, sub)
    if args.json:
        args.json.write_text(json.dumps({"series": series, "kernels": kernels, "subsampling": sub}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--stage":
        _stage_main(sys.argv[2], sys.argv[4:])
    else:
        main()
