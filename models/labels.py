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

Each row also carries ``returned_ts``, the node's last ``repaired``/``up`` event at or before it:
the evaluation counts the false alarms raised soon after a node came back (the feature windows
start afresh at a return, so such an alarm is not an echo of the burst that preceded the
failure). It is never a feature.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from foreshock.ingest.contract import RETURN_EVENTS, UNAVAILABLE_EVENTS

__all__ = ["failures", "label_rows"]

LABEL_COLUMNS = ("label", "failure_ts", "cause", "detectable", "returned_ts")


def failures(events: pd.DataFrame) -> pd.DataFrame:
    """The ``failed`` events (node, ts, cause, detectable), sorted by time."""
    out = events.loc[events["event"] == "failed", ["node", "ts", "cause", "detectable"]]
    return out.sort_values(["ts", "node"], kind="stable").reset_index(drop=True)


def _asof(rows: pd.DataFrame, right: pd.DataFrame, direction: str, exact: bool) -> pd.DataFrame:
    """merge_asof on (node, ts) that keeps ``rows``' order and index."""
    left = rows[["node", "ts"]].assign(
        _row=np.arange(len(rows)), ts=rows["ts"].astype("int64"), node=rows["node"].astype(str)
    )
    left = left.sort_values("ts", kind="stable")
    right = right.assign(ts=right["ts"].astype("int64"), node=right["node"].astype(str))
    right = right.sort_values("ts", kind="stable")
    merged = pd.merge_asof(
        left, right, on="ts", by="node", direction=direction, allow_exact_matches=exact, suffixes=("", "_r")
    )
    return merged.sort_values("_row", kind="stable").reset_index(drop=True)


def _where_positive(values: pd.Series, positive: np.ndarray) -> np.ndarray:
    """``values`` on positive rows, NaN elsewhere, as objects: every NaN is the same object.
    (A NaN boxed per row costs 32 bytes a row, gigabytes over a fleet's month of rows.)"""
    out = np.full(len(values), np.nan, dtype=object)
    out[positive] = values[positive].to_numpy(dtype=object)
    return out


def label_rows(
    rows: pd.DataFrame, events: pd.DataFrame, horizon_ms: int, end_ms: int | None = None
) -> pd.DataFrame:
    """Label feature rows and drop those that must not be scored (see the module docstring).

    ``rows`` needs ``node`` and ``ts`` (epoch ms) and may carry anything else (features);
    ``events`` is the dataset's node-event table. Adds ``label`` (int8), ``failure_ts`` (the next
    failure's instant, NA when none follows), and the next failure's ``cause`` and ``detectable``
    (NA unless the label is 1), and ``returned_ts`` (the node's last return before the row, NA when
    none). ``end_ms`` defaults to the last row's ``ts``.
    """
    if horizon_ms <= 0:
        raise ValueError("horizon must be positive")
    for col in LABEL_COLUMNS:
        if col in rows.columns:
            raise ValueError(f"rows already carry a {col!r} column")
    rows = rows.reset_index(drop=True)
    end_ms = int(rows["ts"].max()) if end_ms is None and len(rows) else end_ms
    lifecycle = events.loc[
        events["event"].isin(UNAVAILABLE_EVENTS | RETURN_EVENTS), ["node", "ts", "event"]
    ]
    lifecycle = lifecycle.assign(_down=lifecycle["event"].isin(UNAVAILABLE_EVENTS))
    # Several events at one instant: the last one in table order wins, so sort stably.
    state = _asof(rows, lifecycle[["node", "ts", "_down"]], "backward", True)["_down"]
    down = state.eq(True).to_numpy(dtype=bool)  # NaN (no event before the row): in service
    back = lifecycle.loc[~lifecycle["_down"], ["node", "ts"]]
    returned_ts = _asof(rows, back.assign(returned_ts=back["ts"]), "backward", True)["returned_ts"]

    fail = failures(events).rename(columns={"ts": "failure_ts"})
    fail = fail.assign(ts=fail["failure_ts"])
    nxt = _asof(rows, fail, "forward", False)
    failure_ts = nxt["failure_ts"].astype("Int64")
    delta = failure_ts.astype("float64").to_numpy() - rows["ts"].to_numpy(dtype="float64")
    positive = np.nan_to_num(delta, nan=np.inf) <= horizon_ms

    keep = ~down & (rows["ts"].to_numpy() <= (end_ms - horizon_ms))
    out = rows.assign(
        label=positive.astype(np.int8),
        failure_ts=failure_ts.to_numpy(),
        cause=_where_positive(nxt["cause"], positive),
        detectable=_where_positive(nxt["detectable"], positive),
        returned_ts=returned_ts.astype("Int64").to_numpy(),
    )
    return out.loc[keep].reset_index(drop=True)
