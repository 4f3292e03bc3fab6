"""A node's history: the lifecycle events its history features read, kept apart from its windows.

A history feature (source ``node``, :data:`~foreshock.features.spec.NODE_EVENT_FIELDS`) counts a
node's failures, or its returns to service, over days to weeks, or measures the time since the
last one: after a repair, a node fails again far more often than a node picked at random (the
InfiniteHBD trace: 22 % within a day), and a window of telemetry says nothing about that. The
events are few (a handful per node and month), so both engines keep the events themselves in an
:class:`EventLog` rather than buckets, and the kernels read it
(:func:`foreshock.features.kernels.history_values`). The window reset at a return
(:mod:`foreshock.features.returns`) cuts telemetry windows only: the failure that preceded a
return still counts after it.

A row at tick ``t`` sees the events before it (``ts < t``), as it sees the records before it. The
same event delivered twice (same node, field and ts: an at-least-once redelivery) counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from foreshock.features.spec import NODE_EVENT_FIELDS
from foreshock.ingest.contract import RETURN_EVENTS

__all__ = ["HISTORY_FIELDS", "NEVER", "EventLog", "history_events", "lifecycle_events"]

HISTORY_FIELDS: Final = tuple(NODE_EVENT_FIELDS)
"""The history fields, in the order of their indices in an :class:`EventLog`."""
_FIELD_OF_EVENT: Final = {kind: i for i, f in enumerate(HISTORY_FIELDS) for kind in NODE_EVENT_FIELDS[f]}
NEVER: Final = np.iinfo(np.int64).min // 4
"""The time of an event that did not happen: before any window."""


def lifecycle_events(events: pd.DataFrame) -> pd.DataFrame:
    """The node events the engines read (``node``, ``ts``, ``event``): returns, which start windows
    afresh (:func:`foreshock.features.returns.return_times` selects them), and the events of the
    history fields (:func:`history_events`)."""
    kept = events.loc[events["event"].isin(RETURN_EVENTS | set(_FIELD_OF_EVENT)), ["node", "ts", "event"]]
    return kept.assign(node=kept["node"].astype(str), ts=kept["ts"].astype(np.int64))


def history_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events a history field counts, from a node-event table (dataset layout): columns
    ``node`` (str), ``ts`` (int64) and ``field`` (index into :data:`HISTORY_FIELDS`)."""
    kinds = events["event"].astype(str)
    mine = events.loc[kinds.isin(_FIELD_OF_EVENT), ["node", "ts"]]
    return pd.DataFrame(
        {
            "node": mine["node"].astype(str).to_numpy(dtype=object),
            "ts": mine["ts"].to_numpy(dtype=np.int64),
            "field": kinds[kinds.isin(_FIELD_OF_EVENT)].map(_FIELD_OF_EVENT).to_numpy(dtype=np.int64),
        }
    )


@dataclass(frozen=True)
class EventLog:
    """Events as (node code, field index, ts), sorted by (field, node, ts), without duplicates.

    Node codes are the engine's own (dense ints); a log is immutable: :meth:`add` and
    :meth:`since` return new ones.
    """

    node: np.ndarray
    field: np.ndarray
    ts: np.ndarray

    @classmethod
    def of(cls, node: np.ndarray, field: np.ndarray, ts: np.ndarray) -> EventLog:
        node, field, ts = (np.asarray(a, dtype=np.int64) for a in (node, field, ts))
        order = np.lexsort((ts, node, field))
        node, field, ts = node[order], field[order], ts[order]
        new = np.ones(len(ts), dtype=bool)
        new[1:] = (node[1:] != node[:-1]) | (field[1:] != field[:-1]) | (ts[1:] != ts[:-1])
        return cls(node[new], field[new], ts[new])

    @classmethod
    def empty(cls) -> EventLog:
        return cls.of(np.empty(0), np.empty(0), np.empty(0))

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def nbytes(self) -> int:
        return int(self.node.nbytes + self.field.nbytes + self.ts.nbytes)

    def add(self, node: np.ndarray, field: np.ndarray, ts: np.ndarray) -> EventLog:
        """This log with more events (any order; ones it holds already count once)."""
        if not len(ts):
            return self
        return EventLog.of(np.r_[self.node, node], np.r_[self.field, field], np.r_[self.ts, ts])

    def since(self, ts: int) -> EventLog:
        """The events at or after ``ts``: what reads from ``ts + window`` on can still see."""
        keep = self.ts >= ts
        return self if keep.all() else EventLog(self.node[keep], self.field[keep], self.ts[keep])

    @staticmethod
    def field_index(name: str) -> int:
        return HISTORY_FIELDS.index(name)

    def _positions(self, field: int, node: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each query (node, t): the index of the node's first event of ``field`` and of its
        first one at or after ``t`` (each node's events of a field are one sorted run)."""
        lo, hi = np.searchsorted(self.field, [field, field + 1])
        ev_node, ev_ts = self.node[lo:hi], self.ts[lo:hi]
        # (node, rank of ts) as one key: ranks over the times involved keep it within int64
        times = np.unique(np.r_[ev_ts, t])
        span = np.int64(len(times) + 1)
        ev_key = ev_node * span + np.searchsorted(times, ev_ts)
        node = np.asarray(node, dtype=np.int64)
        first = np.searchsorted(ev_key, node * span, side="left")
        at = np.searchsorted(ev_key, node * span + np.searchsorted(times, t), side="left")
        return first + lo, at + lo

    def before(self, field: int, node: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Events of ``field`` of each row's node before the row's ``t``."""
        first, at = self._positions(field, node, t)
        return at - first

    def last_before(self, field: int, node: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Time of the last event of ``field`` of each row's node before its ``t`` (:data:`NEVER`
        where there is none)."""
        first, at = self._positions(field, node, t)
        return np.where(at > first, self.ts[np.maximum(at - 1, 0)] if len(self.ts) else NEVER, NEVER)
