"""What the order of a node's errors in time buys the model, judged as the model is judged: equal
false-alarm rates, unseen seeds.

A foreshock keeps accelerating until the failure, while a harmless burst of the same size peaks and
fades. The shipped set tells them apart only by counting the same errors over windows of several
lengths. ``sequence`` adds, for each error count that precedes failures (single-bit ECC, remapped
rows, NVLink CRC, PCIe replays, InfiniBand symbol and receive errors, and the Xids of the memory,
NVLink, fatal and other classes), over the last hour and the last six (:data:`SEQUENCE`):

- ``weighted``: the count weighted by its recency, 1 for the newest bucket, falling linearly
  towards 0 at the window's start;
- ``trend``: the least-squares slope of its rate per minute, per hour (positive while the errors
  come faster, negative while a burst fades).

Both are two more aggregations of the engines' kernel table (:data:`AGGREGATIONS`), from the
reductions it already has (sums, and sums weighted by the bucket's position); :func:`register`
adds them. Both variants are trained alike on one dataset and judged alike on pools of datasets
neither saw (:func:`history_features.compare`); the new columns are left free of monotone
constraints, as any column outside the shipped set is.

    .venv/bin/python benchmarks/sequence_features.py --train DIR --pool llama3=DIR,DIR --out runs/sequence
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from history_features import compare, variant_args  # benchmarks/, the script's own folder

from foreshock.features.default_set import DEFAULT_FEATURE_SET, H
from foreshock.features.kernels import AGGREGATIONS, Aggregation
from foreshock.features.spec import Feature, FeatureSet, Reduction, Stat


def _increments(f: Feature) -> Stat:
    """The bucket statistic an error count's increments are read from: an Xid class's events, a
    counter's increases."""
    return Stat(f.source, f.field, "count" if f.source == "xid" else "inc")


def _weighted(r: Sequence[np.ndarray], f: Feature, t: np.ndarray, bucket_ms: int) -> np.ndarray:
    """sum_i (i + 1) / W x_i over the W buckets (oldest first), from the plain and the centred
    position-weighted sums: sum_i (i + 1) x_i = sum_k + (W + 1) / 2 sum."""
    total, total_k = r
    w = f.window_ms // bucket_ms
    return (total_k + (w + 1) / 2 * total) / w


def _trend(r: Sequence[np.ndarray], f: Feature, t: np.ndarray, bucket_ms: int) -> np.ndarray:
    """With positions centred on the window's middle (sum k = 0) the slope is sum_k / sum k^2, and
    sum k^2 = W (W^2 - 1) / 12; NaN for a window of one bucket."""
    w = f.window_ms // bucket_ms
    if w < 2:
        return np.full_like(r[0], np.nan)
    per_minute, per_hour = 60_000 / bucket_ms, 3_600_000 / bucket_ms
    return r[0] / (w * (w * w - 1) / 12) * per_minute * per_hour


_ERROR_COUNTS = frozenset({"counter", "link_counter", "xid"})
SEQUENCE_AGGREGATIONS = {
    "weighted": Aggregation(
        _ERROR_COUNTS,
        lambda f: (Reduction("sum", _increments(f)), Reduction("sum_k", _increments(f))),
        _weighted,
    ),
    "trend": Aggregation(_ERROR_COUNTS, lambda f: (Reduction("sum_k", _increments(f)),), _trend),
}

COUNTS = (
    ("gpu", "ecc_sbe_vol_total"),
    ("gpu", "correctable_remapped_rows"),
    ("gpu", "nvlink_crc_flit_error_count_total"),
    ("gpu", "pcie_replay_counter"),
    ("link", "symbol_error"),
    ("link", "port_rcv_errors"),
    ("xid", "memory"),
    ("xid", "nvlink"),
    ("xid", "fatal"),
    ("xid", "other"),
)
SEQUENCE = tuple(
    Feature(source, field, agg, window)  # type: ignore[arg-type]
    for source, field in COUNTS
    for agg in SEQUENCE_AGGREGATIONS
    for window in (H, 6 * H)
)


def register() -> None:
    """Add ``weighted`` and ``trend`` to the engines' kernel table."""
    AGGREGATIONS.update(SEQUENCE_AGGREGATIONS)


def with_sequence() -> FeatureSet:
    return dataclasses.replace(DEFAULT_FEATURE_SET, features=(*DEFAULT_FEATURE_SET.features, *SEQUENCE))


def main() -> None:
    register()
    compare(variant_args(__doc__), {"base": DEFAULT_FEATURE_SET, "sequence": with_sequence()})


if __name__ == "__main__":
    main()
