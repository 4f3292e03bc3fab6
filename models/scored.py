"""Scored rows judged as one: held in memory, or on disk a node group at a time.

Every figure of an evaluation adds up over sets of rows whose nodes are apart: alert episodes,
false alarms and catches belong to one node (:class:`~foreshock.models.alerting.ThresholdCounts`),
the ranking is counts of rows at the positive rows' scores (:class:`~foreshock.models.ranking.
Ranking`), and the sweep's candidate thresholds are ranks among the distinct scores, which can be
counted a range of scores at a time (:func:`spilled_candidates`). So a fleet's month (88 M rows)
need not be held to be judged: :class:`ScoreSpill` appends each scored row to the file of its
node's group of :data:`GROUP_NODES` nodes, sorts each group by (node, ts), and
:class:`SpilledScores` hands the groups back one at a time. :class:`HeldScores` is the same
interface over rows already in memory (training's test, validation and held-out nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from foreshock.models.alerting import DAY_MS, EvalRows, candidates_of_sorted
from foreshock.models.ranking import Ranking

__all__ = ["ScoredRows", "HeldScores", "SpilledScores", "ScoreSpill", "GROUP_NODES", "SWEEP_WINDOW",
           "spilled_candidates"]

# thresholds of the equal-rate sweep judged per read of the groups from disk
SWEEP_WINDOW = 32
# what a group's EvalRows is built of
_EVAL_COLUMNS = ("node", "ts", "label", "after_return",
                 "pos", "pos_failure_ts", "pos_cause", "pos_detectable")
# nodes whose rows are judged together: a month of 60 s rows is 0.7 M rows, 27 MB as spilled
GROUP_NODES = 16


class ScoredRows(Protocol):
    """Scored rows, each predictor's scores beside them, handed out as sets whose nodes are apart."""

    cadence_ms: int
    rows: int
    positives: int  # rows labelled 1: the node fails within the horizon
    node_days: float  # scored node-time: rows x cadence
    window: int  # thresholds of a sweep judged per pass over :meth:`parts`

    def ranking(self, predictor: str) -> Ranking | None:
        """``predictor``'s ranking of every row (None unless some rows are positive and some not)."""

    def candidates(self, predictor: str) -> np.ndarray:
        """The thresholds a sweep tries on ``predictor``'s scores (:func:`candidates_of_sorted`)."""

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        """The rows a node group at a time, with ``predictor``'s scores in their order."""


@dataclass
class HeldScores:
    """Rows in memory (one :class:`EvalRows`) and each predictor's scores in their order."""

    eval_rows: EvalRows
    scores: dict[str, np.ndarray]
    window: int = 1
    _rankings: dict[str, Ranking] = field(default_factory=dict, repr=False, compare=False)

    @property
    def cadence_ms(self) -> int:
        return self.eval_rows.cadence_ms

    @property
    def rows(self) -> int:
        return len(self.eval_rows.frame)

    @property
    def positives(self) -> int:
        return int(self.eval_rows.label.sum())

    @property
    def node_days(self) -> float:
        return self.eval_rows.node_days

    def ranking(self, predictor: str) -> Ranking | None:
        if not 0 < self.positives < self.rows:
            return None
        if predictor not in self._rankings:  # the metrics and the plots both read it
            self._rankings[predictor] = Ranking.of(self.eval_rows.label, self.scores[predictor])
        return self._rankings[predictor]

    def candidates(self, predictor: str) -> np.ndarray:
        return candidates_of_sorted(np.sort(self.scores[predictor]))

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        yield self.eval_rows, self.scores[predictor]


class ScoreSpill:
    """Scored rows written to ``directory`` as they come (:meth:`add`), each to the file of its
    node's group: :data:`GROUP_NODES` nodes of one dataset, in the order they first come. Then
    :meth:`seal` sorts each group's rows by (node, ts).

    A row keeps its node, ts, label and ``after_return`` and the predictors' scores; a positive
    row also its failure, cause and detectability: nothing else of the labelled rows is read by
    the metrics."""

    def __init__(self, directory: str | Path, predictors: Sequence[str], clear_ms: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.predictors = tuple(predictors)
        self.clear_ms = clear_ms
        self._record = np.dtype([("node", np.int32), ("ts", np.int64), ("label", np.int8),
                                 ("after_return", bool), *((p, np.float64) for p in self.predictors)])
        self._node_ids: dict[str, int] = {}  # by dataset-prefixed name
        self._group_of: list[int] = []  # by node id
        self._groups: list[_Group] = []
        self._open_group: dict[str, tuple[int, int]] = {}  # by dataset: its last group, its nodes
        self._causes: dict[str, int] = {}

    def add(self, scored: pd.DataFrame, dataset: str = "") -> None:
        """Write scored rows of ``dataset``: the columns of
        :data:`~foreshock.models.alerting.EVAL_COLUMNS`, ``after_return`` and each predictor's
        score. Node names are prefixed with ``dataset/`` when one is given, so datasets stay apart."""
        if not len(scored):
            return
        inverse, uniques = pd.factorize(scored["node"])  # a category column: from its codes
        ids = np.array([self._node_id(dataset, str(n)) for n in uniques], dtype=np.int32)
        records = np.empty(len(scored), dtype=self._record)
        records["node"] = ids[inverse]
        records["ts"] = scored["ts"].to_numpy(dtype=np.int64)
        records["label"] = scored["label"].to_numpy(dtype=np.int8)
        records["after_return"] = scored["after_return"].to_numpy(dtype=bool)
        for p in self.predictors:
            records[p] = scored[p].to_numpy(dtype=np.float64)
        positive = np.flatnonzero(records["label"] == 1)
        causes, detectable = (scored[c].to_numpy()[positive] for c in ("cause", "detectable"))
        failure = _Failures(
            positive,
            scored["failure_ts"].to_numpy(dtype=np.float64)[positive],
            np.array([-1 if pd.isna(c) else self._cause_id(str(c)) for c in causes], dtype=np.int16),
            np.array([-1 if pd.isna(d) else int(bool(d)) for d in detectable], dtype=np.int8),
        )
        group = np.asarray(self._group_of, dtype=np.int32)[records["node"]]
        order = np.argsort(group, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(group[order])) + 1):
            self._groups[group[rows[0]]].append(records[rows], failure.of(rows))

    def seal(self, cadence_ms: int, datasets: Sequence[str]) -> dict[str, SpilledScores]:
        """Sort each group's rows by (node, ts), in a file of its own; for each of ``datasets``,
        its groups (none for a dataset with no row), their rows ``cadence_ms`` apart."""
        names = np.array(sorted(self._node_ids), dtype=object)
        code_of = np.empty(len(names), dtype=np.int32)  # node id -> place among the sorted names
        code_of[[self._node_ids[n] for n in names]] = np.arange(len(names), dtype=np.int32)
        nodes = pd.Index(names)
        causes = pd.Index(sorted(self._causes, key=self._causes.__getitem__))
        files: dict[str, list[Path]] = {dataset: [] for dataset in datasets}
        for group in self._groups:
            files[group.dataset].append(group.seal(self._record, code_of, self.predictors))
        self._groups.clear()
        return {dataset: SpilledScores(paths, nodes, causes, cadence_ms, self.clear_ms, self.directory)
                for dataset, paths in files.items()}

    def _node_id(self, dataset: str, node: str) -> int:
        name = f"{dataset}/{node}" if dataset else node
        if name not in self._node_ids:
            group, members = self._open_group.get(dataset, (-1, GROUP_NODES))
            if members == GROUP_NODES:
                group, members = len(self._groups), 0
                self._groups.append(_Group(self.directory / f"group-{group}", dataset))
            self._open_group[dataset] = (group, members + 1)
            self._node_ids[name] = len(self._group_of)
            self._group_of.append(group)
        return self._node_ids[name]

    def _cause_id(self, cause: str) -> int:
        return self._causes.setdefault(cause, len(self._causes))


@dataclass
class _Failures:
    """Positive rows (places among some rows) and their failure's time, cause and detectability
    (codes; -1 for none)."""

    rows: np.ndarray
    failure_ts: np.ndarray
    cause: np.ndarray
    detectable: np.ndarray

    def of(self, rows: np.ndarray) -> _Failures:
        """Those among ``rows`` (ascending places), placed among them."""
        at = np.searchsorted(rows, self.rows)
        mine = (at < rows.size) & (rows[np.minimum(at, rows.size - 1)] == self.rows)
        return _Failures(at[mine], self.failure_ts[mine], self.cause[mine], self.detectable[mine])

    @classmethod
    def concat(cls, parts: Sequence[_Failures]) -> _Failures:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))


@dataclass
class _Group:
    """A group's rows as they came, in a file (:meth:`append`), until :meth:`seal` sorts them."""

    path: Path
    dataset: str
    rows: int = 0
    failures: list[_Failures] = field(default_factory=list)

    def append(self, records: np.ndarray, failures: _Failures) -> None:
        with self.path.open("ab") as f:
            records.tofile(f)
        self.failures.append(replace(failures, rows=failures.rows + self.rows))
        self.rows += len(records)

    def seal(self, record: np.dtype, code_of: np.ndarray, predictors: Sequence[str]) -> Path:
        """Write the rows in (node, ts) order, nodes by their places among every node's sorted
        names (``code_of``), a column a file in the folder ``<path>.group``; delete the file they
        came in."""
        records = np.fromfile(self.path, dtype=record)
        node = code_of[records["node"]]
        order = np.lexsort((records["ts"], node))
        place = np.empty_like(order)
        place[order] = np.arange(order.size)
        failures = _Failures.concat(self.failures)
        pos = place[failures.rows]
        by_place = np.argsort(pos, kind="stable")
        columns = {"node": node[order], **{name: records[name][order] for name in
                                           ("ts", "label", "after_return", *predictors)},
                   "pos": pos[by_place], "pos_failure_ts": failures.failure_ts[by_place],
                   "pos_cause": failures.cause[by_place], "pos_detectable": failures.detectable[by_place]}
        out = self.path.with_suffix(".group")
        out.mkdir()
        for name, values in columns.items():
            np.save(out / f"{name}.npy", values)
        self.path.unlink()
        return out


@dataclass
class SpilledScores:
    """Scored rows on disk, a node group a folder of columns (:meth:`ScoreSpill.seal`); ``nodes``
    and ``causes`` name the codes the files hold."""

    files: list[Path]
    nodes: pd.Index
    causes: pd.Index
    cadence_ms: int
    clear_ms: int
    scratch: Path  # where the sweep's candidates are counted (:func:`spilled_candidates`)
    window: int = SWEEP_WINDOW
    _rankings: dict[str, Ranking] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def union(cls, parts: Sequence[SpilledScores]) -> SpilledScores:
        """The groups of every one of ``parts`` (spilled together), judged as one."""
        first = parts[0]
        return cls([f for p in parts for f in p.files], first.nodes, first.causes, first.cadence_ms,
                   first.clear_ms, first.scratch, first.window)

    @cached_property
    def rows(self) -> int:
        return sum(self._size(f, "label") for f in self.files)

    @cached_property
    def positives(self) -> int:
        return sum(self._size(f, "pos") for f in self.files)

    @property
    def node_days(self) -> float:
        return self.rows * self.cadence_ms / DAY_MS

    def ranking(self, predictor: str) -> Ranking | None:
        if not 0 < self.positives < self.rows:
            return None
        if predictor not in self._rankings:  # the metrics and the plots both read it
            positive = np.concatenate([g[predictor][g["pos"]] for g in self._groups("pos", predictor)])
            self._rankings[predictor] = Ranking.of_parts(positive, None, lambda: (
                (group["label"], group[predictor], None) for group in self._groups("label", predictor)))
        return self._rankings[predictor]

    def candidates(self, predictor: str) -> np.ndarray:
        return spilled_candidates(lambda: (g[predictor] for g in self._groups(predictor)), self.rows,
                                  self.scratch)

    def parts(self, predictor: str) -> Iterator[tuple[EvalRows, np.ndarray]]:
        for group in self._groups(*_EVAL_COLUMNS, predictor):
            yield self._eval_rows(group), group[predictor]

    def _groups(self, *names: str) -> Iterator[dict[str, np.ndarray]]:
        """Each group's ``names`` columns, a group at a time."""
        for path in self.files:
            yield {name: np.load(path / f"{name}.npy") for name in names}

    @staticmethod
    def _size(path: Path, name: str) -> int:
        return int(np.load(path / f"{name}.npy", mmap_mode="r").shape[0])

    def _eval_rows(self, group: dict[str, np.ndarray]) -> EvalRows:
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


# distinct scores held at once while the sweep's candidates are found over rows on disk
BUCKET_VALUES = 1 << 22


def spilled_candidates(scores: Callable[[], Iterable[np.ndarray]], rows: int, scratch: Path,
                       bucket_values: int = BUCKET_VALUES) -> np.ndarray:
    """:func:`candidates_of_sorted` of the ``rows`` scores handed out a group at a time by
    ``scores``, holding about ``bucket_values`` distinct scores at once, not a sorted copy of
    every row's: the ranks are counted among the distinct scores.

    A first pass samples each group's distinct scores and cuts the score range into buckets of
    about ``bucket_values`` distinct scores each; a second writes each group's distinct scores to
    their buckets' files in ``scratch``; then the buckets are counted, and those holding a wanted
    rank read again."""
    stride = max(1, rows // (bucket_values // 4))
    # a copy of each group's sample, not a view that would keep every group's distinct scores
    sample = np.sort(np.concatenate([np.empty(0), *(np.unique(s)[::stride].copy() for s in scores())]))
    step = max(1, bucket_values // stride)
    # bucket b holds the scores in [bounds[b - 1], bounds[b]), each group's once: a score that many
    # groups share is written once per group, as the sample counts it
    bounds = np.unique(sample[step::step])
    paths = [scratch / f"bucket-{b}.f8" for b in range(bounds.size + 1)]
    files = [path.open("wb") for path in paths]
    try:
        for s in scores():
            distinct = np.unique(s).astype(np.float64, copy=False)
            for b, values in enumerate(np.split(distinct, np.searchsorted(distinct, bounds, side="left"))):
                values.tofile(files[b])
    finally:
        for f in files:
            f.close()
    try:
        counts = [np.unique(np.fromfile(path)).size for path in paths]
        total = sum(counts)
        if total <= 400:
            return np.concatenate([np.empty(0), *(np.unique(np.fromfile(path)) for path in paths)])[::-1]
        ranks = np.unique(np.geomspace(1, total, 400).astype(int))  # 1 = the top score
        wanted = total - ranks  # ascending positions among the distinct scores, from the top rank down
        out = np.empty(wanted.size)
        start = 0
        for path, count in zip(paths, counts, strict=True):
            mine = (wanted >= start) & (wanted < start + count)
            if mine.any():
                out[mine] = np.unique(np.fromfile(path))[wanted[mine] - start]
            start += count
        return out
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
