"""Prometheus metrics of the mitigator (``foreshock_mitigator_*``, base units, no node labels).

Every block is counted here as well as audited and logged: a breaker that is open, a drain a rail
held back, a record rejected for its time, a pause because the audit log cannot be written. The
service owns the registry, so two services in one process never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

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

    def render(self) -> bytes:
        return generate_latest(self.registry)
