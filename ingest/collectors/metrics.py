"""Prometheus metrics of one ``foreshock collect`` process (``foreshock_collector_*``, base units).

What an operator needs to tell that a collector has gone quiet or is losing data: records
published by topic, Xid events by code, the source's read and parse errors, when the source was
last read successfully, and while the broker is unreachable, the backlog the outbox holds.
Counts that another object keeps (the collector's ``failures`` and ``parse_errors``, see
:mod:`foreshock.ingest.collectors.base`, and the outbox's) are read when Prometheus scrapes, so
the poll loop pays for none of them. One process runs one collector; ``foreshock_collector_info``
names its source and node, and no series carries a per-GPU or per-record label.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foreshock.ingest.contract import XidEvent, topic_of

__all__ = ["CollectorMetrics"]


class CollectorMetrics:
    """The collect loop's metrics in their own registry; :meth:`polled` after every poll."""

    def __init__(self, source: str, node: str, interval_s: float, *, collector: Any = None,
                 outbox: Any = None, clock: Callable[[], float] = time.time,
                 registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.clock = clock
        self.collector = collector
        r = self.registry
        Gauge("foreshock_collector_info", "The collector this process runs (value 1).", ["source", "node"],
              registry=r).labels(source=source, node=node).set(1)
        Gauge("foreshock_collector_interval_seconds", "Time between two polls (--interval).",
              registry=r).set(interval_s)
        self.polls = Counter("foreshock_collector_polls_total", "Polls of the source.", registry=r)
        self.published = Counter("foreshock_collector_records_published_total",
                                 "Records handed to the bus (or stdout), by topic.", ["topic"], registry=r)
        self.xids = Counter("foreshock_collector_xid_events_total",
                            "Xid events seen (a folded run counts each repeat), by Xid code.", ["xid"],
                            registry=r)
        self.last_success = Gauge("foreshock_collector_last_success_timestamp_seconds",
                                  "When a poll last read the source without a failure.", registry=r)
        self._failures_seen = 0
        r.register(_Kept(self))
        if outbox is not None:
            r.register(_Backlog(outbox))

    def polled(self, records: Iterable[Any]) -> None:
        """Count one poll's records; a poll during which the source's failures did not grow succeeded."""
        self.polls.inc()
        for record in records:
            self.published.labels(topic=topic_of(record)).inc()
            if isinstance(record, XidEvent):
                self.xids.labels(xid=str(record.xid)).inc(record.count)
        failures = getattr(self.collector, "failures", 0)
        if failures == self._failures_seen:
            self.last_success.set(self.clock())
        self._failures_seen = failures

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Kept(Collector):
    """The collector's own counts (``failures``, ``parse_errors``), as counters, at scrape time."""

    def __init__(self, metrics: CollectorMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        c = self.metrics.collector
        yield CounterMetricFamily("foreshock_collector_read_errors",
                                  "Reads of the source that failed (unreachable endpoint, failed command).",
                                  value=getattr(c, "failures", 0))
        yield CounterMetricFamily("foreshock_collector_parse_errors",
                                  "Input read from the source that could not be turned into records.",
                                  value=getattr(c, "parse_errors", 0))


class _Backlog(Collector):
    """The outbox (``--kafka``): what waits for the broker, and what was delivered or dropped."""

    def __init__(self, outbox: Any):
        self.outbox = outbox

    def collect(self) -> Iterator[Metric]:
        o = self.outbox
        yield GaugeMetricFamily("foreshock_collector_buffered_records",
                                "Records waiting for the broker (memory, in flight and spool).",
                                value=o.pending_records())
        yield CounterMetricFamily("foreshock_collector_records_delivered",
                                  "Records the broker acknowledged.", value=o.records_sent)
        yield CounterMetricFamily("foreshock_collector_records_dropped",
                                  "Records dropped by a full buffer (oldest polls first).",
                                  value=o.records_dropped)
