"""Feature declarations: what a feature reads, over which window, with which aggregation.

A :class:`Feature` is an immutable spec (source, field, aggregation, window, optional threshold)
that derives its own column name, so a training table and a serving row cannot disagree on what
a column means. A :class:`FeatureSet` is an ordered, validated collection of features plus peer
features, with a stable :attr:`FeatureSet.hash` that models carry and the predictor checks.

Both engines evaluate a spec the same way: raw records are first reduced to per-node *buckets*
(``bucket_ms``, one minute by default) of sufficient statistics (:class:`Stat`), then each
feature reduces the last ``window_ms / bucket_ms`` buckets through the kernel its aggregation
names in :data:`foreshock.features.kernels.AGGREGATIONS`. Neither engine holds feature-specific code.

>>> Feature("gpu", "gpu_temp", "max", 30 * 60_000).name
'gpu_temp__max__30m'
>>> Feature("xid", "memory", "count", 24 * 3_600_000).name
'xid_memory__count__24h'
>>> Feature("node", "failed", "count", 30 * 86_400_000).name
'node_failed__count__30d'

A node's *history* (source ``node``: its failures and returns to service, from ``node.events``)
is not bucketed: the events are few, and a history window (up to :data:`MAX_HISTORY_MS`) is far
longer than any telemetry window. Both engines keep the events themselves and evaluate a history
feature through the same table's event kernel (:attr:`Aggregation.events
<foreshock.features.kernels.Aggregation>`). The window reset at a return
(:attr:`FeatureSet.reset_on_return`) does not apply to them: it clears telemetry bursts, not the
record of what happened to the node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final, Literal

from foreshock.ingest.contract import GPU_FIELDS, LINK_COUNTERS, RETURN_EVENTS

__all__ = [
    "GPU_COUNTERS",
    "GPU_GAUGES",
    "MAX_WINDOW_MS",
    "MAX_HISTORY_MS",
    "NODE_EVENT_FIELDS",
    "Feature",
    "PeerFeature",
    "FeatureSet",
    "Stat",
    "Reduction",
    "field_kind",
    "format_window",
]

GPU_COUNTERS: Final[tuple[str, ...]] = GPU_FIELDS[GPU_FIELDS.index("ecc_sbe_vol_total") :]
"""Cumulative GPU counters (contract order): features see their reset-aware increases."""
GPU_GAUGES: Final[tuple[str, ...]] = GPU_FIELDS[: GPU_FIELDS.index("ecc_sbe_vol_total")]
MAX_WINDOW_MS: Final = 7 * 24 * 3_600_000
"""The longest window of a telemetry feature (its buckets are held per node)."""
MAX_HISTORY_MS: Final = 90 * 24 * 3_600_000
"""The longest window of a history feature (source ``node``: only its events are held)."""
_DAY_MS: Final = 24 * 3_600_000

NODE_EVENT_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "failed": ("down", "failed"),
    "returned": tuple(sorted(RETURN_EVENTS)),
}
"""The fields of source ``node``: which ``node.events`` kinds each one counts. ``failed``: the node
left service by itself (the simulator's ``failed``; a scheduler's ``down``), not by a drain, so
Foreshock's own drains never feed its scores back; ``returned``: it came back into service."""

Source = Literal["gpu", "xid", "link", "node"]
_PREFIX: Final = {"gpu": "", "xid": "xid_", "link": "link_", "node": "node_"}


def field_kind(source: str, name: str) -> str:
    """The kind of a source field: ``gauge``, ``counter`` (GPU), ``xid``, ``link_counter``, ``link_state``,
    ``node_event`` (a node's history, :data:`NODE_EVENT_FIELDS`).

    Aggregations declare which kinds they apply to; an unknown field raises ``ValueError``.
    """
    if source == "gpu" and name in GPU_COUNTERS:
        return "counter"
    if source == "gpu" and name in GPU_GAUGES:
        return "gauge"
    if source == "xid":
        return "xid"
    if source == "link" and name in LINK_COUNTERS:
        return "link_counter"
    if source == "link" and name == "state":
        return "link_state"
    if source == "node" and name in NODE_EVENT_FIELDS:
        return "node_event"
    raise ValueError(f"unknown field {name!r} of source {source!r}")


def format_window(ms: int) -> str:
    """``1_800_000`` -> ``"30m"``, ``3_600_000`` -> ``"1h"``, ``172_800_000`` -> ``"2d"`` (whole days
    from two days up; a day is ``"24h"``); used in column names."""
    if ms >= 2 * _DAY_MS and ms % _DAY_MS == 0:
        return f"{ms // _DAY_MS}d"
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000}h"
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    return f"{ms // 1000}s"


def _format_threshold(value: float) -> str:
    text = f"{value:g}".replace("-", "m").replace(".", "p").replace("+", "")
    return text


@dataclass(frozen=True, order=True)
class Stat:
    """One per-bucket sufficient statistic of one source field of one node.

    ``kind`` is one of the bucket statistics :mod:`foreshock.features.buckets` knows (``n``, ``sum``,
    ``sumsq``, ``max``, ``min``, ``last``, ``above``, ``inc``, ``incgpus``, ``count``,
    ``last_ts``, ``down``, ``records``); ``threshold`` parameterises ``above``/``incgpus``.
    """

    source: str
    field: str
    kind: str
    threshold: float | None = None

    @property
    def key(self) -> str:
        thr = "" if self.threshold is None else f":{self.threshold!r}"
        return f"{self.source}.{self.field}.{self.kind}{thr}"


@dataclass(frozen=True)
class Reduction:
    """One reduction of a window of buckets: ``op`` over ``stat`` (``aux`` marks presence for ``last``).

    Ops: ``sum``, ``sum_k`` and ``sum_kk`` (weighted by the bucket's position k in the window,
    oldest first, centred: k = i - (W - 1) / 2), ``max``, ``min``, ``last`` (value of the newest
    bucket whose ``aux`` > 0).
    """

    op: str
    stat: Stat
    aux: Stat | None = None


@dataclass(frozen=True)
class Feature:
    """One declared feature. ``window_ms`` must be a whole number of the feature set's buckets.

    ``field`` is a GPU field (``gpu``), an Xid class name (``xid``), a link counter or
    ``"state"`` (``link``), or a key of :data:`NODE_EVENT_FIELDS` (``node``: the node's history).
    ``threshold`` is required by the aggregations that count GPUs.
    """

    source: Source
    field: str
    agg: str
    window_ms: int
    threshold: float | None = None

    @property
    def name(self) -> str:
        thr = "" if self.threshold is None else f"_{_format_threshold(self.threshold)}"
        return f"{_PREFIX[self.source]}{self.field}__{self.agg}{thr}__{format_window(self.window_ms)}"

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "field": self.field,
            "agg": self.agg,
            "window_ms": self.window_ms,
            "threshold": self.threshold,
        }


@dataclass(frozen=True)
class PeerFeature:
    """How a node's ``base`` feature compares with the other live nodes of its peer group at the
    same tick (the group: :attr:`FeatureSet.peer_partitions`).

    ``kind="z"``: the robust z-score, (x - median) / (1.4826 MAD) over the nodes (the mean
    absolute deviation where the MAD is 0; 0 where the nodes do not differ), so one broken sensor
    does not move its peers' values (:func:`foreshock.features.kernels.robust_z`); ``kind="rank"``:
    the percentile rank in (0, 1] (ties share their average rank). Missing values stay missing.
    """

    base: Feature
    kind: Literal["z", "rank"]

    @property
    def name(self) -> str:
        return f"peer_{self.kind}__{self.base.name}"


@dataclass(frozen=True)
class FeatureSet:
    """An ordered, validated set of features: what models train on and the predictor serves.

    ``xid_classes`` maps a class name to its Xid codes; codes in no class count as ``other``
    (the public catalogues disagree, so the mapping is data, and part of the hash).
    ``live_ms``: a node has a row at tick t when it sent any record in [t - live_ms, t).
    ``reset_on_return``: a node's windows start afresh when it comes back into service (a
    ``repaired`` or ``up`` event at r): a row at t > r reads only the buckets that begin at or
    after r. Without it, a node back from a quick repair still shows the burst that preceded
    its failure, and raises a false alarm for a fault that was just fixed.
    ``peer_partitions``: peer features compare a node with the live nodes of its *peer group*,
    the nodes that share its partition of a telemetry topic with this many partitions (the
    contract's partitioner, :func:`foreshock.ingest.contract.partition_of`). Why not the whole
    cluster: the risk service keeps one feature engine per partition and each partition moves
    through event time at its own pace (or in another process), so a score can be a function of
    its partition's records alone only if its peers are in that partition. Topics whose number
    of partitions divides this one keep every group inside one partition, hence one engine.
    """

    features: tuple[Feature, ...]
    peers: tuple[PeerFeature, ...] = ()
    xid_classes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    bucket_ms: int = 60_000
    live_ms: int = 300_000
    version: str = "1"
    reset_on_return: bool = True
    peer_partitions: int = 8

    def __post_init__(self) -> None:
        from foreshock.features.kernels import AGGREGATIONS  # the kernel table validates the specs

        names = [f.name for f in self.features] + [p.name for p in self.peers]
        if len(set(names)) != len(names):
            raise ValueError("feature names must be unique")
        for f in self.features:
            agg = AGGREGATIONS.get(f.agg)
            if agg is None:
                raise ValueError(f"{f.name}: unknown aggregation {f.agg!r}")
            kind = "xid" if f.source == "xid" else field_kind(f.source, f.field)
            if kind not in agg.kinds:
                raise ValueError(f"{f.name}: {f.agg} does not apply to a {kind} field")
            if f.source == "xid" and f.field not in self.xid_class_names:
                raise ValueError(f"{f.name}: unknown Xid class {f.field!r}")
            if (f.threshold is not None) != agg.needs_threshold:
                raise ValueError(
                    f"{f.name}: threshold {'required' if agg.needs_threshold else 'not allowed'}"
                )
            if f.threshold is not None and f.threshold < 0:
                raise ValueError(f"{f.name}: threshold must be >= 0")
            longest = MAX_HISTORY_MS if kind == "node_event" else MAX_WINDOW_MS
            if f.window_ms % self.bucket_ms or not self.bucket_ms <= f.window_ms <= longest:
                raise ValueError(
                    f"{f.name}: window must be a multiple of {self.bucket_ms} ms, "
                    f"at most {longest // _DAY_MS} days"
                )
        base_names = {f.name for f in self.features}
        for p in self.peers:
            if p.base.name not in base_names:
                raise ValueError(f"{p.name}: base feature is not in the set")
        if self.peer_partitions < 1:
            raise ValueError("peer_partitions must be >= 1")
        if self.live_ms % self.bucket_ms or self.live_ms <= 0:
            raise ValueError("live_ms must be a positive multiple of bucket_ms")
        codes = [c for cs in self.xid_classes.values() for c in cs]
        if len(set(codes)) != len(codes):
            raise ValueError("an Xid code may belong to one class only")

    @cached_property
    def names(self) -> list[str]:
        """Column names in order: the features, then the peer features."""
        return [f.name for f in self.features] + [p.name for p in self.peers]

    @cached_property
    def stat_index(self) -> dict[Stat, int]:
        """Column of each statistic in bucket tables."""
        return {s: j for j, s in enumerate(self.stats)}

    @property
    def xid_class_names(self) -> tuple[str, ...]:
        """Declared classes plus ``other``."""
        return (*self.xid_classes, "other")

    @cached_property
    def hash(self) -> str:
        """sha256 (hex) of the canonical JSON of every parameter that changes a value."""
        doc = {
            "version": self.version,
            "bucket_ms": self.bucket_ms,
            "live_ms": self.live_ms,
            "reset_on_return": self.reset_on_return,
            "peer_partitions": self.peer_partitions,
            "xid_classes": {k: sorted(v) for k, v in sorted(self.xid_classes.items())},
            "features": [f.to_json() for f in self.features],
            "peers": [{"base": p.base.name, "kind": p.kind} for p in self.peers],
            "peer_z": "median-mad",  # the z kernel: a model of another kernel must not be served
            "node_events": {k: list(v) for k, v in sorted(NODE_EVENT_FIELDS.items())},
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    @property
    def records_stat(self) -> Stat:
        """Records of any kind per bucket: decides which nodes have a row (``live_ms``)."""
        return Stat("any", "records", "records")

    def reductions(self, feature: Feature) -> tuple[Reduction, ...]:
        """The window reductions ``feature`` needs, from its aggregation's kernel (none for a
        history feature: it reads events, not buckets)."""
        from foreshock.features.kernels import AGGREGATIONS

        if feature.source == "node":
            return ()
        return AGGREGATIONS[feature.agg].reductions(feature)

    @cached_property
    def plan(self) -> tuple[tuple[int, Feature, int, tuple[Reduction, ...]], ...]:
        """(column, feature, window in buckets, reductions) for every telemetry feature, in order:
        what engines loop over. History features are in :attr:`history_plan`."""
        return tuple(
            (j, f, f.window_ms // self.bucket_ms, self.reductions(f))
            for j, f in enumerate(self.features)
            if f.source != "node"
        )

    @cached_property
    def plan_windows(self) -> tuple[tuple[Stat, int], ...]:
        """Every (statistic, window in buckets) that :attr:`plan`'s reductions read, once each."""
        return tuple(dict.fromkeys(
            (s, w) for _, _, w, reductions in self.plan for r in reductions for s in (r.stat, r.aux)
            if s is not None
        ))

    @cached_property
    def history_plan(self) -> tuple[tuple[int, Feature], ...]:
        """(column, feature) for every history feature (source ``node``), in order: the engines
        evaluate them together (:func:`foreshock.features.kernels.history_values`)."""
        return tuple((j, f) for j, f in enumerate(self.features) if f.source == "node")

    @cached_property
    def history_reach_ms(self) -> int:
        """How far back the history features read: the longest history window (0 without any)."""
        return max((f.window_ms for _, f in self.history_plan), default=0)

    @cached_property
    def stats(self) -> tuple[Stat, ...]:
        """Every bucket statistic the set reads, sorted (the column order of bucket tables)."""
        out = {self.records_stat}
        for f in self.features:
            for r in self.reductions(f):
                out.add(r.stat)
                if r.aux is not None:
                    out.add(r.aux)
        return tuple(sorted(out, key=lambda s: s.key))

    def stat_windows(self) -> dict[Stat, int]:
        """The longest window (in buckets) over which each statistic is reduced."""
        out = {self.records_stat: self.live_ms // self.bucket_ms}
        for f in self.features:
            w = f.window_ms // self.bucket_ms
            for r in self.reductions(f):
                for s in (r.stat, r.aux):
                    if s is not None:
                        out[s] = max(out.get(s, 0), w)
        return out

    def select(self, names: Sequence[str]) -> FeatureSet:
        """A smaller set with the named features (and peers whose base survives)."""
        keep = set(names)
        feats = tuple(f for f in self.features if f.name in keep)
        peers = tuple(p for p in self.peers if p.name in keep and p.base in feats)
        return FeatureSet(
            feats, peers, self.xid_classes, self.bucket_ms, self.live_ms, self.version, self.reset_on_return,
            self.peer_partitions,
        )
