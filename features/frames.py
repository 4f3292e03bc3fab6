"""Telemetry frames (dataset layout) and contract records -> the numeric columns :func:`bucketize` reads.

Node ids and link ports are strings on the wire; the engines work on dense int codes
(:class:`Codes`). A link port counts as *down* when it reports a state that does not contain
``ACTIVE`` (sysfs ``1: DOWN``, ``2: INIT``, ``3: ARMED``); an absent state is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np
import pandas as pd

from foreshock.features.buckets import gpu_columns, link_columns
from foreshock.features.spec import FeatureSet
from foreshock.ingest.contract import GpuSample, LinkSample, NodeEvent, XidEvent

__all__ = ["KINDS", "EVENTS", "Codes", "needed_columns", "to_columns", "records_to_frames"]

KINDS: Final = ("gpu", "xid", "link")
"""The telemetry kinds that feed bucket statistics."""
EVENTS: Final = "events"
"""Node lifecycle events: not telemetry, but they say where windows start
(:mod:`foreshock.features.returns`)."""
_RECORD_KIND: Final = {GpuSample: "gpu", XidEvent: "xid", LinkSample: "link", NodeEvent: EVENTS}


class Codes:
    """Strings -> dense int codes in first-seen order (grows; never forgets)."""

    def __init__(self, names: Sequence[str] = ()):
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self.encode(np.asarray(names, dtype=object))

    def __len__(self) -> int:
        return len(self.names)

    def encode(self, values: Any) -> np.ndarray:
        """Codes of ``values`` (a Series or array-like of str), adding unseen strings."""
        codes, uniques = pd.factorize(
            values if isinstance(values, pd.Series) else np.asarray(values, dtype=object)
        )
        names = np.asarray(uniques, dtype=object).tolist()
        mapped = np.array([self._index.get(name, -1) for name in names], dtype=np.int64)
        for i in np.flatnonzero(mapped < 0):
            mapped[i] = self._index[names[i]] = len(self.names)
            self.names.append(names[i])
        return mapped[codes] if len(codes) else np.empty(0, dtype=np.int64)

    def lookup(self, names: Iterable[str]) -> np.ndarray:
        """Codes of known names (KeyError for unknown ones)."""
        return np.array([self._index[n] for n in names], dtype=np.int64)


def _float(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), np.nan)
    col = df[name]
    if col.dtype == np.float64:
        return col.to_numpy()
    if not pd.api.types.is_numeric_dtype(col.dtype):
        col = pd.to_numeric(col, errors="coerce")
    return col.to_numpy(dtype=np.float64, na_value=np.nan)


def _int(df: pd.DataFrame, name: str, default: int) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), default, dtype=np.int64)
    col = df[name]
    if pd.api.types.is_integer_dtype(col.dtype) and not col.hasnans:
        return col.to_numpy(dtype=np.int64)
    return pd.to_numeric(col, errors="coerce").fillna(default).to_numpy(dtype=np.int64)


def to_columns(
    kind: str, df: pd.DataFrame, fs: FeatureSet, nodes: Codes, ports: Codes
) -> dict[str, np.ndarray]:
    """Numeric columns of one telemetry frame (columns as in the dataset layout)."""
    cols = {"node": nodes.encode(df["node"]), "ts": _int(df, "ts", 0)}
    if kind == "gpu":
        cols["gpu"] = _int(df, "gpu", 0)
        cols.update({f: _float(df, f) for f in gpu_columns(fs)})
    elif kind == "xid":
        cols.update(gpu=_int(df, "gpu", -1), xid=_int(df, "xid", -1), count=_float(df, "count"))
        cols["count"] = np.where(np.isnan(cols["count"]), 1.0, cols["count"])
    elif kind == "link":
        cols["port"] = ports.encode(df["port"].astype(str))
        state = df["state"] if "state" in df.columns else pd.Series([None] * len(df), dtype=object)
        codes, uniques = pd.factorize(state)  # a handful of distinct states: classify those
        down = np.array([0.0 if "ACTIVE" in str(u).upper() else 1.0 for u in uniques] + [np.nan])
        cols["down"] = down[codes]
        cols.update({f: _float(df, f) for f in link_columns(fs)})
    else:
        raise ValueError(f"unknown telemetry kind {kind!r}")
    return cols


def _column(values: list[Any]) -> Any:
    """A numeric (or all-None) list as a float/int array (None -> NaN), anything else as it is."""
    sample = next((v for v in values if v is not None), None)
    if sample is None:
        return np.full(len(values), np.nan)
    if isinstance(sample, str | dict):
        return values
    return np.array(values, dtype=np.float64) if None in values else np.array(values)


def needed_columns(kind: str, fs: FeatureSet) -> list[str]:
    """The dataset-layout columns of ``kind`` that :func:`to_columns` reads for ``fs``."""
    if kind == "gpu":
        return ["node", "ts", "gpu", *gpu_columns(fs)]
    if kind == "xid":
        return ["node", "ts", "gpu", "xid", "count"]
    if kind == EVENTS:
        return ["node", "ts", "event"]
    return ["node", "ts", "port", "state", *link_columns(fs)]


def records_to_frames(records: Iterable[Any], fs: FeatureSet) -> dict[str, pd.DataFrame]:
    """Group contract records by kind (:data:`KINDS` and :data:`EVENTS`) into dataset-layout
    frames of the columns ``fs`` reads (the rest are never turned into columns: this is the
    online engine's hot path); other record types are ignored."""
    by_type: dict[type, list[Any]] = {}
    for r in records:
        if type(r) in _RECORD_KIND:
            by_type.setdefault(type(r), []).append(r)
    out = {}
    for t, recs in by_type.items():
        kind = _RECORD_KIND[t]
        fields = [f for f in needed_columns(kind, fs) if f in t.__struct_fields__]
        out[kind] = pd.DataFrame({f: _column([getattr(r, f) for r in recs]) for f in fields})
    return out
