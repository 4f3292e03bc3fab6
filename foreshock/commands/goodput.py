"""``foreshock goodput``: what failures cost a training job, and what checkpointing and prediction buy.

Builds the failure traces (a profile draw per cluster size, a simulated dataset's ground truth,
or the real InfiniteHBD trace), replays them with ``foreshock.models.goodput`` and prints one table per
cluster size (or JSON), plus a plot of ETTR against recall. With ``--drill`` (the JSON of
``foreshock drill --json``) and ``--state-gb-per-gpu`` it also projects a tiered in-memory
checkpoint job to each size (``foreshock.models.goodput.projection``), adds its ``tiered`` and
``tiered+foreshock`` rows and prints where every figure came from. With ``--burn-in`` every
strategy is replayed again with repaired nodes held out under the burn-in rule
(``foreshock.models.goodput.burnin``; the defaults are those the real trace's repeat-failure
curve gives, ``foreshock.models.reliability.DEFAULT_BURN_IN``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table
from typer import Option as Opt

from foreshock import shipped
from foreshock.commands.durations import Duration, duration_parser
from foreshock.models.goodput import (
    JSON_KEYS,
    DrillReport,
    FailureTrace,
    JobParams,
    OperatingPoint,
    TierProjection,
    compare,
    from_ground_truth,
    from_profile,
    load_infinitehbd,
    load_profile,
    project,
    resize,
    sweep,
)
from foreshock.models.goodput.burnin import apply_burn_in
from foreshock.models.goodput.plot import plot_ettr_vs_recall
from foreshock.models.goodput.tiers import pair_loss_window_s
from foreshock.models.reliability import DEFAULT_BURN_IN, SECONDS_PER_DAY, BurnIn

_DURATION = {"parser": duration_parser(never=True), "metavar": "DURATION"}  # "inf": never
SWEEP_RECALLS = tuple(k / 10 for k in range(11))


def _trace_builder(profile: str | None, trace: str | None, dataset: Path | None, days: float, seed: int):
    """(name, its own GPU count or None, function gpus -> FailureTrace) for the chosen source."""
    chosen = [x for x in (profile, trace, dataset) if x is not None]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --profile, --trace, --dataset")
    if profile is not None:
        try:
            path = shipped.profile(profile)
        except LookupError as exc:
            raise typer.BadParameter(str(exc)) from None
        if not path.exists():
            raise typer.BadParameter(f"no profile {path}")
        spec = load_profile(path)
        spec.setdefault("name", path.stem)
        return path.stem, None, lambda g: from_profile(spec, gpus=g, days=days, seed=seed)
    if trace is not None:
        base = load_infinitehbd(shipped.trace(trace))
        return trace, base.gpus, lambda g: resize(base, g, seed=seed)
    assert dataset is not None
    base = from_ground_truth(dataset)
    return str(dataset), base.gpus, lambda g: resize(base, g, seed=seed)


def _print_tables(console: Console, table: pd.DataFrame, traces: dict[int, FailureTrace], params: JobParams,
                  op: OperatingPoint, source: str, tiers: dict[int, TierProjection] | None = None,
                  burn_in: BurnIn | None = None) -> None:
    lead_s = float(np.median(op.lead_time_s))
    console.print(f"[bold]goodput[/] {source}: checkpoint {params.checkpoint_s:g} s, "
                  f"restart {params.restart_s:g} s, migration {params.migration_s:g} s, "
                  f"spares {params.spares}, spare refill {params.spare_refill_s / 60:g} min\n"
                  f"operating point: recall {op.recall:.2f}, median lead {lead_s / 60:.1f} min, "
                  f"false alarms {op.false_alarms_per_1000_node_days:.2f} per 1000 node-days")
    for gpus, rows in table.groupby("gpus", sort=True):
        trace = traces[gpus]
        console.print(f"[bold]{gpus:,} GPUs[/] ({trace.nodes} nodes): {len(trace)} failures in "
                      f"{trace.days:.0f} days, MTBF {trace.mtbf_s / 3600:.2f} h")
        columns = ["strategy", "interval", "ETTR", "GPU-h lost/day", "interruptions/day", "migrations/day",
                   "lost-time reduction"]
        if tiers:
            columns[2:2] = ["durable every"]
            columns.append("vs Young/Daly")
        out = Table()
        for col in columns:
            out.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=col == "strategy")
        for r in rows.itertuples():
            interval = "none" if math.isinf(r.interval_min) else (
                _minutes(r.interval_min) if tiers else f"{r.interval_min:.1f} min")
            cells = [r.strategy, interval, f"{r.ettr:.4f}", f"{r.lost_gpu_hours_per_day:,.0f}",
                     f"{r.interruptions_per_day:.2f}", f"{r.migrations_per_day:.2f}",
                     f"{r.lost_time_reduction:+.1%}"]
            if tiers:
                cells[2:2] = ["" if math.isnan(r.durable_interval_min) else _minutes(r.durable_interval_min)]
                cells.append(f"{r.lost_time_reduction_vs_young_daly:+.1%}")
            out.add_row(*cells)
        console.print(out)
        if burn_in is not None:
            _print_burn_in(console, trace, burn_in)
        if tiers:
            _print_pair_losses(console, rows, trace, tiers[gpus])


def _print_burn_in(console: Console, trace: FailureTrace, burn_in: BurnIn) -> None:
    """What the burn-in rule held back on this trace, and what it held out of service."""
    replay = apply_burn_in(trace, burn_in)
    console.print(f"  +burn-in: a node back from repair with {burn_in.failures} failures within "
                  f"{burn_in.window_s / SECONDS_PER_DAY:g} days stays out {burn_in.length_s / 3600:g} h: "
                  f"{replay.held} of {len(trace)} failures landed in a burn-in instead of the job; "
                  f"{replay.burn_ins} burn-ins held {replay.node_s / SECONDS_PER_DAY:.0f} node-days out of "
                  f"service ({replay.node_s / trace.duration_s:.2f} nodes on average)", soft_wrap=True)


def _burn_in(length: Duration | None, failures: int, window: Duration) -> BurnIn | None:
    if length is None:
        return None
    try:
        return BurnIn(failures=failures, window_s=window.seconds, length_s=length.seconds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--burn-in") from None


def _minutes(value: float) -> str:
    if value >= 600:
        return f"{value / 60:.1f} h"
    return f"{value:.1f} min" if value >= 1 else f"{value * 60:.1f} s"


def _print_pair_losses(console: Console, rows: pd.DataFrame, trace: FailureTrace,
                       tiers: TierProjection) -> None:
    """Say where each tiered row's pair-loss probability came from."""
    for r in rows[rows["pair_loss_probability"].notna()].itertuples():
        window = pair_loss_window_s(tiers.tier_params(), r.interval_min * 60.0)
        console.print(f"  {r.strategy}: pair-loss probability {r.pair_loss_probability:.2e} per failure, "
                      f"estimated from this trace (pairs of failures of different nodes at most "
                      f"{window:.0f} s apart, each charged 1/{trace.nodes - 1} for the chance they are "
                      f"buddies); {r.pair_losses} pair losses replayed")


def _print_projection(console: Console, drill: Path, tiers: dict[int, TierProjection]) -> None:
    """The projected tier costs, each with the figure it rests on, then the sources list."""
    first = next(iter(tiers.values()))
    console.print(f"[bold]tiers[/] projected from the drill {drill} at {first.state_gb_per_gpu:g} GB of "
                  "state per GPU (time = bytes / the smaller of the drill's and the hardware's bandwidth):")
    names = {"memory_copy": "memory snapshot stall", "peer_replication": "replication to the buddy (async)",
             "peer_restore": "restore from the buddy", "durable_write": "durable write stall",
             "durable_restore": "restore from storage"}
    for path, t in first.paths.items():
        console.print(f"  {names[path]}: {t.seconds:.3f} s (drill {t.measured_gb_s:g} GB/s, "
                      f"hardware {t.cited.value:.3g} GB/s: {t.bound} bound)")
    for gpus, proj in tiers.items():
        parts = [f"{kind} {r.seconds:.1f} s = {r.fixed_s:.1f} fixed (drill '{r.scenario}') + "
                 f"{r.restore.seconds:.2f} restore + {r.reinit.value:g} init"
                 for kind, r in proj.recoveries.items()]
        console.print(f"  recovery at {gpus:,} GPUs: " + "; ".join(parts))
    sources = {s.key: s for proj in tiers.values() for s in proj.sources()}
    console.print("[bold]sources[/] (published figures used; every other figure is measured in the drill "
                  "file or estimated from the trace):")
    for i, src in enumerate(sources.values(), 1):
        console.print(f"  [{i}] {src.line()}", soft_wrap=True)


def goodput(
    profile: Annotated[str | None, Opt(help="Shipped profile (llama3, infinitehbd) or a .toml path.")] = None,
    trace: Annotated[str | None, Opt(help="Real trace: 'infinitehbd' or a fault_trace.json path.")] = None,
    dataset: Annotated[Path | None, Opt(help="Simulated dataset DIR (replays its ground truth).")] = None,
    gpus: Annotated[str | None, Opt(help="Cluster sizes, e.g. 1024,4096,16384 (default: profile "
                                    "1024,4096,16384; trace or dataset: its own size).")] = None,
    days: Annotated[float, Opt(help="Days drawn from a profile (long draws give expectations).")] = 3650.0,
    metrics: Annotated[str | None, Opt(help="metrics.json from 'foreshock evaluate', or a shipped operating "
                                       "point (llama3-512x14d-metrics).")] = None,
    predictor: Annotated[str, Opt(help="Which predictor of --metrics to use.")] = "model",
    recall: Annotated[float, Opt(help="Recall without --metrics.")] = 0.6,
    lead_minutes: Annotated[float, Opt(help="Median warning lead time without --metrics.")] = 30.0,
    false_alarms_per_1000_node_days: Annotated[float, Opt(help="False alarms without --metrics.")] = 1.0,
    checkpoint: Annotated[Duration, Opt(**_DURATION, help="Blocking part of a checkpoint write.")] = "30s",
    restart: Annotated[Duration, Opt(**_DURATION, help="Restart time after a crash.")] = "10m",
    migration: Annotated[Duration, Opt(**_DURATION, help="Migration time onto a spare after a warning.")] = (
        "60s"),
    spares: Annotated[int, Opt(help="Hot spare nodes.")] = 2,
    spare_refill: Annotated[Duration, Opt(**_DURATION, help="Time to replace a used spare ('inf': repair "
                                                           "only).")] = "1h",
    interval: Annotated[Duration, Opt(**_DURATION, help="Checkpoint interval of the fixed baseline.")] = (
        "30m"),
    seed: Annotated[int, Opt(help="Seed of profile draws and of the predictor's hits.")] = 0,
    as_json: Annotated[bool, Opt("--json", help="Print the table as JSON.")] = False,
    plot: Annotated[Path | None, Opt(help="PNG of ETTR against recall (default OUT/goodput.png).")] = None,
    out: Annotated[Path, Opt(help="Folder for the default plot.")] = Path("."),
    no_plot: Annotated[bool, Opt("--no-plot", help="Skip the plot.")] = False,
    drill: Annotated[str | None, Opt(help="JSON of 'foreshock drill --json', or a shipped one "
                                     "(drill-256mb): adds the tiered strategies.")] = None,
    state_gb_per_gpu: Annotated[float | None, Opt(help="Training state per GPU (GB) to project --drill "
                                                  "to, e.g. 0.4 for Llama 3 405B on 16,384 GPUs.")] = None,
    burn_in: Annotated[Duration | None, Opt(**_DURATION, help="Also replay every strategy (as "
                                            "STRATEGY+burn-in) with repaired "
                                       "nodes held out this long, e.g. 48h (what the real trace's "
                                       "repeat-failure curve gives).")] = None,
    burn_in_failures: Annotated[int, Opt(help="Burn-in: failures within --burn-in-window that send a "
                                         "repaired node into burn-in.")] = DEFAULT_BURN_IN.failures,
    burn_in_window: Annotated[Duration, Opt(**_DURATION, help="Burn-in: the window those failures are "
                                            "counted in.")] =
        f"{DEFAULT_BURN_IN.window_s / SECONDS_PER_DAY:g}d",
) -> None:
    """Compare checkpointing strategies (fixed, Young/Daly, Foreshock, oracle; tiered with --drill)."""
    source, own_gpus, trace_for = _trace_builder(profile, trace, dataset, days, seed)
    rule = _burn_in(burn_in, burn_in_failures, burn_in_window)
    try:
        metrics_path = None if metrics is None else shipped.operating_point(metrics)
        drill_path = None if drill is None else shipped.operating_point(drill)
    except LookupError as exc:
        raise typer.BadParameter(str(exc)) from None
    if gpus:
        sizes = [int(g) for g in gpus.split(",") if g.strip()]
    else:
        sizes = [own_gpus] if own_gpus else [1024, 4096, 16384]
    params = JobParams(checkpoint_s=checkpoint.seconds, restart_s=restart.seconds,
                       migration_s=migration.seconds, spares=spares, spare_refill_s=spare_refill.seconds)
    if metrics is not None:
        op = OperatingPoint.from_metrics(metrics_path, predictor)
    else:
        op = OperatingPoint(recall=recall, lead_time_s=lead_minutes * 60.0,
                            false_alarms_per_1000_node_days=false_alarms_per_1000_node_days)
    traces = {g: trace_for(g) for g in sizes}
    tiers = _projections(drill_path, state_gb_per_gpu, [t.gpus for t in traces.values()])
    tiered_for = None if tiers is None else (lambda tr: tiers[tr.gpus].job_params(params))
    table = compare([traces[g] for g in sizes], params, op, fixed_interval_s=interval.seconds, seed=seed,
                    tiered_for=tiered_for, burn_in=rule)
    by_gpus = {t.gpus: t for t in traces.values()}
    if as_json:
        typer.echo(json.dumps([{k: row[k] for k in JSON_KEYS} for row in table.to_dict("records")], indent=2))
        if tiers is not None:  # stdout stays the JSON rows; where the figures came from goes to stderr
            assert drill_path is not None
            err = Console(width=120, stderr=True)
            _print_projection(err, drill_path, tiers)
            for gpus, rows in table.groupby("gpus", sort=True):
                _print_pair_losses(err, rows, by_gpus[gpus], tiers[gpus])
    else:
        console = Console(width=120 if tiers is None else 150)  # the tiered table has two more columns
        _print_tables(console, table, by_gpus, params, op, source, tiers, rule)
        if tiers is not None:
            assert drill_path is not None
            _print_projection(console, drill_path, tiers)
    if not no_plot:
        curve = sweep(lambda g: traces[g], sizes, SWEEP_RECALLS, params, op, seed=seed)
        title = f"{source}: ETTR against recall (dashed: Young/Daly, dotted: oracle, star: operating point)"
        path = plot_ettr_vs_recall(curve, plot or out / "goodput.png", operating_recall=op.recall,
                                   title=title)
        typer.echo(f"plot: {path}", err=True)


def _projections(drill: Path | None, state_gb_per_gpu: float | None,
                 sizes: list[int]) -> dict[int, TierProjection] | None:
    """The tiered job's costs per cluster size, or None without --drill."""
    if drill is None and state_gb_per_gpu is None:
        return None
    if drill is None or state_gb_per_gpu is None:
        raise typer.BadParameter("give --drill and --state-gb-per-gpu together")
    if state_gb_per_gpu <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--state-gb-per-gpu")
    try:
        report = DrillReport.from_json(drill)
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(f"{drill}: {exc}", param_hint="--drill") from None
    return {g: project(report, state_gb_per_gpu, g) for g in sizes}


def register(app: typer.Typer) -> None:
    """Add ``foreshock goodput`` to ``app``."""
    app.command("goodput")(goodput)
