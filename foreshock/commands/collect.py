"""``foreshock collect`` (run a collector until stopped) and ``foreshock parse`` (normalize a captured file).

Collectors come from :mod:`ingest.collectors` by name; this module only wires the outside world
in (paths, URL, clock, the bus) and runs the loop: poll, publish, sleep until the next interval.
SIGTERM or SIGINT stops the loop; the collector's held-back records (folded Xid counts) are
drained and published, the bus is flushed, and the process exits 0.
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

from foreshock.commands.durations import option_seconds as _seconds
from ingest.collectors import (
    CollectorOptions,
    CollectorUnavailable,
    Draining,
    create_collector,
    parser_for,
)
from ingest.collectors.xid_policy import load_xid_policy
from ingest.contract import TELEMETRY_TOPICS, encode

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


def _kafka_sink(bootstrap: str, source: str) -> tuple[Callable[[list[Any]], None], Callable[[], None]]:
    """Publish each poll's records (one message per topic and node) and flush; exit 1 if unreachable."""
    from foreshock.commands.brokers import connect_kafka
    from ingest.stream import publish

    bus = connect_kafka(bootstrap, "collect", TELEMETRY_TOPICS, client_id=f"foreshock-collect-{source}")

    def sink(records: list[Any]) -> None:
        if records:
            publish(bus, records)
            bus.flush()

    return sink, bus.close


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


def register(app: typer.Typer) -> None:
    """Add ``collect`` and ``parse`` to ``app``."""

    @app.command("collect")
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
        interval: str = typer.Option("10s", "--interval", help="Time between polls (10s, 1m, ...)."),
        kafka: str = typer.Option(None, "--kafka", help="Kafka bootstrap servers to publish to."),
        stdout: bool = typer.Option(False, "--stdout", help="Print JSON lines instead of publishing."),
        xid_policy: Path = typer.Option(None, "--xid-policy", help="Operator CSV merged over the "
                                        "shipped Xid policy."),
        fold_window: str = typer.Option("10s", "--fold-window", help="Identical Xids within this "
                                        "window are folded into one counted event."),
        polls: int = typer.Option(None, "--polls", help="Stop after this many polls (smoke runs)."),
    ) -> None:
        """Run a collector until stopped (SIGTERM flushes and exits 0)."""
        if (kafka is None) == (not stdout):
            raise typer.BadParameter("give exactly one of --kafka BOOTSTRAP or --stdout")
        if node is None and source not in _CLUSTER_WIDE:
            raise typer.BadParameter(f"--source {source.value} needs --node", param_hint="--node")
        interval_s = _seconds(interval, "--interval")
        _check_policy(xid_policy)
        options = CollectorOptions(node=node or "", path=path, url=url, journal=journal,
                                   xid_policy_override=xid_policy,
                                   fold_window_ms=int(_seconds(fold_window, "--fold-window") * 1000))
        sink, close_sink = _kafka_sink(kafka, source.value) if kafka is not None else (_stdout_sink, None)
        try:
            try:
                collector = create_collector(source.value, options)
            except CollectorUnavailable as exc:
                typer.echo(f"foreshock collect: {exc}", err=True)
                raise typer.Exit(1) from None
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            typer.echo(f"collecting {source.value} on {node or 'the cluster'} every {interval} -> "
                       f"{'kafka ' + kafka if kafka else 'stdout'}", err=True)
            run_collector(collector, sink, interval_s, stop, polls)
        finally:
            if close_sink is not None:
                close_sink()

    @app.command("parse")
    def parse(
        kind: CapturedKind = typer.Argument(..., help="kmsg (kernel log), dcgm (exporter scrape) or ib "
                                            "(sysfs dump of `path: value` lines)."),
        file: Path = typer.Argument(..., help="The captured file."),
        node: str = typer.Option(None, "--node", help="Node id for the records (dcgm default: the "
                                 "Hostname label; others: 'unknown')."),
        xid_policy: Path = typer.Option(None, "--xid-policy", help="Operator CSV merged over the "
                                        "shipped Xid policy."),
        fold_window: str = typer.Option("10s", "--fold-window", help="Identical Xids within this "
                                        "window are folded."),
    ) -> None:
        """Print a captured file's normalized records as JSON lines; counts on stderr."""
        _check_policy(xid_policy)
        options = CollectorOptions(node=node or ("" if kind is CapturedKind.dcgm else "unknown"),
                                   xid_policy_override=xid_policy,
                                   fold_window_ms=int(_seconds(fold_window, "--fold-window") * 1000))
        try:
            with open(file, "rb") as handle:
                result = parser_for(kind.value)(handle, options)
        except OSError as exc:
            typer.echo(f"foreshock parse: cannot read {file}: {exc.strerror}", err=True)
            raise typer.Exit(2) from None
        _stdout_sink(result.records)
        typer.echo(f"{file}: {result.report.summary()}, {len(result.records)} records", err=True)

