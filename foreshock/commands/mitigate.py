"""``foreshock mitigate`` (the policy loop on the bus) and ``foreshock drill`` (the fire drill).

This module is the mitigator's composition root: it builds the bus, the scheduler adapter (by
name), the command channel, the job source, the audit log and the policy, and passes them in.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from enum import StrEnum
from pathlib import Path

import typer

from foreshock.commands.durations import option_seconds as _seconds
from mitigator.drill import COMPONENTS, EXTRA_SCENARIOS, SCENARIOS, DrillSettings, run_drill

__all__ = ["register"]


class SchedulerName(StrEnum):
    slurm = "slurm"
    kubernetes = "kubernetes"
    none = "none"


def _scheduler(name: SchedulerName, kube_selector: str | None):
    from mitigator.schedulers import SCHEDULERS

    if name is SchedulerName.kubernetes:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return SCHEDULERS["kubernetes"](api=client.CoreV1Api(), pod_selector=kube_selector)
    return SCHEDULERS[name.value]()


def mitigate(
    kafka: str = typer.Option(..., "--kafka", help="Kafka bootstrap host:port"),
    scheduler: SchedulerName = typer.Option(SchedulerName.none, "--scheduler", help="who drains nodes"),
    dry_run: bool = typer.Option(False, "--dry-run", help="record what would be done; touch nothing"),
    audit: Path = typer.Option(Path("foreshock-audit.sqlite"), "--audit", help="SQLite audit log"),
    control_dir: Path | None = typer.Option(
        None,
        "--control-dir",
        help="shared folder: file command channel + the hooks' job status; "
        "omitted: commands go over mitigation.events",
    ),
    spare: list[str] = typer.Option([], "--spare", help="a spare node (repeat the flag)"),
    fleet_size: int | None = typer.Option(
        None, "--fleet-size", help="nodes in the cluster (circuit breaker)"
    ),
    watch_at: float = typer.Option(0.3, "--watch-at", help="probability that puts a node on watch"),
    clear_below: float = typer.Option(0.2, "--clear-below", help="probability below which the risk clears"),
    restart: str = typer.Option("10m", "--restart", help="time a crashed job needs to restart"),
    migration: str = typer.Option("2m", "--migration", help="time a migration onto a spare takes"),
    max_drains: int = typer.Option(2, "--max-drains", help="cap on nodes draining/drained at once"),
    job_share: float = typer.Option(0.25, "--job-share", help="max share of a job's nodes moved at once"),
    breaker_share: float = typer.Option(
        0.05,
        "--breaker-share",
        help="share of the fleet drained within --breaker-window that stops new drains",
    ),
    breaker_window: str = typer.Option("1h", "--breaker-window"),
    kube_selector: str | None = typer.Option(
        None, "--kube-selector", help="label selector of job pods to evict"
    ),
    group: str = typer.Option("foreshock-mitigator", "--group", help="Kafka consumer group"),
    policy: str = typer.Option("expected-loss", "--policy", help="decision policy, by registered name"),
    pin: str | None = typer.Option(None, "--pin", help="publish a pin request for NODE and exit"),
    unpin: str | None = typer.Option(None, "--unpin", help="publish an unpin request for NODE and exit"),
    run_for: str | None = typer.Option(
        None, "--run-for", help="stop after this long (default: until signalled)"
    ),
) -> None:
    """Turn risk scores into safe, audited actions (checkpoint, migrate, drain)."""
    from foreshock.commands.brokers import connect_kafka
    from ingest.stream import publish
    from mitigator.audit import AuditLog
    from mitigator.channels import CHANNELS
    from mitigator.engine import MitigationEngine
    from mitigator.executor import Executor
    from mitigator.jobs import FileJobs, StaticJobs
    from mitigator.policy import POLICIES, PolicyConfig
    from mitigator.service import MitigationService, pin_request

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    stop_after = _seconds(run_for, "--run-for") if run_for else None
    bus = connect_kafka(kafka, "mitigate")
    if pin or unpin:
        publish(bus, [pin_request(pin or unpin, pinned=bool(pin), reason="cli")])
        bus.flush()
        bus.close()
        typer.echo(f"{'pin' if pin else 'unpin'} request for {pin or unpin} published")
        return
    if policy not in POLICIES:
        known = ", ".join(POLICIES)
        raise typer.BadParameter(f"unknown policy {policy!r}; known: {known}", param_hint="--policy")
    try:
        config = PolicyConfig(
            watch_at=watch_at,
            clear_below=clear_below,
            restart_s=_seconds(restart, "--restart"),
            migration_s=_seconds(migration, "--migration"),
            max_concurrent_drains=max_drains,
            max_job_share=job_share,
            breaker_share=breaker_share,
            breaker_window_ms=int(_seconds(breaker_window, "--breaker-window") * 1000),
            spare_nodes=tuple(spare),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    channel = CHANNELS["file"](control_dir) if control_dir else CHANNELS["topic"](bus)
    jobs = FileJobs(control_dir) if control_dir else StaticJobs()
    executor = Executor(
        AuditLog(audit, bus=bus),
        scheduler=_scheduler(scheduler, kube_selector),
        channel=channel,
        acks=channel,
        dry_run=dry_run,
    )
    service = MitigationService(
        bus,
        MitigationEngine(POLICIES[policy](config), jobs=jobs, fleet_size=fleet_size),
        executor,
        group=group,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if stop_after is not None:
        threading.Timer(stop_after, stop.set).start()
    try:
        service.run(stop)
    finally:
        service.close()
        bus.close()


def drill(
    as_json: bool = typer.Option(False, "--json", help="print the figures as one JSON object"),
    state_mb: int = typer.Option(64, "--state-mb", min=1, max=1024,
                                 help="parameters + optimizer state per rank, MiB (up to 1 GiB)"),
    memory_every: int = typer.Option(1, "--memory-every", min=1, help="memory snapshot interval (steps)"),
    durable_every: int = typer.Option(20, "--durable-every", "--every", min=1,
                                      help="durable snapshot interval (steps)"),
    step_seconds: float = typer.Option(0.0, "--step-seconds", help="extra simulated compute per step"),
    scenarios: str = typer.Option(",".join(SCENARIOS), "--scenarios",
                                  help=f"comma-separated scenarios; also: {', '.join(EXTRA_SCENARIOS)}"),
    workdir: Path | None = typer.Option(None, "--workdir", help="keep logs and snapshots here"),
) -> None:
    """Fire drill: a torchrun job on this machine loses nodes, warned and not; print each recovery."""
    names = tuple(n.strip() for n in scenarios.split(",") if n.strip())
    unknown = sorted(set(names) - set(SCENARIOS + EXTRA_SCENARIOS))
    if unknown:
        raise typer.BadParameter(f"unknown scenario(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(SCENARIOS + EXTRA_SCENARIOS)}",
                                 param_hint="--scenarios")
    settings = DrillSettings(state_mb=state_mb, memory_every=memory_every, durable_every=durable_every,
                             step_seconds=step_seconds, scenarios=names)
    result = run_drill(settings, workdir=workdir)
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"state {state_mb} MiB per rank; memory snapshot every {memory_every} step(s), durable every "
               f"{durable_every}; stall p50 {result['stall_ms_p50']} ms, p99 {result['stall_ms_p99']} ms")
    typer.echo(f"{'scenario':16} {'steps lost':>10} {'recovery s':>10} {'source':>8} {'exact':>6}  "
               + " ".join(f"{c:>12}" for c in COMPONENTS))
    for r in result["scenarios"]:
        parts = " ".join(f"{r['components_seconds'][c]:>12.2f}" for c in COMPONENTS)
        typer.echo(f"{r['name']:16} {r['steps_lost']:>10} {r['recovery_seconds']:>10.2f} "
                   f"{r['restore_source'] or '-':>8} {'yes' if r['bit_exact'] else 'NO':>6}  {parts}")
    bw = ", ".join(f"{k} {v} GB/s" for k, v in result["bandwidth_gb_per_s"].items() if v is not None)
    typer.echo(f"bandwidths: {bw}")


def register(app: typer.Typer) -> None:
    """Add ``mitigate`` and ``drill``."""
    app.command("mitigate")(mitigate)
    app.command("drill")(drill)
