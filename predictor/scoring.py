"""Turning feature rows into risk records, and the board of every node's latest risk.

:func:`score_frame` scores any number of ``(node, ts)`` rows in one batched model call (the
probabilities and the SHAP contributions behind the top features). :class:`RiskBoard` keeps
each node's latest :class:`foreshock.ingest.contract.RiskScore` and a short history for the HTTP API; it
is written by the service loop and read by API threads under one short lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from foreshock.ingest.contract import FeatureContribution, RiskScore
from foreshock.models.artifact import RiskModel

__all__ = ["score_frame", "RiskBoard"]


def score_frame(model: RiskModel, frame: pd.DataFrame, top_k: int = 5) -> list[RiskScore]:
    """One :class:`RiskScore` per row of ``frame`` (columns ``node``, ``ts`` and the model's features)."""
    if frame.empty:
        return []
    proba = model.predict_proba(frame)
    tops = model.top_features(frame, k=top_k)
    nodes = frame["node"].astype(str).tolist()
    times = frame["ts"].astype(np.int64).tolist()
    return [
        RiskScore(
            node=node, ts=ts, probability=float(min(1.0, max(0.0, p))), alert=bool(p >= model.threshold),
            threshold=model.threshold, horizon_minutes=model.horizon_minutes, model_version=model.version,
            top_features=[FeatureContribution(name=n, value=v, contribution=c) for n, v, c in top],
        )
        for node, ts, p, top in zip(nodes, times, proba.tolist(), tops, strict=True)
    ]


class RiskBoard:
    """Latest score and the last ``history`` scores of every node this process scores."""

    def __init__(self, history: int = 60):
        self.history = history
        self._latest: dict[str, RiskScore] = {}
        self._past: dict[str, deque[tuple[int, float, bool]]] = {}
        self._ranked: tuple[RiskScore, ...] | None = None  # latest() until the next change
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str, Any], None]] = []

    def subscribe(self, listener: Callable[[str, Any], None]) -> None:
        """Call ``listener(kind, payload)`` after every change, under the board's lock (so in
        order): ``("record", scores)``, ``("forget", nodes)``, ``("restore", rows)``, ``("replace",
        rows)``; replaying them
        on another board (:meth:`apply`) makes it this one. It must be quick: it runs on the loop."""
        self._listeners.append(listener)

    def apply(self, kind: str, payload: Any) -> None:
        """Replay a change a listener was told of."""
        {"record": self.record, "forget": self.forget, "restore": self.restore,
         "replace": self.replace}[kind](payload)

    def _tell(self, kind: str, payload: Any) -> None:
        for listener in self._listeners:
            listener(kind, payload)

    def record(self, scores: Sequence[RiskScore]) -> None:
        """Take new scores (in time order per node); an older score never replaces a newer one."""
        with self._lock:
            for s in scores:
                past = self._past.setdefault(s.node, deque(maxlen=self.history))
                if past and s.ts <= past[-1][0]:
                    continue
                past.append((s.ts, s.probability, s.alert))
                self._latest[s.node] = s
            self._ranked = None
            self._tell("record", scores)

    def forget(self, nodes: Iterable[str]) -> None:
        """Drop nodes this process no longer owns (their partition moved to another process)."""
        nodes = list(nodes)
        with self._lock:
            for n in nodes:
                self._latest.pop(n, None)
                self._past.pop(n, None)
            self._ranked = None
            self._tell("forget", nodes)

    def latest(self) -> tuple[RiskScore, ...]:
        """Every node's latest score, highest probability first (ranked once per change: the
        API lists it on every request, scores change once per period)."""
        with self._lock:
            if self._ranked is None:
                self._ranked = tuple(sorted(self._latest.values(), key=lambda s: (-s.probability, s.node)))
            return self._ranked

    def node(self, node: str) -> tuple[RiskScore, list[tuple[int, float, bool]]] | None:
        """A node's latest score and its history (oldest first), or None if it is not scored here."""
        with self._lock:
            if node not in self._latest:
                return None
            return self._latest[node], list(self._past[node])

    def counts(self) -> tuple[int, int]:
        """(nodes scored, nodes in alert)."""
        with self._lock:
            return len(self._latest), sum(s.alert for s in self._latest.values())

    def export(self, nodes: Iterable[str]) -> list[Any]:
        """The board rows of ``nodes`` in checkpoint form."""
        import msgspec

        with self._lock:
            return [[n, msgspec.json.encode(self._latest[n]), [list(h) for h in self._past[n]]]
                    for n in nodes if n in self._latest]

    def restore(self, rows: Iterable[Any]) -> None:
        """Take back rows written by :meth:`export`."""
        self._take(list(rows), "restore")

    def replace(self, rows: Iterable[Any]) -> None:
        """Become exactly the rows written by :meth:`export`: every other node is dropped."""
        self._take(list(rows), "replace")

    def _take(self, rows: list[Any], kind: str) -> None:
        import msgspec

        with self._lock:
            if kind == "replace":
                self._latest.clear()
                self._past.clear()
            for node, latest, past in rows:
                self._latest[node] = msgspec.json.decode(latest, type=RiskScore)
                self._past[node] = deque(((int(t), float(p), bool(a)) for t, p, a in past),
                                         maxlen=self.history)
            self._ranked = None
            self._tell(kind, rows)
