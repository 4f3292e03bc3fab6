"""Prometheus metrics of the risk service (``foreshock_predictor_*``, base units, no node labels).

Each service owns a :class:`prometheus_client.CollectorRegistry`, so two services in one process
(tests, the embedded demo) never share counters; ``/metrics`` renders that registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServiceMetrics"]

# up to 5 minutes: a scoring cycle or checkpoint that stalls must show its size, not read "10 s" at p99
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)
_DELAY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 300.0, 3600.0)


class ServiceMetrics:
    """The service's counters, gauges and histograms in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("foreshock_predictor_records_consumed_total",
                               "Telemetry records decoded and taken in, by topic.", ["topic"], registry=r)
        self.dead_letters = Counter("foreshock_predictor_dead_letters_total",
                                    "Messages that did not decode (dead-lettered).", registry=r)
        self.lag = Gauge("foreshock_predictor_consumer_lag_records",
                         "Messages between the consumer's positions and the partitions' ends.", registry=r)
        self.held = Gauge("foreshock_predictor_held_records",
                          "Records read but waiting for their scoring boundary to close.", registry=r)
        self.partitions = Gauge("foreshock_predictor_partitions_owned",
                                "Partition numbers this process owns.", registry=r)
        self.scoring = Histogram("foreshock_predictor_scoring_duration_seconds",
                                 "Wall time of one scoring cycle (features, model, records).",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.scores = Counter("foreshock_predictor_scores_published_total",
                              "Risk records published to risk.scores.", registry=r)
        self.nodes = Gauge("foreshock_predictor_nodes_scored", "Nodes with a current risk score.", registry=r)
        self.alerts = Gauge("foreshock_predictor_nodes_in_alert",
                            "Nodes whose latest score is at or above the model's threshold.", registry=r)
        self.delay = Histogram("foreshock_predictor_score_delay_seconds",
                               "Wall time at publication minus the event time the score is for.",
                               buckets=_DELAY_BUCKETS, registry=r)
        self.checkpoint = Histogram("foreshock_predictor_checkpoint_duration_seconds",
                                    "Wall time to make the state and offsets durable.",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.reloads = Counter("foreshock_predictor_model_reloads_total",
                               "Model (re)load attempts by result (loaded, refused, failed).", ["result"],
                               registry=r)
        self.ready = Gauge("foreshock_predictor_ready", "1 when the service is ready to answer.", registry=r)
        self.model = Gauge("foreshock_predictor_model_info", "The model being served (value 1).",
                           ["version", "feature_set_hash"], registry=r)

    def set_model(self, version: str, feature_set_hash: str) -> None:
        """Point the info gauge at the model now being served."""
        self.model.clear()
        self.model.labels(version=version, feature_set_hash=feature_set_hash).set(1)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
