"""``foreshock collect`` (run a collector until stopped) and ``foreshock parse`` (normalize a captured file).

Collectors come from :mod:`foreshock.ingest.collectors` by name; this module only wires the outside world
in (paths, URL, clock, the bus) and runs the loop: poll, queue, sleep until the next interval.
With ``--kafka`` the loop never waits on the broker: each poll's messages go into an
:class:`foreshock.ingest.outbox.Outbox` (memory, then ``--spool-dir`` on disk, both bounded; a full buffer
drops the oldest polls and counts them), and its sender thread delivers them in order whenever the
broker answers. SIGTERM or SIGINT stops the loop; the collector's held-back records (folded Xid
counts) are drained and queued, the outbox gets ``--flush-timeout`` to deliver what is left (the
rest stays in the spool, or is counted as unsent), one line on stderr says what was collected,
delivered and dropped, and the process exits 0. ``--metrics-port`` serves the collector's
Prometheus metrics (:mod:`foreshock.ingest.collectors.metrics`) on ``/metrics``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from foreshock.commands.durations import Duration, duration_option
from foreshock.commands.sizes import option_bytes
from foreshock.ingest.collectors import (
    CollectorOptions,
    CollectorUnavailable,
    Draining,
    create_collector,
    parser_for,
)
from foreshock.ingest.collectors.metrics import CollectorMetrics
from foreshock.ingest.collectors.xid_policy import load_xid_policy
from foreshock.ingest.contract import TELEMETRY_TOPICS, encode
from foreshock.ingest.outbox import Outbox
from foreshock.ingest.spool import Message, Spool

__all__ = ["register", "run_collector"]


class Source(StrEnum):
    nvml = "nvml"
    dcgm = "dcgm"
    kmsg = "kmsg"
    ib = "ib"
    slurm = "slurm"
    kubernetes = "kubernetes"


_CLUSTER_WIDE = frozenset({Source.slurm, Source.kubernetes})  # node names come from the scheduler


class CapturedKind(StrEnum):
    kmsg = "kmsg"
    dcgm = "dcgm"
    ib = "ib"


def _check_policy(override: Path | None) -> None:
    """Fail on a bad operator policy file before any collector starts."""
    if override is None:
        return
    try:
        load_xid_policy(override)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--xid-policy") from None


def _stdout_sink(records: list[Any]) -> None:
    out = sys.stdout.buffer
    for record in records:
        out.write(encode(record) + b"\n")
    out.flush()


class _Messages:
    """A bus that only keeps what it is sent, so a poll's grouping into messages is ``publish``'s own."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.messages.append((topic, key, value))


def _messages(records: list[Any]) -> list[Message]:
    """One message per (topic, node) holding all of that node's records, as
    ``foreshock.ingest.stream.publish``."""
    from foreshock.ingest.stream import publish

    out = _Messages()
    publish(out, records)
    return out.messages


def _kafka_outbox(bootstrap: str, source: str, memory_bytes: int, spool_dir: Path | None,
                  spool_bytes: int) -> tuple[Outbox, Any]:
    """A started outbox delivering to Kafka through a producer whose every wait is bounded; exit 1
    if the broker is unreachable at start."""
    from foreshock.commands.brokers import connect_kafka
    from foreshock.ingest.kafka_bus import BOUNDED_PRODUCER

    bus = connect_kafka(bootstrap, "collect", TELEMETRY_TOPICS, client_id=f"foreshock-collect-{source}",
                        producer_config=BOUNDED_PRODUCER)
    spool = Spool(spool_dir, spool_bytes) if spool_dir is not None else None
    return Outbox(bus.deliver, memory_bytes=memory_bytes, spool=spool).start(), bus


def _serve_metrics(metrics: CollectorMetrics, host: str, port: int) -> None:
    """``/metrics`` on ``host:port`` from a daemon thread; a port that cannot be bound is exit 1."""
    from prometheus_client import start_http_server

    try:
        start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        typer.echo(f"foreshock collect: cannot serve /metrics on {host}:{port}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None


def run_collector(collector: Any, sink: Callable[[list[Any]], None], interval_s: float,
                  stop: threading.Event, max_polls: int | None = None) -> int:
    """Poll ``collector`` every ``interval_s`` into ``sink`` until ``stop`` is set; drain; return polls."""
    polls = 0
    while not stop.is_set():
        started = time.monotonic()
        sink(collector.collect())
        polls += 1
        if max_polls is not None and polls >= max_polls:
            break
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    if isinstance(collector, Draining):
        sink(collector.drain())
    return polls


def collect(
    source: Source = typer.Option(..., "--source", help="Which collector: nvml, dcgm, kmsg, ib, or "
                                  "slurm / kubernetes (node states of the whole cluster, one per "
                                  "cluster)."),
    node: str = typer.Option(None, "--node", help="Node id the records carry (the Kafka key); not for "
                             "slurm / kubernetes, whose records carry the scheduler's node names."),
    url: str = typer.Option(None, "--url", help="dcgm: dcgm-exporter metrics URL "
                            "(default http://localhost:9400/metrics)."),
    path: Path = typer.Option(None, "--path", help="kmsg: /dev/kmsg (default) or a log file to replay "
                              "and follow; ib: sysfs root (default /sys/class/infiniband); slurm, "
                              "kubernetes: state file of the node states last published (kept across "
                              "restarts)."),
    journal: bool = typer.Option(False, "--journal", help="kmsg: follow `journalctl -k` instead."),
    interval: Duration = duration_option("10s", "--interval", help="Time between polls (10s, 1m, ...)."),
    kafka: str = typer.Option(None, "--kafka", help="Kafka bootstrap servers to publish to."),
    stdout: bool = typer.Option(False, "--stdout", help="Print JSON lines instead of publishing."),
    xid_policy: Path = typer.Option(None, "--xid-policy", help="Operator CSV merged over the "
                                    "shipped Xid policy."),
    fold_window: Duration = duration_option("10s", "--fold-window", help="Identical Xids within this "
                                    "window are folded into one counted event."),
    polls: int = typer.Option(None, "--polls", help="Stop after this many polls (smoke runs)."),
    buffer: str = typer.Option("16MiB", "--buffer", help="--kafka: memory for polls the broker has "
                               "not acknowledged yet (an outage's backlog), before --spool-dir."),
    spool_dir: Path = typer.Option(None, "--spool-dir", help="--kafka: directory for the backlog "
                                   "that does not fit in --buffer; kept across restarts and sent "
                                   "first by the next start."),
    spool_size: str = typer.Option("1GiB", "--spool-size", help="--kafka: most disk --spool-dir "
                                   "takes. When memory and spool are full the oldest polls are "
                                   "dropped, counted and logged."),
    flush_timeout: Duration = duration_option("10s", "--flush-timeout", help="--kafka: on SIGTERM, time to "
                                      "deliver the backlog; what is left stays in --spool-dir or is "
                                      "reported as unsent."),
    metrics_port: int = typer.Option(0, "--metrics-port", min=0, max=65535,
                                     help="Port of the Prometheus /metrics endpoint; 0: off."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address /metrics listens on."),
) -> None:
    """Run a collector until stopped (SIGTERM flushes and exits 0)."""
    if (kafka is None) == (not stdout):
        raise typer.BadParameter("give exactly one of --kafka BOOTSTRAP or --stdout")
    if node is None and source not in _CLUSTER_WIDE:
        raise typer.BadParameter(f"--source {source.value} needs --node", param_hint="--node")
    interval_s = interval.seconds
    flush_s = flush_timeout.seconds
    memory_bytes, spool_bytes = option_bytes(buffer, "--buffer"), option_bytes(spool_size, "--spool-size")
    _check_policy(xid_policy)
    options = CollectorOptions(node=node or "", path=path, url=url, journal=journal,
                               xid_policy_override=xid_policy,
                               fold_window_ms=fold_window.ms)
    outbox, bus = (_kafka_outbox(kafka, source.value, memory_bytes, spool_dir, spool_bytes)
                   if kafka is not None else (None, None))
    deliver = _stdout_sink if outbox is None else (
        lambda records: outbox.put(_messages(records), len(records)))
    try:
        try:
            collector = create_collector(source.value, options)
        except CollectorUnavailable as exc:
            typer.echo(f"foreshock collect: {exc}", err=True)
            raise typer.Exit(1) from None
        metrics = CollectorMetrics(source.value, node or "", interval_s, collector=collector,
                                   outbox=outbox)
        if metrics_port:
            _serve_metrics(metrics, metrics_host, metrics_port)

        def sink(records: list[Any]) -> None:
            metrics.polled(records)
            deliver(records)

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        typer.echo(f"collecting {source.value} on {node or 'the cluster'} every {interval} -> "
                   f"{'kafka ' + kafka if kafka else 'stdout'}", err=True)
        run_collector(collector, sink, interval_s, stop, polls)
    finally:
        if outbox is not None:
            summary = outbox.close(flush_s)
            # What is still unacknowledged was spooled or counted above: no more waiting for it.
            bus.close(timeout_s=0.0 if summary.records_unsent or summary.records_spooled else 1.0)
            typer.echo(f"foreshock collect: {summary.line()}", err=True)

def parse(
    kind: CapturedKind = typer.Argument(..., help="kmsg (kernel log), dcgm (exporter scrape) or ib "
                                        "(sysfs dump of `path: value` lines)."),
    file: Path = typer.Argument(..., help="The captured file."),
    node: str = typer.Option(None, "--node", help="Node id for the records (dcgm default: the "
                             "Hostname label; others: 'unknown')."),
    xid_policy: Path = typer.Option(None, "--xid-policy", help="Operator CSV merged over the "
                                    "shipped Xid policy."),
    fold_window: Duration = duration_option("10s", "--fold-window", help="Identical Xids within this "
                                    "window are folded."),
) -> None:
    """Print a captured file's normalized records as JSON lines; counts on stderr."""
    _check_policy(xid_policy)
    options = CollectorOptions(node=node or ("" if kind is CapturedKind.dcgm else "unknown"),
                               xid_policy_override=xid_policy,
                               fold_window_ms=fold_window.ms)
    try:
        with open(file, "rb") as handle:
            result = parser_for(kind.value)(handle, options)
    except OSError as exc:
        typer.echo(f"foreshock parse: cannot read {file}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    _stdout_sink(result.records)
    typer.echo(f"{file}: {result.report.summary()}, {len(result.records)} records", err=True)


def register(app: typer.Typer) -> None:
    """Add ``collect`` and ``parse`` to ``app``."""
    app.command("collect")(collect)
    app.command("parse")(parse)
