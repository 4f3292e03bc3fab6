"""Scored rows judged as one: held in memory, or on disk a node group at a time.

Every figure of an evaluation but two adds up over sets of rows whose nodes are apart: alert
episodes, false alarms and catches belong to one node (:class:`~foreshock.models.alerting.
ThresholdCounts`). The two that do not, the ranking (PR- and ROC-AUC) and the candidate
thresholds of the equal-rate sweep, read one score and one label per row. So a fleet's month
(88 M rows) need not be held whole to be judged: :class:`SpilledScores` writes each scored
partition to disk, regroups the partitions by node group, and hands the groups back one at a time,
while a predictor's scores and the labels come back whole (9 bytes a row) only for the ranking and
the candidates. :class:`HeldScores` is the same interface over rows already in memory (training's
test, validation and held-out nodes).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from foreshock.models.alerting import EvalRows

__all__ = ["ScoredRows", "HeldScores", "SpilledScores", "ScoreSpill", "SWEEP_WINDOW"]

# thresholds of the equal-rate sweep judged per read of the groups from disk
SWEEP_WINDOW = 32


class ScoredRows(Protocol):
    """Scored rows, each predictor's scores beside them, handed out as sets whose nodes are apart."""

    cadence_ms: int
    rows: int
    window: int  # thresholds of a sweep judged per pass over :meth:`parts`

    def label(self) -> np.ndarray:
        """Every row's label (1: the node fails within the horizon), in :meth:`score`'s order."""

    def score(self, predictor: str) -> np.ndarray:
        """Every row's score by ``predictor``: a new array, which the caller may sort."""

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        """The rows a node group at a time, with ``predictor``'s scores in their order."""


@dataclass
class HeldScores:
    """Rows in memory (one :class:`EvalRows`) and each predictor's scores in their order."""

    eval_rows: EvalRows
    scores: dict[str, np.ndarray]
    window: int = 1

    @property
    def cadence_ms(self) -> int:
        return self.eval_rows.cadence_ms

    @property
    def rows(self) -> int:
        return len(self.eval_rows.frame)

    def label(self) -> np.ndarray:
        return self.eval_rows.label

    def score(self, predictor: str) -> np.ndarray:
        return self.scores[predictor].copy()

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        yield self.eval_rows, self.scores[predictor]


class ScoreSpill:
    """Scored partitions written to ``directory`` as they come (:meth:`add`), then regrouped by node
    group (:meth:`seal`): partitions that share a node belong to one group.

    Each partition keeps its node, ts, label and ``after_return`` columns and the predictors'
    scores a row each, and its positive rows' failure, cause and detectability: nothing else of
    the labelled rows is read by the metrics."""

    def __init__(self, directory: str | Path, predictors: Sequence[str], clear_ms: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.predictors = tuple(predictors)
        self.clear_ms = clear_ms
        self._node_ids: dict[str, int] = {}
        self._causes: dict[str, int] = {}
        self._parent: list[int] = []  # union-find over node ids: a group is a set of linked nodes
        self._chunks: list[tuple[Path, str, int]] = []  # file, dataset, one of its node ids

    def add(self, scored: pd.DataFrame, dataset: str = "") -> None:
        """Write one scored partition of ``dataset``: the columns of
        :data:`~foreshock.models.alerting.EVAL_COLUMNS`, ``after_return`` and each predictor's
        score. Node names are prefixed with ``dataset/`` when one is given, so datasets stay apart."""
        prefix = f"{dataset}/" if dataset else ""
        if not len(scored):
            return
        inverse, uniques = pd.factorize(scored["node"])  # a category column: from its codes
        ids = np.array([self._node_id(f"{prefix}{n}") for n in uniques], dtype=np.int32)
        for other in ids[1:]:
            self._union(int(ids[0]), int(other))
        label = scored["label"].to_numpy(dtype=np.int8)
        pos = np.flatnonzero(label == 1)
        detectable = scored["detectable"].iloc[pos].astype("object")
        path = self.directory / f"chunk-{len(self._chunks)}.npz"
        np.savez(
            path,
            node=ids[inverse],
            ts=scored["ts"].to_numpy(dtype=np.int64),
            label=label,
            after_return=scored["after_return"].to_numpy(dtype=bool),
            pos=pos,
            pos_failure_ts=scored["failure_ts"].iloc[pos].to_numpy(dtype=np.float64),
            pos_cause=np.array([-1 if pd.isna(c) else self._cause_id(str(c))
                                for c in scored["cause"].iloc[pos]], dtype=np.int16),
            pos_detectable=np.array([-1 if pd.isna(d) else int(bool(d)) for d in detectable], dtype=np.int8),
            **{p: scored[p].to_numpy(dtype=np.float64) for p in self.predictors},
        )
        self._chunks.append((path, dataset, int(ids[0])))

    def seal(self, cadence_ms: int) -> dict[str, SpilledScores]:
        """Regroup the partitions by node group, each group's rows in (node, ts) order in a file
        of its own; per dataset, its groups, their rows ``cadence_ms`` apart."""
        names = np.array(sorted(self._node_ids), dtype=object)
        code_of = np.empty(len(names), dtype=np.int32)  # node id -> place among the sorted names
        code_of[[self._node_ids[n] for n in names]] = np.arange(len(names), dtype=np.int32)
        members: dict[int, list[tuple[Path, str]]] = {}
        for path, dataset, node in self._chunks:
            members.setdefault(self._root(node), []).append((path, dataset))
        nodes = pd.Index(names)
        causes = pd.Index(sorted(self._causes, key=self._causes.__getitem__))
        groups: dict[str, list[Path]] = {}
        for i, chunks in enumerate(members.values()):
            path = self.directory / f"group-{i}.npz"
            _regroup([c for c, _ in chunks], path, code_of, self.predictors)
            groups.setdefault(chunks[0][1], []).append(path)
        self._chunks.clear()
        return {dataset: SpilledScores(files, nodes, causes, cadence_ms, self.clear_ms)
                for dataset, files in groups.items()}

    def remove(self) -> None:
        """Delete the directory and everything written to it."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _node_id(self, name: str) -> int:
        if name not in self._node_ids:
            self._node_ids[name] = len(self._parent)
            self._parent.append(len(self._parent))
        return self._node_ids[name]

    def _cause_id(self, cause: str) -> int:
        return self._causes.setdefault(cause, len(self._causes))

    def _root(self, node: int) -> int:
        while self._parent[node] != node:
            self._parent[node] = self._parent[self._parent[node]]
            node = self._parent[node]
        return node

    def _union(self, a: int, b: int) -> None:
        ra, rb = self._root(a), self._root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)


def _regroup(chunks: list[Path], path: Path, code_of: np.ndarray, predictors: Sequence[str]) -> None:
    """One group's partitions as one file, its rows in (node, ts) order and node ids recoded to
    their places among every node's sorted names; the partitions' files are deleted."""
    loaded = [dict(np.load(c)) for c in chunks]
    at = np.cumsum([0] + [len(part["ts"]) for part in loaded])
    columns = {name: np.concatenate([part[name] for part in loaded])
               for name in ("node", "ts", "label", "after_return", *predictors)}
    columns["node"] = code_of[columns["node"]]
    order = np.lexsort((columns["ts"], columns["node"]))
    sorted_columns = {name: values[order] for name, values in columns.items()}
    place = np.empty_like(order)
    place[order] = np.arange(order.size)
    pos = np.concatenate([part["pos"] + at[i] for i, part in enumerate(loaded)])
    pos_columns = {name: np.concatenate([part[name] for part in loaded])
                   for name in ("pos_failure_ts", "pos_cause", "pos_detectable")}
    new_pos = place[pos]
    by_place = np.argsort(new_pos, kind="stable")
    np.savez(path, **sorted_columns, pos=new_pos[by_place],
             **{name: values[by_place] for name, values in pos_columns.items()})
    for c in chunks:
        c.unlink()


@dataclass
class SpilledScores:
    """Scored rows on disk, a node group a file (:meth:`ScoreSpill.seal`); ``nodes`` and ``causes``
    name the codes the files hold."""

    files: list[Path]
    nodes: pd.Index
    causes: pd.Index
    cadence_ms: int
    clear_ms: int
    window: int = SWEEP_WINDOW

    @classmethod
    def union(cls, parts: Sequence[SpilledScores]) -> SpilledScores:
        """The groups of every one of ``parts`` (spilled together), judged as one."""
        first = parts[0]
        return cls([f for p in parts for f in p.files], first.nodes, first.causes, first.cadence_ms,
                   first.clear_ms, first.window)

    @property
    def rows(self) -> int:
        return sum(self._length(f) for f in self.files)

    def label(self) -> np.ndarray:
        return self._column("label")

    def score(self, predictor: str) -> np.ndarray:
        return self._column(predictor)

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        for path in self.files:
            with np.load(path) as group:
                yield self._eval_rows(group), group[predictor]

    def _column(self, name: str) -> np.ndarray:
        """``name`` of every group, one after another, in one array filled a group at a time."""
        out = None
        at = 0
        for path in self.files:
            with np.load(path) as group:
                values = group[name]
            if out is None:
                out = np.empty(self.rows, dtype=values.dtype)
            out[at : at + values.size] = values
            at += values.size
        return out if out is not None else np.empty(0)

    @staticmethod
    def _length(path: Path) -> int:
        with np.load(path) as group:
            return int(group["label"].size)

    def _eval_rows(self, group: np.lib.npyio.NpzFile) -> EvalRows:
        n = group["ts"].size
        pos = group["pos"]
        failure_ts = np.full(n, np.nan)
        failure_ts[pos] = group["pos_failure_ts"]
        cause = np.full(n, -1, dtype=np.int16)
        cause[pos] = group["pos_cause"]
        detectable = np.full(n, -1, dtype=np.int8)
        detectable[pos] = group["pos_detectable"]
        frame = pd.DataFrame({
            "node": pd.Categorical.from_codes(group["node"], categories=self.nodes),
            "ts": group["ts"],
            "label": group["label"],
            "failure_ts": failure_ts,
            "cause": pd.Categorical.from_codes(cause, categories=self.causes),
            "detectable": pd.Categorical.from_codes(detectable, categories=pd.Index([False, True])),
            "after_return": group["after_return"],
        }, copy=False)
        return EvalRows(frame, self.cadence_ms, self.clear_ms)
