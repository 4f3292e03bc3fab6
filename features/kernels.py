"""The one table from aggregation name to kernel, shared by the batch and the online engine.

An :class:`Aggregation` says which bucket statistics it reduces over the window
(:class:`~foreshock.features.spec.Reduction`) and how the reduced values become the feature
(``finalize``). The engines only differ in *how* they compute a reduction: the online engine
reduces the gathered ``(nodes, W)`` window directly (:func:`reduce_direct`); the batch engine
takes exact shortcuts where the result is provably identical (prefix sums of integer-valued
statistics, max/min by doubling) and the same direct reduction elsewhere, so both produce the
same numbers on the same records.

Empty buckets hold each statistic's neutral value (:func:`empty_value`): 0 for sums and counts,
-inf for max and last_ts, +inf for min, NaN for last.

A history feature (source ``node``) reads no buckets: its aggregation's ``events`` kernel reads
the node's own events (:class:`~foreshock.features.history.EventLog`), which both engines keep,
through :func:`history_values`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from foreshock.features.history import EventLog
from foreshock.features.spec import Feature, FeatureSet, Reduction, Stat
from foreshock.ingest.contract import partition_of

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "EXACT_STAT_KINDS",
    "empty_value",
    "reduce_direct",
    "add_peer_features",
    "history_values",
    "robust_z",
    "MAD_SCALE",
    "MEAN_AD_SCALE",
]

EXACT_STAT_KINDS: Final = frozenset({"n", "above", "inc", "incgpus", "count", "down", "records"})
"""Statistics whose bucket values are integers: any summation order gives the same sum."""

_EMPTY: Final = {"max": -np.inf, "last_ts": -np.inf, "min": np.inf, "last": np.nan}


def empty_value(stat: Stat) -> float:
    """The value a bucket without data holds for ``stat``."""
    return _EMPTY.get(stat.kind, 0.0)


Finalize = Callable[[Sequence[np.ndarray], Feature, np.ndarray, int], np.ndarray]
EventKernel = Callable[[EventLog, int, np.ndarray, np.ndarray, int], np.ndarray]
"""``events(log, field, row_node, row_t, window_ms)`` -> one float64 per row (NaN: no data)."""


@dataclass(frozen=True)
class Aggregation:
    """How one aggregation turns a window of buckets into a value.

    ``finalize(reduced, feature, t_ms, bucket_ms)`` gets the reductions' results in order,
    and the query times (epoch ms, one per row); it returns float64 with NaN for "no data".
    ``events`` evaluates the aggregation on a history field (kind ``node_event``) instead: a row
    at ``t`` reads its node's events of the field in ``[t - window, t)``.
    """

    kinds: frozenset[str]
    reductions: Callable[[Feature], tuple[Reduction, ...]]
    finalize: Finalize
    needs_threshold: bool = False
    events: EventKernel | None = None


def _s(f: Feature, kind: str, threshold: float | None = None) -> Stat:
    return Stat(f.source, f.field, kind, threshold)


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, np.nan)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


def _std(r: Sequence[np.ndarray], f: Feature, t: np.ndarray, b: int) -> np.ndarray:
    s1, s2, n = r
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(n > 0, (s2 - s1 * s1 / n) / n, np.nan)
    return np.sqrt(np.maximum(var, 0.0), where=~np.isnan(var), out=np.full_like(var, np.nan))


def _slope(r: Sequence[np.ndarray], f: Feature, t: np.ndarray, bucket_ms: int) -> np.ndarray:
    """Least-squares slope per hour of the samples against their bucket position."""
    n, nk, nkk, x, xk = r
    den = n * nkk - nk * nk
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(den > 0, (n * xk - nk * x) / den, np.nan)
    return slope * (3_600_000 / bucket_ms)


def _since(r: Sequence[np.ndarray], f: Feature, t: np.ndarray, b: int) -> np.ndarray:
    last = r[0]
    return np.where(np.isfinite(last), (t - last) / 1000.0, np.nan)


def _count_events(log: EventLog, field: int, node: np.ndarray, t: np.ndarray, window_ms: int) -> np.ndarray:
    """Events of the field in ``[t - window, t)``."""
    return (log.before(field, node, t) - log.before(field, node, t - window_ms)).astype(np.float64)


def _since_event(log: EventLog, field: int, node: np.ndarray, t: np.ndarray, window_ms: int) -> np.ndarray:
    """Seconds since the node's last event of the field before ``t``; NaN when none in the window."""
    last = log.last_before(field, node, t)
    return np.where(last >= t - window_ms, (t - last) / 1000.0, np.nan)


_GAUGE = frozenset({"gauge", "counter"})

AGGREGATIONS: Final[dict[str, Aggregation]] = {
    "last": Aggregation(
        _GAUGE, lambda f: (Reduction("last", _s(f, "last"), _s(f, "n")),), lambda r, f, t, b: r[0]
    ),
    "mean": Aggregation(
        _GAUGE,
        lambda f: (Reduction("sum", _s(f, "sum")), Reduction("sum", _s(f, "n"))),
        lambda r, f, t, b: _ratio(r[0], r[1]),
    ),
    "max": Aggregation(_GAUGE, lambda f: (Reduction("max", _s(f, "max")),), lambda r, f, t, b: _finite(r[0])),
    "min": Aggregation(_GAUGE, lambda f: (Reduction("min", _s(f, "min")),), lambda r, f, t, b: _finite(r[0])),
    "spread": Aggregation(
        frozenset({"gauge"}),
        lambda f: (
            Reduction("max", _s(f, "max")),
            Reduction("sum", _s(f, "sum")),
            Reduction("sum", _s(f, "n")),
        ),
        lambda r, f, t, b: _finite(r[0]) - _ratio(r[1], r[2]),
    ),
    "std": Aggregation(
        _GAUGE,
        lambda f: (
            Reduction("sum", _s(f, "sum")),
            Reduction("sum", _s(f, "sumsq")),
            Reduction("sum", _s(f, "n")),
        ),
        _std,
    ),
    "slope": Aggregation(
        _GAUGE,
        lambda f: (
            Reduction("sum", _s(f, "n")),
            Reduction("sum_k", _s(f, "n")),
            Reduction("sum_kk", _s(f, "n")),
            Reduction("sum", _s(f, "sum")),
            Reduction("sum_k", _s(f, "sum")),
        ),
        _slope,
    ),
    "gpus_above": Aggregation(
        _GAUGE,
        lambda f: (Reduction("max", _s(f, "above", f.threshold)),),
        lambda r, f, t, b: r[0],
        needs_threshold=True,
    ),
    "increase": Aggregation(
        frozenset({"counter", "link_counter"}),
        lambda f: (Reduction("sum", _s(f, "inc")),),
        lambda r, f, t, b: r[0],
    ),
    "gpus_increasing": Aggregation(
        frozenset({"counter"}),
        lambda f: (Reduction("max", _s(f, "incgpus", f.threshold)),),
        lambda r, f, t, b: r[0],
        needs_threshold=True,
    ),
    "count": Aggregation(
        frozenset({"xid", "node_event"}),
        lambda f: (Reduction("sum", _s(f, "count")),),
        lambda r, f, t, b: r[0],
        events=_count_events,
    ),
    "since": Aggregation(
        frozenset({"xid", "node_event"}),
        lambda f: (Reduction("max", _s(f, "last_ts")),),
        _since,
        events=_since_event,
    ),
    "ports_down": Aggregation(
        frozenset({"link_state"}), lambda f: (Reduction("max", _s(f, "down")),), lambda r, f, t, b: r[0]
    ),
}
"""Aggregation name -> kernel. Adding an aggregation here makes it available to both engines
and to the parity test, which enumerates this table."""
# Descriptions, for the README: last value (newest sample by (ts, gpu)); mean, max, min and
# population std pooled over the node's GPUs; spread (the window's highest sample minus the
# mean of all its samples: how far the node's worst GPU stands out from its siblings, which
# the workload's swings move together); slope per hour; count of GPUs above the threshold
# (peak over the window's buckets); reset-aware counter increase summed over GPUs or ports;
# peak number of GPUs whose counter grew by more than the threshold in one bucket; Xid events
# of a class; seconds since the last Xid of a class; peak number of link ports not ACTIVE. On a
# node's history: its failures (or returns) in the window; seconds since the last one.


def reduce_direct(op: str, window: np.ndarray, aux: np.ndarray | None = None) -> np.ndarray:
    """Reduce ``window`` (rows, W; oldest bucket first) along its last axis: the reference path.

    The window is made C-contiguous first so a float sum adds in the same order whichever
    engine gathered it.
    """
    window = np.ascontiguousarray(window)
    if op == "sum":
        return window.sum(axis=-1)
    if op in ("sum_k", "sum_kk"):  # positions centred on the window's middle: less cancellation
        k = np.arange(window.shape[-1], dtype=np.float64) - (window.shape[-1] - 1) / 2
        return (window * (k if op == "sum_k" else k * k)).sum(axis=-1)
    if op == "max":
        return window.max(axis=-1, initial=-np.inf)
    if op == "min":
        return window.min(axis=-1, initial=np.inf)
    if op == "last":
        assert aux is not None
        present = aux > 0
        w = window.shape[-1]
        idx = w - 1 - np.argmax(present[..., ::-1], axis=-1)
        val = np.take_along_axis(window, idx[..., None], axis=-1)[..., 0]
        return np.where(present.any(axis=-1), val, np.nan)
    raise ValueError(f"unknown reduction {op!r}")


def history_values(fs: FeatureSet, log: EventLog, node: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The history features of ``fs`` (:attr:`~foreshock.features.spec.FeatureSet.history_plan`)
    for rows (``node``: the log's node codes, ``t``: epoch ms) -> (rows, history features)."""
    out = np.empty((len(node), len(fs.history_plan)))
    t = np.asarray(t, dtype=np.int64)
    for i, (_, f) in enumerate(fs.history_plan):
        kernel = AGGREGATIONS[f.agg].events
        assert kernel is not None  # the spec's validation: node_event kinds have an event kernel
        out[:, i] = kernel(log, log.field_index(f.field), node, t, f.window_ms)
    return out


def add_peer_features(
    table: pd.DataFrame, feature_set: FeatureSet, peer_groups: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Add the peer columns: each node against the other nodes of its peer group at the same ``ts``.

    The peer group is the node's partition of the telemetry topics
    (:attr:`~foreshock.features.spec.FeatureSet.peer_partitions`), so a table holding several
    partitions' nodes (the batch engine's) and one holding a single partition's (an engine of the
    risk service) give every node the same values. ``peer_groups`` (node -> group, e.g. the job it
    runs) narrows the comparison further; nodes it does not name are compared with each other.
    ``table`` must be sorted by (ts, node): both engines call this on that order, so group sums
    add the same sequence.
    """
    if not feature_set.peers:
        return table
    codes, nodes = pd.factorize(table["node"])
    group_of = np.array([partition_of(n, feature_set.peer_partitions) for n in nodes], dtype=np.int64)
    keys = [table["ts"], pd.Series(group_of[codes], index=table.index, name="_partition")]
    if peer_groups is not None:
        keys.append(table["node"].map(lambda n: peer_groups.get(n, "")).rename("_group"))
    groups = table.groupby(keys, sort=False)
    for p in feature_set.peers:
        col = table[p.base.name]
        if p.kind == "rank":
            table[p.name] = groups[p.base.name].rank(pct=True, method="average").astype(np.float64)
            continue
        table[p.name] = robust_z(col, groups[p.base.name].transform("median"), keys)
    return table


MAD_SCALE: Final = 1.482602218505602
"""1 / Φ⁻¹(3/4): the median absolute deviation times this estimates σ of normal data."""
MEAN_AD_SCALE: Final = 1.2533141373155001
"""√(π/2): the mean absolute deviation times this estimates σ of normal data."""


def robust_z(col: pd.Series, centre: pd.Series, keys: list[pd.Series]) -> np.ndarray:
    """``(x - median) / scale`` per group of ``keys`` (``centre``: each row's group median), where
    the scale is the median absolute deviation from the median (times :data:`MAD_SCALE`).

    Why not mean and standard deviation: one broken sensor (a reading at the contract's bound, a
    counter gone wild) moves a group's mean and inflates its deviation, and with them every other
    node's score. The median and the MAD stay put while one node in a group of three or more
    moves anywhere on its side. Where more than half the group shares one value (counters that
    mostly stay at 0) the MAD is 0 and the mean absolute deviation from the median (times
    :data:`MEAN_AD_SCALE`) is the scale instead (the usual fallback of the modified z-score): the
    nodes at the median still read 0 whatever the others do, and the few that differ are told
    apart, though there one extreme node does shrink the others' values. A group without spread
    reads 0; a missing value stays missing.
    """
    dev = (col - centre).abs()
    by = dev.groupby(keys, sort=False)
    mad, mean_ad = by.transform("median"), by.transform("mean")
    scale = np.where(mad > 0, MAD_SCALE * mad, MEAN_AD_SCALE * mean_ad)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(scale > 0, (col - centre) / scale, 0.0)
    return np.where(col.isna(), np.nan, z)
