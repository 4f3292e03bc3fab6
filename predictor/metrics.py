"""Prometheus metrics of the risk service: ``foreshock_predictor_*`` (base units, no node labels) and
the fleet's per-node gauges ``foreshock_node_failure_probability{node}`` and ``foreshock_node_alert{node}``.

Each service owns a :class:`prometheus_client.CollectorRegistry`, so two services in one process
(tests, the embedded demo) never share counters; ``/metrics`` renders that registry and the
board's (:class:`BoardMetrics`). The per-node gauges and the model's gauges are not set by the
scoring loop: :class:`BoardCollector` reads the board's latest scores and the model being served
when Prometheus scrapes, so they cost the loop nothing per record or per node, and a node whose
partition moved away stops being exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from foreshock.predictor.scoring import RiskBoard

__all__ = ["ServiceMetrics", "BoardMetrics", "BoardCollector", "model_trained_ms"]

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
        self.checkpoint_stall = Histogram("foreshock_predictor_checkpoint_stall_seconds",
                                          "Wall time the scoring loop spends on a checkpoint written in "
                                          "the background (the snapshot).",
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


class BoardMetrics:
    """A board's per-node series and the served model's gauges (:class:`BoardCollector`), in a
    registry of their own: rendered by whichever process holds the board, the API process's
    mirror included, so a scrape of 16,384 nodes' series never runs on the scoring loop."""

    def __init__(self, board: RiskBoard, model: Callable[[], Any]):
        self.registry = CollectorRegistry()
        self.registry.register(BoardCollector(board, model))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def model_trained_ms(model: Any) -> int | None:
    """When ``model`` was trained (epoch ms, from its model card), or None for a model that does not say."""
    trained = (model.metrics or {}).get("training", {}).get("trained_at_ms")
    return int(trained) if isinstance(trained, int | float) else None


class BoardCollector(Collector):
    """The fleet as Prometheus series, read from the board at scrape time (no cost to the loop).

    ``foreshock_node_failure_probability{node}``: the node's latest calibrated probability of failing
    within the model's horizon; ``foreshock_node_alert{node}``: 1 when that score is at or above the
    model's threshold. With the model loaded: ``foreshock_predictor_model_threshold`` and, when the
    model card says, ``foreshock_predictor_model_trained_timestamp_seconds``.
    """

    def __init__(self, board: RiskBoard, model: Callable[[], Any]):
        self.board = board
        self.model = model

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        probability, alert, threshold, trained = self._families()
        for s in self.board.latest():
            probability.add_metric([s.node], s.probability)
            alert.add_metric([s.node], 1.0 if s.alert else 0.0)
        yield probability
        yield alert
        model = self.model()
        if model is not None:
            threshold.add_metric([], model.threshold)
            yield threshold
            if (ms := model_trained_ms(model)) is not None:
                trained.add_metric([], ms / 1000)
                yield trained

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("foreshock_node_failure_probability",
                              "Latest calibrated probability that the node fails within the model's horizon.",
                              labels=["node"]),
            GaugeMetricFamily("foreshock_node_alert",
                              "1 when the node's latest score is at or above the model's threshold.",
                              labels=["node"]),
            GaugeMetricFamily("foreshock_predictor_model_threshold",
                              "Probability at or above which the model being served alerts."),
            GaugeMetricFamily("foreshock_predictor_model_trained_timestamp_seconds",
                              "When the model being served was trained (from its model card)."),
        )
