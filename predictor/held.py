"""A partition's records read but not applied yet, as numpy columns, and how they reach the engine.

The risk service reads records a poll at a time and applies them when their boundary closes
(:mod:`foreshock.predictor.partition`). In between they wait here as the columns the feature
engine reads (:func:`engine_columns`), one chunk per poll and log, each row with its effective
time: no Python object per record, and nothing converted twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import pandas as pd

from foreshock.features.frames import EVENTS, needed_columns
from foreshock.features.spec import FeatureSet
from foreshock.ingest.columns import record_columns
from foreshock.ingest.contract import RECORD_TYPES, Topic, decode

__all__ = ["HeldRecords", "apply_by_tick", "engine_columns", "KIND_OF"]

KIND_OF: Final = {Topic.GPU: "gpu", Topic.XID: "xid", Topic.LINK: "link", Topic.NODE_EVENTS: EVENTS}
"""The feature engine's kind (:data:`foreshock.features.frames.KINDS`, ``events``) of each telemetry topic."""

Columns = Mapping[str, np.ndarray]
Taken = dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]


def engine_columns(fs: FeatureSet) -> dict[str, tuple[str, ...]]:
    """Per telemetry topic, the record fields kept for an engine of ``fs``: what it reads, and a
    node event's kind (the service reads it for the nodes out of service)."""
    out = {}
    for topic, kind in KIND_OF.items():
        fields = needed_columns(kind, fs) + (["event"] if topic == Topic.NODE_EVENTS else [])
        out[topic] = tuple(dict.fromkeys(["node", "ts", *fields]))
    return out


def _rows(cols: Columns, pick: Any) -> dict[str, np.ndarray]:
    return {k: v[pick] for k, v in cols.items()}


def _joined(chunks: Sequence[tuple[np.ndarray, Columns]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    if len(chunks) == 1:
        return chunks[0][0], dict(chunks[0][1])
    return (np.concatenate([eff for eff, _ in chunks]),
            {k: np.concatenate([c[k] for _, c in chunks]) for k in chunks[0][1]})


class HeldRecords:
    """Rows per topic, each with its effective time, in the order they were read."""

    def __init__(self) -> None:
        self._chunks: dict[str, list[tuple[np.ndarray, Columns]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic: str, eff: np.ndarray, columns: Columns) -> None:
        """Hold rows of ``topic`` (``columns`` and their effective times ``eff``, one per row)."""
        if len(eff):
            self._chunks.setdefault(topic, []).append((eff, columns))
            self._count += len(eff)

    def earliest(self) -> int | None:
        """The least effective time held (None: nothing held)."""
        return min((int(eff.min()) for chunks in self._chunks.values() for eff, _ in chunks), default=None)

    def times(self, topic: str) -> list[int]:
        """The effective times of ``topic``'s rows, in the order they were read."""
        return [int(t) for eff, _ in self._chunks.get(topic, ()) for t in eff]

    def take(self, until: int) -> Taken:
        """Remove the rows whose effective time is ``<= until``; per topic, they come sorted by that
        time, rows of equal time in the order they were read (so the engine keeps the last of two
        duplicates received)."""
        out: Taken = {}
        for topic, chunks in self._chunks.items():
            picked, kept = [], []
            for eff, cols in chunks:
                due = eff <= until
                if due.all():
                    picked.append((eff, cols))
                elif due.any():
                    picked.append((eff[due], _rows(cols, due)))
                    kept.append((eff[~due], _rows(cols, ~due)))
                else:
                    kept.append((eff, cols))
            self._chunks[topic] = kept
            if picked:
                eff, cols = _joined(picked)
                if len(eff) > 1 and (eff[1:] < eff[:-1]).any():
                    order = np.argsort(eff, kind="stable")
                    eff, cols = eff[order], _rows(cols, order)
                out[topic] = (eff, cols)
                self._count -= len(eff)
        return out

    # ---- checkpoint form -----------------------------------------------------------------
    def export(self) -> list[Any]:
        """msgpack-ready: per topic, the effective times and each column (numbers as raw bytes)."""
        out = []
        for topic, chunks in sorted(self._chunks.items()):
            if chunks:
                eff, cols = _joined(chunks)
                out.append([topic, eff.astype("<i8").tobytes(), {
                    k: v.tolist() if v.dtype == object else {"dtype": v.dtype.str, "data": v.tobytes()}
                    for k, v in cols.items()}])
        return out

    @classmethod
    def restore(cls, saved: Sequence[Any], columns: Mapping[str, Sequence[str]]) -> HeldRecords:
        """Take back :meth:`export`'s form; also the form of checkpoints that held records, not
        columns (``[topic, effective time, encoded records]`` per group)."""
        held = cls()
        for entry in saved:
            topic = entry[0]
            if topic not in RECORD_TYPES:
                raise ValueError(f"checkpoint holds records of unknown topic {topic!r}")
            if isinstance(entry[1], int):  # records, all of one effective time
                records = decode(topic, entry[2])
                eff = np.full(len(records), entry[1], dtype=np.int64)
                held.add(topic, eff, record_columns(topic, records, columns[topic]))
                continue
            cols = {}
            for k, v in entry[2].items():
                if isinstance(v, dict):
                    cols[k] = np.frombuffer(v["data"], dtype=v["dtype"]).copy()
                else:
                    cols[k] = np.empty(len(v), dtype=object)
                    cols[k][:] = v
            held.add(topic, np.frombuffer(entry[1], dtype="<i8").astype(np.int64), cols)
        return held


def apply_by_tick(engine: Any, taken: Taken, tick_ms: int) -> None:
    """Feed rows taken by :meth:`HeldRecords.take` to ``engine`` in time order, one update per
    tick holding every topic's rows of that tick.

    The engine finalises buckets behind its newest record minus its tolerance as soon as an
    update arrives, so one update spanning more than the tolerance would drop its own early
    records of a kind it reads second; a tick per update stays within any tolerance >= a tick.
    """
    if not taken:
        return
    ticks = np.unique(np.concatenate([eff // tick_ms for eff, _ in taken.values()]))
    for tick in ticks.tolist():
        frames = {}
        for topic, (eff, cols) in taken.items():
            lo, hi = np.searchsorted(eff, [tick * tick_ms, (tick + 1) * tick_ms])
            if hi > lo:
                part = cols if hi - lo == len(eff) else _rows(cols, slice(lo, hi))
                frames[KIND_OF[topic]] = pd.DataFrame(part, copy=False)
        engine.update_frames(frames)
