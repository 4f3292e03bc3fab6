"""Where a node's windows start: the bucket after its last return to service.

A node that comes back from a repair (a ``repaired`` or ``up`` event at ``r``) is a different
machine as far as its recent past goes: the ECC burst or Xid storm that preceded its failure was
dealt with. With :attr:`~foreshock.features.spec.FeatureSet.reset_on_return`, a row at tick ``t > r``
reads only the buckets that begin at or after ``r`` (``ceil(r / bucket_ms)`` onwards); older
buckets read as empty. Counter increases still run across the return (a counter that kept its
value adds nothing; one reset by a reboot counts from zero), so nothing here touches the
bucket statistics: both engines apply the same floor when they reduce a window.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pandas as pd

from foreshock.ingest.contract import RETURN_EVENTS

__all__ = ["NO_FLOOR", "return_times", "window_floors"]

NO_FLOOR: Final = np.iinfo(np.int64).min // 4
"""The floor of a node that has not returned: lower than any bucket, with room to shift."""


def return_times(events: pd.DataFrame) -> pd.DataFrame:
    """The ``node`` and ``ts`` of the return events in a node-event table (dataset layout)."""
    returns = events.loc[events["event"].isin(RETURN_EVENTS), ["node", "ts"]]
    return returns.assign(node=returns["node"].astype(str), ts=returns["ts"].astype(np.int64))


def window_floors(
    node: np.ndarray, ts: np.ndarray, n_nodes: int, ticks: np.ndarray, bucket_ms: int
) -> np.ndarray:
    """First bucket each node's windows may read at each tick -> (n_nodes, len(ticks)).

    ``node`` (int codes below ``n_nodes``) and ``ts`` are the return events. A tick ``t`` sees
    the returns before it (``r < t``, as it sees the records before it); the floor is
    ``ceil(r / bucket_ms)`` of the last one, :data:`NO_FLOOR` when there is none.
    """
    out = np.full((n_nodes, len(ticks)), NO_FLOOR, dtype=np.int64)
    if not len(ts):
        return out
    order = np.lexsort((ts, node))
    node, ts = node[order], ts[order]
    firsts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
    for lo, hi in zip(firsts, np.r_[firsts[1:], len(ts)], strict=True):
        mine = ts[lo:hi]
        last = np.searchsorted(mine, ticks, side="left") - 1
        out[node[lo]] = np.where(last >= 0, -(-mine[np.maximum(last, 0)] // bucket_ms), NO_FLOOR)
    return out
