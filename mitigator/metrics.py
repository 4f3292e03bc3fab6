"""Prometheus metrics of the mitigator (``foreshock_mitigator_*``, base units, no node labels).

Every block is counted here as well as audited and logged: a breaker that is open, a drain a rail
held back, a record rejected for its time, a pause because the audit log cannot be written. The
service owns the registry, so two services in one process never share counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from foreshock.mitigator.plan import JobView

__all__ = ["MitigatorMetrics"]


class MitigatorMetrics:
    """The mitigator's counters and gauges in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("foreshock_mitigator_records_total",
                               "Records taken in (risk scores, node events, operator requests).", registry=r)
        self.rejected = Counter("foreshock_mitigator_records_rejected_total",
                                "Risk records rejected for their time (future or stale), dead-lettered.",
                                ["reason"], registry=r)
        self.blocked = Counter("foreshock_mitigator_drains_blocked_total",
                               "Wanted drains held back, by the rail that held them (once per episode).",
                               ["rail"], registry=r)
        self.actions = Counter("foreshock_mitigator_actions_total",
                               "Actions ended, by kind and outcome.", ["action", "status"], registry=r)
        self.breaker_open = Gauge("foreshock_mitigator_breaker_open",
                                  "1 while the circuit breaker is open (latched until an operator reset).",
                                  registry=r)
        self.drains_in_window = Gauge("foreshock_mitigator_breaker_window_drains",
                                      "Drains planned within the breaker's window.", registry=r)
        self.breaker_limit = Gauge("foreshock_mitigator_breaker_limit_drains",
                                   "Drains the breaker allows within its window.", registry=r)
        self.nodes = Gauge("foreshock_mitigator_nodes", "Nodes known to the mitigator, by state.", ["state"],
                           registry=r)
        self.in_flight = Gauge("foreshock_mitigator_actions_in_flight",
                               "Actions recorded as planned that have not ended (running or retrying).",
                               registry=r)
        self.paused = Gauge("foreshock_mitigator_paused",
                            "1 while the mitigator does not act because its audit log cannot be written.",
                            registry=r)
        self.cold_start_resumed = Gauge("foreshock_mitigator_cold_start_resumed_actions",
                                        "Actions a restart found cut off, closed as abandoned and resumed.",
                                        registry=r)
        self.reconciled = Counter("foreshock_mitigator_reconciled_total",
                                  "Nodes the scheduler showed otherwise than desired, taken in, by kind "
                                  "(returned_by_hand, drained_by_scheduler).", ["kind"], registry=r)
        self.cold_start_nodes = Gauge("foreshock_mitigator_cold_start_nodes",
                                      "Nodes whose state the last start rebuilt, by state.", ["state"],
                                      registry=r)
        self.spares = Gauge("foreshock_mitigator_spares", "Spare nodes configured (--spare).", registry=r)
        self.spares_free = Gauge("foreshock_mitigator_spares_free",
                                 "Spares a migration may move onto now (healthy, unpinned, in no job, "
                                 "not promised to another migration).", registry=r)
        self.audit_write_failures = _KeptTotal(
            "foreshock_mitigator_audit_write_failures",
            "Writes to the audit log that failed (each pauses the mitigator until a write succeeds).", r)
        self.jobs = Gauge("foreshock_mitigator_jobs", "Training jobs whose hooks report their status.",
                          registry=r)
        self.job_gpus = Gauge("foreshock_mitigator_job_gpus", "GPUs in the jobs that report their status.",
                              registry=r)
        self.faults = Counter("foreshock_mitigator_faults_total",
                              "Node failures counted for the burn-in (failed or down node events, not "
                              "already out with Foreshock's drain).", registry=r)
        self.burn_ins = Counter("foreshock_mitigator_burn_ins_total",
                                "Burn-ins after a repeat failure, by outcome: started, passed, cleared "
                                "(by an operator), failed (the node faulted during it).", ["outcome"],
                                registry=r)
        self.unsaved_work = Gauge(
            "foreshock_mitigator_unsaved_work_gpu_seconds",
            "GPU-seconds of training since each reporting job's last durable snapshot, summed: what a "
            "crash of every job now would lose.", registry=r)

    def observe_fleet(self, spares: int, free_spares: int, jobs: Sequence[JobView], now_ms: int,
                      audit_write_failures: int) -> None:
        """Set the gauges read from the engine, the job source and the audit log (at scrape time)."""
        self.spares.set(spares)
        self.spares_free.set(free_spares)
        self.audit_write_failures.value = audit_write_failures
        self.jobs.set(len(jobs))
        self.job_gpus.set(sum(j.gpus for j in jobs))
        self.unsaved_work.set(sum(j.gpus * max(0, now_ms - j.last_checkpoint_ms) for j in jobs) / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _KeptTotal(Collector):
    """A counter whose count another object keeps (the audit log counts its own failed writes)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self.name, self.documentation, self.value = name, documentation, 0
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)
