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

from foreshock.commands.durations import Duration, duration_option
from foreshock.mitigator.drill import COMPONENTS, EXTRA_SCENARIOS, SCENARIOS, DrillSettings, run_drill
from foreshock.mitigator.drill_mitigation import DrillParts
from foreshock.models.reliability import DEFAULT_BURN_IN, SECONDS_PER_DAY

__all__ = ["register"]


class SchedulerName(StrEnum):
    slurm = "slurm"
    kubernetes = "kubernetes"
    none = "none"


class BusName(StrEnum):
    memory = "memory"
    kafka = "kafka"


def _scheduler(name: SchedulerName, kube_selector: str | None, timeout_s: float, command: str = "mitigate"):
    """The adapter by name; a cluster that cannot be configured is one line on stderr, exit 1."""
    from foreshock.mitigator.schedulers import SCHEDULERS

    if name is SchedulerName.kubernetes:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config()
            except (config.ConfigException, OSError) as exc:
                _fail(f"no Kubernetes configuration (in-cluster or kubeconfig): {exc}", command)
        api = client.CoreV1Api()
        return SCHEDULERS["kubernetes"](api=api, pod_selector=kube_selector, timeout_s=timeout_s)
    if name is SchedulerName.slurm:
        return SCHEDULERS["slurm"](timeout_s=timeout_s)
    return SCHEDULERS[name.value]()


def _fail(message: str, command: str = "mitigate") -> None:
    typer.echo(f"foreshock {command}: {message}", err=True)
    raise typer.Exit(1)


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
    restart: Duration = duration_option("10m", "--restart", help="time a crashed job needs to restart"),
    migration: Duration = duration_option("2m", "--migration", help="time a migration onto a spare takes"),
    max_drains: int = typer.Option(2, "--max-drains", help="cap on nodes draining/drained at once"),
    job_share: float = typer.Option(0.25, "--job-share", help="max share of a job's nodes moved at once"),
    breaker_share: float = typer.Option(
        0.05,
        "--breaker-share",
        help="share of the fleet drained within --breaker-window that stops new drains",
    ),
    breaker_window: Duration = duration_option(
        "1h", "--breaker-window", help="sliding window the breaker counts drains over"
    ),
    reset_breaker: bool = typer.Option(
        False, "--reset-breaker", help="publish an (audited) reset of a tripped circuit breaker and exit"
    ),
    burn_in: Duration = duration_option(
        f"{DEFAULT_BURN_IN.length_s / 3600:g}h", "--burn-in",
        help="how long a node back from repair with --burn-in-failures failures within --burn-in-window "
             "stays drained (no spare, no job) without a new fault before it returns; 0: no burn-in "
             "(the defaults are what the real trace's repeat-failure curve gives)",
    ),
    burn_in_failures: int = typer.Option(
        DEFAULT_BURN_IN.failures, "--burn-in-failures",
        help="failures within --burn-in-window (the one just repaired included) that call for a burn-in",
    ),
    burn_in_window: Duration = duration_option(
        f"{DEFAULT_BURN_IN.window_s / SECONDS_PER_DAY:g}d", "--burn-in-window",
        help="window the failures are counted in",
    ),
    clear_burn_in: str | None = typer.Option(
        None, "--clear-burn-in", help="publish an (audited) end of NODE's burn-in (back to service) and exit"
    ),
    horizon: Duration = duration_option(
        "15m", "--horizon", help="risk records older than this at receipt are rejected (dead-lettered)"
    ),
    clock_tolerance: Duration = duration_option(
        "2m", "--clock-tolerance", help="risk records dated further ahead of receipt are rejected"
    ),
    scheduler_timeout: Duration = duration_option(
        "15s", "--scheduler-timeout", help="bound on each scheduler call (scontrol, Kubernetes request)"
    ),
    reconcile_every: Duration = duration_option(
        "30s", "--reconcile-every",
        help="read the scheduler's state this often and reconcile each node with it; 0: only at start",
    ),
    workers: int = typer.Option(4, "--workers", min=1, help="actions run at once (one per node)"),
    metrics_port: int = typer.Option(
        9403, "--metrics-port", help="port of /metrics, /status, /readyz; 0: off"
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", help="address of /metrics, /status, /readyz"
    ),
    kube_selector: str | None = typer.Option(
        None, "--kube-selector", help="label selector of job pods to evict"
    ),
    group: str = typer.Option("foreshock-mitigator", "--group", help="Kafka consumer group"),
    policy: str = typer.Option("expected-loss", "--policy", help="decision policy, by registered name"),
    pin: str | None = typer.Option(None, "--pin", help="publish a pin request for NODE and exit"),
    unpin: str | None = typer.Option(None, "--unpin", help="publish an unpin request for NODE and exit"),
    run_for: Duration | None = duration_option(
        None, "--run-for", help="stop after this long (default: until signalled)"
    ),
) -> None:
    """Turn risk scores into safe, audited actions (checkpoint, migrate, drain)."""
    from foreshock.commands.brokers import connect_kafka
    from foreshock.ingest.stream import publish
    from foreshock.mitigator.audit import AuditLog, AuditUnavailable
    from foreshock.mitigator.channels import CHANNELS
    from foreshock.mitigator.endpoint import StatusServer
    from foreshock.mitigator.engine import MitigationEngine
    from foreshock.mitigator.executor import Executor
    from foreshock.mitigator.jobs import FileJobs, StaticJobs
    from foreshock.mitigator.policy import POLICIES, PolicyConfig
    from foreshock.mitigator.service import (
        MitigationService,
        breaker_reset_request,
        burn_in_clear_request,
        pin_request,
    )
    from foreshock.models.reliability import BurnIn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    stop_after = run_for.seconds if run_for else None
    burn_in_s = burn_in.seconds
    try:
        rule = BurnIn(failures=burn_in_failures, window_s=burn_in_window.seconds,
                      length_s=burn_in_s) if burn_in_s > 0 else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--burn-in-failures") from None
    bus = connect_kafka(kafka, "mitigate")
    if pin or unpin or reset_breaker or clear_burn_in:
        if reset_breaker:
            request = breaker_reset_request("cli")
        elif clear_burn_in:
            request = burn_in_clear_request(clear_burn_in, reason="cli")
        else:
            request = pin_request(pin or unpin, pinned=bool(pin), reason="cli")
        publish(bus, [request])
        bus.flush()
        bus.close()
        what = "burn-in clear" if clear_burn_in else request.action
        typer.echo(f"{what} request{'' if reset_breaker else ' for ' + request.node} published")
        return
    if policy not in POLICIES:
        known = ", ".join(POLICIES)
        raise typer.BadParameter(f"unknown policy {policy!r}; known: {known}", param_hint="--policy")
    try:
        config = PolicyConfig(
            watch_at=watch_at,
            clear_below=clear_below,
            restart_s=restart.seconds,
            migration_s=migration.seconds,
            max_concurrent_drains=max_drains,
            max_job_share=job_share,
            breaker_share=breaker_share,
            breaker_window_ms=breaker_window.ms,
            spare_nodes=tuple(spare),
            burn_in=rule,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        engine = MitigationEngine(
            POLICIES[policy](config),
            jobs=FileJobs(control_dir) if control_dir else StaticJobs(),
            fleet_size=fleet_size,
            horizon_ms=horizon.ms,
            future_tolerance_ms=clock_tolerance.ms,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    sched = _scheduler(scheduler, kube_selector, scheduler_timeout.seconds)
    channel = CHANNELS["file"](control_dir) if control_dir else CHANNELS["topic"](bus)
    try:
        audit_log = AuditLog(audit, bus=bus)
        executor = Executor(audit_log, scheduler=sched, channel=channel, acks=channel, dry_run=dry_run,
                            workers=workers)
        service = MitigationService(bus, engine, executor, group=group,
                                    reconcile_every_s=reconcile_every.seconds)
    except AuditUnavailable as exc:
        _fail(str(exc))
    status = None
    if metrics_port:
        try:
            status = StatusServer(service, metrics_host, metrics_port).start()
        except OSError as exc:
            _fail(f"cannot serve /metrics on {metrics_host}:{metrics_port}: {exc}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if stop_after is not None:
        threading.Timer(stop_after, stop.set).start()
    try:
        service.run(stop)
    finally:
        if status is not None:
            status.stop()
        service.close()
        audit_log.close()  # a clean close leaves no WAL behind
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
    bus: BusName = typer.Option(BusName.memory, "--bus", help="where risk scores and the audit travel"),
    kafka: str | None = typer.Option(None, "--kafka", help="Kafka bootstrap host:port (with --bus kafka)"),
    scheduler: SchedulerName = typer.Option(SchedulerName.none, "--scheduler",
                                            help="who drains the warned node"),
    nodes: str = typer.Option("A,B,C,D", "--nodes",
                              help="the drill's node names: two trainers, then the spares (with "
                                   "--scheduler, nodes the scheduler knows; D only for pair_lost)"),
    kube_selector: str | None = typer.Option(None, "--kube-selector",
                                             help="label selector of the pods to evict"),
    scheduler_timeout: Duration = duration_option("15s", "--scheduler-timeout",
                                                  help="bound on each scheduler call"),
) -> None:
    """Fire drill: a torchrun job on this machine loses nodes, warned and not; print each recovery."""
    names = tuple(n.strip() for n in scenarios.split(",") if n.strip())
    unknown = sorted(set(names) - set(SCENARIOS + EXTRA_SCENARIOS))
    if unknown:
        raise typer.BadParameter(f"unknown scenario(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(SCENARIOS + EXTRA_SCENARIOS)}",
                                 param_hint="--scenarios")
    try:
        settings = DrillSettings(state_mb=state_mb, memory_every=memory_every, durable_every=durable_every,
                                 step_seconds=step_seconds, scenarios=names,
                                 nodes=tuple(n.strip() for n in nodes.split(",") if n.strip()))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--nodes") from None
    if bus is BusName.kafka and not kafka:
        raise typer.BadParameter("--bus kafka needs --kafka HOST:PORT", param_hint="--kafka")
    timeout_s = scheduler_timeout.seconds
    parts = _drill_parts(bus, kafka, scheduler, kube_selector, timeout_s)
    try:
        result = run_drill(settings, workdir=workdir, parts=parts)
    finally:
        if parts.bus is not None:
            parts.bus.close()
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


def _drill_parts(bus: BusName, kafka: str | None, scheduler: SchedulerName, kube_selector: str | None,
                 timeout_s: float) -> DrillParts:
    """The drill's bus and scheduler: a broker that others share is read from its end only."""
    from foreshock.commands.brokers import connect_kafka

    sched = None
    if scheduler is not SchedulerName.none:
        sched = _scheduler(scheduler, kube_selector, timeout_s, command="drill")
    if bus is BusName.memory:
        return DrillParts(scheduler=sched, scheduler_name=scheduler.value)
    return DrillParts(bus=connect_kafka(kafka, "drill"), bus_name="kafka", scheduler=sched,
                      scheduler_name=scheduler.value, consumer_config={"auto_offset_reset": "latest"})


def register(app: typer.Typer) -> None:
    """Add ``mitigate`` and ``drill``."""
    app.command("mitigate")(mitigate)
    app.command("drill")(drill)
