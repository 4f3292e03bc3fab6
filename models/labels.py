"""Labels for the risk model: does this node fail within the next H minutes?

A feature row ``(node, t)`` summarises what was known about the node at ``t`` (the feature
engines only read telemetry stamped ``<= t``). Its label is 1 when the node has a ``failed``
event at some ``f`` with ``t < f <= t + H`` and 0 otherwise, so a row's window never includes its
own instant, and the failure's own Xid (stamped ``f``) is only ever visible to rows at ``>= f``.

Rows are left out when the answer is not a question an operator would ask, or not known:

- while the node is unavailable: from a ``failed``, ``down`` or ``drained`` event up to (not
  including) the next ``repaired`` or ``up`` event. The row at the failure instant itself is
  therefore dropped, together with the fatal Xid it would show.
- in the last H of the recording (``end_ms - H < t``): a failure there could lie after the end
  of the data, so a 0 would be a guess (right-censoring).

Each row also carries ``since_return_ms``, the time since the node's last ``repaired``/``up`` event
at or before it: the evaluation counts the false alarms raised soon after a node came back (the
feature windows start afresh at a return, so such an alarm is not an echo of the burst that
preceded the failure), and ``train --negative-rate`` keeps every row of the hours after a
return. It is never a feature.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from foreshock.ingest.contract import RETURN_EVENTS, UNAVAILABLE_EVENTS

__all__ = ["NO_RECENT_RETURN_MS", "failures", "label_rows", "node_codes"]

LABEL_COLUMNS = ("label", "failure_ts", "cause", "detectable", "since_return_ms")
# ``since_return_ms`` of a row whose node never returned, or returned longer ago than int32 holds
# (24.8 days): every reader asks only whether a return lies within a few hours
NO_RECENT_RETURN_MS = np.iinfo(np.int32).max


def failures(events: pd.DataFrame) -> pd.DataFrame:
    """The ``failed`` events (node, ts, cause, detectable), sorted by time."""
    out = events.loc[events["event"] == "failed", ["node", "ts", "cause", "detectable"]]
    return out.sort_values(["ts", "node"], kind="stable").reset_index(drop=True)


def node_codes(nodes: pd.Series, names: pd.Index | None = None) -> tuple[np.ndarray, pd.Index]:
    """Each row's node as a code into ``names`` (-1 for a node not among them); without
    ``names``, the nodes' own names in order of appearance. A category column is coded without a
    string per row."""
    codes, uniques = pd.factorize(nodes)
    uniques = pd.Index([str(u) for u in uniques])
    if names is None:
        return codes.astype(np.int64), uniques
    return names.get_indexer(uniques)[codes].astype(np.int64), names


def _asof(
    node: np.ndarray, ts: np.ndarray, ev_node: np.ndarray, ev_ts: np.ndarray, forward: bool
) -> np.ndarray:
    """Per row (``node`` code, ``ts``), the index of an event of the same node (-1: none): the
    last at or before ``ts`` (at one instant, the last in table order), or with ``forward`` the
    first strictly after it (the first in table order). The events are searched as one array
    sorted by (node, ts), a row's key the same (node, ts) as one integer: no merge of every row."""
    mine = np.flatnonzero(ev_node >= 0)
    order = mine[np.lexsort((ev_ts[mine], ev_node[mine]))]  # stable: table order among equals
    if not len(order) or not len(ts):
        return np.full(len(ts), -1, dtype=np.int64)
    t0 = min(int(ts.min()), int(ev_ts[order].min()))
    span = max(int(ts.max()), int(ev_ts[order].max())) - t0 + 1
    if (max(int(node.max()), int(ev_node[order].max())) + 1) * span >= 2**62:
        raise ValueError("the rows and events span too long a time to be labelled")
    keys = ev_node[order] * span + (ev_ts[order] - t0)
    at = np.searchsorted(keys, node * span + (ts - t0), side="right")
    if not forward:
        at -= 1
    inside = (at >= 0) & (at < len(keys))
    found = np.full(len(ts), -1, dtype=np.int64)
    found[inside] = order[at[inside]]
    same = found >= 0
    same[same] = ev_node[found[same]] == node[same]
    return np.where(same, found, -1)


def _of(values: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Each row's ``values`` of its event ``found`` (:func:`_asof`) as float64, NaN for none."""
    out = np.full(len(found), np.nan)
    hit = found >= 0
    out[hit] = values[found[hit]]
    return out


def _since(ts: np.ndarray, event_ts: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Each row's time since its event ``found`` (:func:`_asof`) as int32, capped at
    :data:`NO_RECENT_RETURN_MS`, which also stands for none."""
    since = np.nan_to_num(ts - _of(event_ts, found), nan=NO_RECENT_RETURN_MS)
    return np.minimum(since, NO_RECENT_RETURN_MS).astype(np.int32)


def _where_positive(values: np.ndarray, found: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """``values`` of each positive row's event (``found``), NaN elsewhere, as objects: every NaN
    is the same object. (A NaN boxed per row costs 32 bytes a row, gigabytes over a fleet's
    month of rows.)"""
    out = np.full(len(found), np.nan, dtype=object)
    out[positive] = values[found[positive]]
    return out


def label_rows(
    rows: pd.DataFrame, events: pd.DataFrame, horizon_ms: int, end_ms: int | None = None
) -> pd.DataFrame:
    """Label feature rows and drop those that must not be scored (see the module docstring).

    ``rows`` needs ``node`` and ``ts`` (epoch ms) and may carry anything else (features);
    ``events`` is the dataset's node-event table. Adds ``label`` (int8), ``failure_ts`` (the next
    failure's instant, float64, NaN when none follows), the next failure's ``cause`` and
    ``detectable`` (NA unless the label is 1), and ``since_return_ms`` (the time since the node's
    last return at or before the row, int32: four bytes a row where a timestamp takes eight;
    :data:`NO_RECENT_RETURN_MS` when none). ``end_ms`` defaults to the last row's ``ts``.
    """
    if horizon_ms <= 0:
        raise ValueError("horizon must be positive")
    for col in LABEL_COLUMNS:
        if col in rows.columns:
            raise ValueError(f"rows already carry a {col!r} column")
    rows = rows.reset_index(drop=True)
    ts = rows["ts"].to_numpy(dtype=np.int64)
    end_ms = int(ts.max()) if end_ms is None and len(rows) else end_ms
    node, names = node_codes(rows["node"])

    lifecycle = events.loc[events["event"].isin(UNAVAILABLE_EVENTS | RETURN_EVENTS)]
    lc_node, _ = node_codes(lifecycle["node"], names)
    lc_ts = lifecycle["ts"].to_numpy(dtype=np.int64)
    lc_down = lifecycle["event"].isin(UNAVAILABLE_EVENTS).to_numpy()
    # several events at one instant: the last one in table order wins
    down = _of(lc_down, _asof(node, ts, lc_node, lc_ts, forward=False)) == 1  # none before: in service
    back = np.flatnonzero(~lc_down)
    since_return = _since(ts, lc_ts[back], _asof(node, ts, lc_node[back], lc_ts[back], forward=False))

    fail = failures(events)
    fail_node, _ = node_codes(fail["node"], names)
    fail_ts = fail["ts"].to_numpy(dtype=np.int64)
    nxt = _asof(node, ts, fail_node, fail_ts, forward=True)
    failure_ts = _of(fail_ts, nxt)
    positive = np.nan_to_num(failure_ts - ts, nan=np.inf) <= horizon_ms

    keep = np.flatnonzero(~down & (ts <= (end_ms - horizon_ms)))
    nxt, positive = nxt[keep], positive[keep]
    columns = {c: rows[c].array.take(keep) for c in rows.columns}
    columns.update(
        label=positive.astype(np.int8),
        failure_ts=failure_ts[keep],
        cause=_where_positive(fail["cause"].to_numpy(dtype=object), nxt, positive),
        detectable=_where_positive(fail["detectable"].to_numpy(dtype=object), nxt, positive),
        since_return_ms=since_return[keep],
    )
    return pd.DataFrame(columns, copy=False)
