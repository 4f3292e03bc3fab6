"""Time-ordered splits, with a purge gap and a second, node-held-out view.

Rows are never shuffled. The labelled period is cut in time into train, validation and test
(in that order). A row near the end of a period has a label that looks up to H into the next
one, so rows within H before a cut are *purged* (left out of the earlier period): no failure
that a later period scores is ever a training label.

The second split holds out whole nodes: a fixed, seed-independent subset of node ids (by hash)
is removed from train and validation. ``test`` is every node in the test period and
``test_unseen_nodes`` only the held-out nodes there, so a model that memorised node identities
(a flaky node's habits) would show it as a gap between the two.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["TimeSplit", "make_split", "PARTS"]

PARTS = ("train", "val", "test", "test_unseen_nodes")


def _held_out(node: str, fraction: float) -> bool:
    digest = hashlib.sha256(node.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@dataclass(frozen=True)
class TimeSplit:
    """Cut points (epoch ms) and the held-out node set. Periods: train ``[start, val_start - H)``,
    val ``[val_start, test_start - H)``, test ``[test_start, end]``."""

    start_ms: int
    val_start_ms: int
    test_start_ms: int
    end_ms: int
    horizon_ms: int
    holdout_nodes: frozenset[str]

    def masks(self, rows: pd.DataFrame) -> dict[str, np.ndarray]:
        """Boolean masks over ``rows`` (needs ``node``, ``ts``) for each of :data:`PARTS`."""
        ts = rows["ts"].to_numpy(dtype=np.int64)
        seen = ~rows["node"].isin(self.holdout_nodes).to_numpy()
        test = ts >= self.test_start_ms
        return {
            "train": seen & (ts < self.val_start_ms - self.horizon_ms),
            "val": seen & (ts >= self.val_start_ms) & (ts < self.test_start_ms - self.horizon_ms),
            "test": test,
            "test_unseen_nodes": test & ~seen,
        }

    def describe(self) -> dict[str, int | list[str]]:
        """JSON-ready description (for metrics.json and MLflow params)."""
        return {
            "start_ms": self.start_ms,
            "val_start_ms": self.val_start_ms,
            "test_start_ms": self.test_start_ms,
            "end_ms": self.end_ms,
            "horizon_ms": self.horizon_ms,
            "holdout_nodes": sorted(self.holdout_nodes),
        }


def make_split(
    rows: pd.DataFrame,
    horizon_ms: int,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    holdout_fraction: float = 0.15,
) -> TimeSplit:
    """Cut the time span of labelled ``rows`` by ``fractions`` (train, val, test) and pick the
    held-out nodes (about ``holdout_fraction`` of the node ids, chosen by hash)."""
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
        raise ValueError("fractions must be positive and add up to 1")
    start, end = int(rows["ts"].min()), int(rows["ts"].max())
    span = end - start
    val_start = start + int(span * fractions[0])
    test_start = val_start + int(span * fractions[1])
    nodes = rows["node"].unique()
    holdout = frozenset(n for n in nodes if _held_out(str(n), holdout_fraction))
    if holdout_fraction > 0 and not holdout and len(nodes) > 1:
        holdout = frozenset({str(sorted(nodes)[-1])})
    return TimeSplit(start, val_start, test_start, end, horizon_ms, holdout)
