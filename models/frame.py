"""From a dataset folder to the labelled frame every predictor is trained and judged on.

One frame holds, per (node, ts) at the feature cadence: the model's features, the label and the
next failure's cause (:mod:`foreshock.models.labels`), and the raw-telemetry evidence the rule baseline
reads (:func:`foreshock.models.baselines.rule_inputs`). Every predictor scores exactly these rows.

The features come from a feature table (:mod:`foreshock.features.table`): the one ``foreshock
features`` wrote, or else the dataset's own cache, computed on first use and kept under
``<data dir>/feature-cache/`` by identity (feature-set hash, cadence, dataset fingerprint), so
``train`` and ``evaluate`` compute them once between them. A table of another identity is an
error, never a silent recompute. :class:`LabelledStream` hands the labelled rows out a day at a
time, for a reader (``evaluate``) that need not hold every feature at once.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from foreshock.features.table import (
    FeatureTable,
    FeatureTableError,
    TableIdentity,
    gather_rows,
    release_freed_memory,
)
from foreshock.ingest.dataset import read_events, read_manifest
from foreshock.models.alerting import sorted_by_node_ts
from foreshock.models.baselines import RULE_COLUMNS, RuleEvidence, rule_inputs
from foreshock.models.labels import label_rows

__all__ = [
    "CACHE_DIR",
    "FeatureRows",
    "KEEP_FEATURE_BYTES",
    "LabelledData",
    "LabelledStream",
    "TableOnDask",
    "build_labelled",
    "combined_fingerprint",
    "compact_rows",
    "concat_compact",
    "scores_in_blocks",
    "FeatureBlock",
    "Scorer",
    "dataset_fingerprint",
    "feature_set_identity",
    "feature_table",
    "open_labelled",
    "write_table",
]

CACHE_DIR = "feature-cache"
"""The folder of a dataset that holds its cached feature tables, one per identity."""

Progress = Callable[[str, int, int], None]
SCORE_BLOCK_ROWS = 1 << 16
# LabelledStream.chunks' rows read of a partition at a time: what reading holds stays the same
# whatever a partition's size (a 2,048-node fleet's node-group day is 440 k rows)
CHUNK_ROWS = 1 << 15
# FeatureRows' block of a frame's own features, and the batch LightGBM reads of any
FEATURE_BLOCK_ROWS = 1 << 16
# FeatureRows keeps every block it read from a table when all its rows' features fit in this:
# LightGBM, the boosters and the prior read the same rows several times over, and a table day read
# again costs more than a small period's features held. Past it, one day is held at a time.
KEEP_FEATURE_BYTES = 256 << 20
# concat_compact hands freed pieces back to the system (release_freed_memory) after this many bytes
RELEASE_BYTES = 128 << 20


@dataclass
class LabelledData:
    """The labelled rows and what they were made from.

    Read from a feature table, :attr:`frame` holds every row's labels, rule evidence and the
    row's place among its table day's partitions (``_src``), not its features: a month of a
    2,048-node fleet is 84.5 M rows, 34 GB of float32 features, and no step needs them all at
    once. A step takes the features of the rows it works on (:meth:`with_features`), or scores
    rows a table day at a time (:meth:`scores`). Given the features as a frame, :attr:`frame`
    holds them too. A subset of :attr:`frame` keeps its index, the rows' positions, which is how
    both methods find their features."""

    frame: pd.DataFrame
    feature_names: list[str]
    feature_set_hash: str
    cadence_ms: int
    horizon_ms: int
    manifest: dict[str, Any]
    fingerprint: str
    table: FeatureTable | None = None  # where the features come from (None: they are in the frame)
    days: list[tuple[int, int, int]] = field(default_factory=list)  # (day, first row, end) per table day

    chunk_count = 1

    def chunks(self) -> Iterator[FeatureBlock]:
        """The frame and its features, as :meth:`LabelledStream.chunks` hands out its partitions."""
        yield FeatureBlock(self.frame, self.feature_matrix(self.frame))

    def _in_frame(self, rows: pd.DataFrame) -> bool:
        return self.table is None or all(n in rows.columns for n in self.feature_names)

    def with_features(self, rows: pd.DataFrame) -> pd.DataFrame:
        """``rows`` (rows of :attr:`frame`, any order) with their feature columns (float32), read
        from the table, each day of it once."""
        if self._in_frame(rows):
            return rows
        return self._joined(rows, self.feature_matrix(rows))

    def with_features_of(self, parts: Sequence[pd.DataFrame]) -> list[pd.DataFrame]:
        """:meth:`with_features` of several sets of rows, each table day read once for all of
        them (and a row they share once): sets drawn across the whole period, such as the fold
        models' logistic baselines', would each read nearly every day."""
        if all(self._in_frame(rows) for rows in parts):
            return list(parts)
        union = pd.Index(np.unique(np.concatenate([rows.index.to_numpy(dtype=np.int64) for rows in parts])))
        values = self.feature_matrix(pd.DataFrame(index=union))
        return [self._joined(rows, values[union.get_indexer(rows.index)]) for rows in parts]

    def _joined(self, rows: pd.DataFrame, values: np.ndarray) -> pd.DataFrame:
        features = pd.DataFrame(values, index=rows.index, columns=self.feature_names, copy=False)
        return pd.concat([rows, features], axis=1, copy=False)

    def feature_matrix(self, rows: pd.DataFrame) -> np.ndarray:
        """The features of ``rows`` (rows of :attr:`frame`, any order), float32, one row per row
        and one column per :attr:`feature_names`, read from the table, each day of it once."""
        names = self.feature_names
        if self._in_frame(rows):
            return rows[names].to_numpy(np.float32, na_value=np.nan)
        positions = rows.index.to_numpy(dtype=np.int64)
        values = np.empty((len(rows), len(names)), dtype=np.float32)
        order = np.argsort(positions, kind="stable")
        ranked = positions[order]
        src = self.frame["_src"].to_numpy()
        assert self.table is not None
        for day, start, stop in self.days:
            lo, hi = np.searchsorted(ranked, [start, stop])
            if hi == lo:
                continue
            self.table.fill_day_rows(day, src[ranked[lo:hi]], names, values, order[lo:hi])
        return values

    def feature_rows(self, rows: pd.DataFrame) -> FeatureRows:
        """The features of ``rows`` (rows of :attr:`frame`, in its order) a block at a time."""
        return FeatureRows(rows, self.feature_names, self)

    def scores(self, rows: pd.DataFrame, scorers: Mapping[str, Scorer]) -> dict[str, np.ndarray]:
        """Each scorer's per-row scores of ``rows`` (rows of :attr:`frame`), in ``rows``' order;
        the features of one table partition (a node group's day) in memory at a time, handed to
        the scorers a block at a time (:func:`scores_in_blocks`). Every scorer scores row by row."""
        if self._in_frame(rows) or not len(rows):
            return scores_in_blocks(self.with_features(rows), scorers, self.feature_names)
        out: dict[str, np.ndarray] = {}
        for at, block in self._partition_blocks(rows):
            for name, got in scores_in_blocks(block, scorers).items():
                if name not in out:
                    out[name] = np.empty(len(rows), dtype=got.dtype)
                out[name][at] = got
        return out

    def subset_scores(
        self, rows: pd.DataFrame, subsets: Mapping[Any, tuple[np.ndarray, Scorer]]
    ) -> dict[Any, np.ndarray]:
        """Each scorer's scores of its own subset of ``rows`` (rows of :attr:`frame`; ``subsets``:
        key -> (a mask over ``rows``, the scorer)), in ``rows``' order: what :meth:`scores` gives
        that subset alone, to the bit (each subset's rows of a partition make the same blocks),
        with each table partition read once for all subsets, not once for each: the fold models'
        rows are each nearly every row of the training period."""
        if self._in_frame(rows) or not len(rows):
            return {key: self.scores(rows[mask], {key: score})[key] for key, (mask, score) in subsets.items()}
        out: dict[Any, np.ndarray] = {}
        place = {key: np.cumsum(mask) - 1 for key, (mask, _) in subsets.items()}
        for at, block in self._partition_blocks(rows):
            for key, (mask, score) in subsets.items():
                mine = mask[at]
                if not mine.any():
                    continue
                got = scores_in_blocks(FeatureBlock(block.rows[mine], block.x[mine]), {key: score})[key]
                if key not in out:
                    out[key] = np.empty(int(np.count_nonzero(mask)), dtype=got.dtype)
                out[key][place[key][at[mine]]] = got
        return {key: out.get(key, np.empty(0)) for key in subsets}

    def _partition_blocks(self, rows: pd.DataFrame) -> Iterator[tuple[np.ndarray, FeatureBlock]]:
        """``rows`` with their features, a table partition at a time: ``(which of rows, those rows
        and their features)``, each partition's rows in ``rows``' order."""
        assert self.table is not None
        positions = rows.index.to_numpy(dtype=np.int64)
        starts = np.array([start for _, start, _ in self.days], dtype=np.int64)
        day_of = np.searchsorted(starts, positions, side="right") - 1
        src = self.frame["_src"].to_numpy()
        for d in np.unique(day_of):
            at = np.flatnonzero(day_of == d)
            day = self.days[d][0]
            for mine, values in self.table.day_row_blocks(day, src[positions[at]], self.feature_names):
                yield at[mine], FeatureBlock(rows.iloc[at[mine]], values)


@dataclass(frozen=True)
class FeatureBlock:
    """Rows to score: their own columns (``rows``: labels, rule evidence) and their features
    (``x``: one matrix, a row per row and a column per feature, in the feature set's order).

    Scorers take one (:data:`Scorer`): the trees and the logistic regression read ``x`` as it
    is, the rules read ``rows``. A frame holding both would cost a copy of the features to join
    them (pandas merges the features with the rule evidence's float32 columns) and one to take
    them out again for every scorer, together as much as the logistic regression's own work."""

    rows: pd.DataFrame
    x: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, start: int, stop: int) -> FeatureBlock:
        return FeatureBlock(self.rows.iloc[start:stop], self.x[start:stop])

    @classmethod
    def of(cls, frame: pd.DataFrame, names: list[str]) -> FeatureBlock:
        """A frame holding the ``names`` features beside its other columns, as a block; the
        features keep their dtype (float32 from a table, float64 when computed in memory)."""
        return cls(frame, frame[names].to_numpy(na_value=np.nan))


Scorer = Callable[[FeatureBlock], np.ndarray]
"""A predictor's scorer: one score per row of a block, in its order."""


def scores_in_blocks(
    rows: FeatureBlock | pd.DataFrame, scorers: Mapping[str, Scorer], names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Each scorer's per-row scores of ``rows``, handed to it :data:`SCORE_BLOCK_ROWS` rows at a
    time: a scorer's float64 copy of a table day's features is gigabytes at a fleet's size.
    ``rows``: a block, or a frame holding the ``names`` features, each block of which is taken
    out once for every scorer (:meth:`FeatureBlock.of`)."""
    got: dict[str, list[np.ndarray]] = {name: [] for name in scorers}
    for i in range(0, max(len(rows), 1), SCORE_BLOCK_ROWS):
        if isinstance(rows, FeatureBlock):
            block = rows.slice(i, i + SCORE_BLOCK_ROWS)
        else:
            assert names is not None, "a frame's feature names"
            block = FeatureBlock.of(rows.iloc[i : i + SCORE_BLOCK_ROWS], names)
        for name, score in scorers.items():
            got[name].append(np.asarray(score(block)))
    return {name: np.concatenate(parts) for name, parts in got.items()}


class FeatureRows(lgb.Sequence):
    """The features of some rows, float32, served a block of rows at a time: what LightGBM bins
    a dataset from (it reads a ``lightgbm.Sequence`` a batch at a time) and what a booster
    predicts from (:meth:`blocks`), so that no step holds one matrix of every row, nor a second
    copy of a frame's features. From a feature table a block is the rows of one table day, read
    when first asked for (the rows must be in the frame's order, as every part of a split is);
    otherwise it is :data:`FEATURE_BLOCK_ROWS` rows of the frame's own feature columns. Only the
    block last read is kept, or every block read from a table while all of them fit in
    :data:`KEEP_FEATURE_BYTES`."""

    batch_size = FEATURE_BLOCK_ROWS

    def __init__(self, rows: pd.DataFrame, names: list[str], data: LabelledData | None = None) -> None:
        self.rows, self.names, self.data = rows, list(names), data
        if data is None or data._in_frame(rows):
            self.data = None
            edges = list(range(0, len(rows), FEATURE_BLOCK_ROWS))
        else:
            positions = rows.index.to_numpy(dtype=np.int64)
            if np.any(np.diff(positions) < 0):
                raise ValueError("rows read from a feature table must be in the labelled frame's order")
            edges = np.searchsorted(positions, [start for _, start, _ in data.days]).tolist()
        self.edges = sorted({0, *edges, len(rows)})
        self._held: tuple[int, int, np.ndarray] = (0, 0, np.empty((0, len(self.names)), dtype=np.float32))
        fits = self.data is not None and len(rows) * len(self.names) * 4 <= KEEP_FEATURE_BYTES
        self._kept: dict[int, np.ndarray] | None = {} if fits else None

    def __len__(self) -> int:
        return len(self.rows)

    def _matrix(self, lo: int, hi: int) -> np.ndarray:
        part = self.rows.iloc[lo:hi]
        if self.data is None:
            return part[self.names].to_numpy(np.float32, na_value=np.nan)
        return self.data.feature_matrix(part)

    def _block_at(self, row: int) -> tuple[int, int, np.ndarray]:
        lo, hi, matrix = self._held
        if not lo <= row < hi:
            i = bisect.bisect_right(self.edges, row) - 1
            lo, hi = self.edges[i], self.edges[i + 1]
            self._held = (lo, hi, np.empty((0, 0), dtype=np.float32))  # free the old block first
            kept = self._kept if self._kept is not None else {}
            matrix = kept[lo] if lo in kept else self._matrix(lo, hi)
            if self._kept is not None:
                self._kept[lo] = matrix
            self._held = (lo, hi, matrix)
        return lo, hi, matrix

    def __getitem__(self, idx: int | slice) -> np.ndarray:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise IndexError("FeatureRows takes contiguous slices only")
            parts = []
            while start < stop:
                lo, hi, matrix = self._block_at(start)
                end = min(stop, hi)
                parts.append(matrix[start - lo : end - lo])
                start = end
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.empty((0, len(self.names)), dtype=np.float32)
        row = int(idx)
        if not 0 <= row < len(self):
            raise IndexError(row)
        lo, _, matrix = self._block_at(row)
        return matrix[row - lo].astype(np.float64)  # LightGBM bins from sampled rows of doubles

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The features of ``rows`` (positions, ascending), float64 and column-major (LightGBM
        sets its bins a feature at a time): one read of each block they fall in, where
        ``self[row]`` for each of them costs a Python call a row."""
        out = np.empty((len(rows), len(self.names)), order="F")
        cuts = np.searchsorted(rows, self.edges)
        for a, b in itertools.pairwise(cuts):
            if a < b:
                lo, _, matrix = self._block_at(int(rows[a]))
                out[a:b] = matrix[rows[a:b] - lo]
        return out

    def blocks(self) -> Iterator[np.ndarray]:
        """Every block in row order."""
        for lo in self.edges[:-1]:
            yield self._block_at(lo)[2]


def dataset_fingerprint(data_dir: str | Path) -> str:
    """sha256 over the manifest, the events table and every part's name and size (cheap, and
    changes whenever the simulator writes different data)."""
    data_dir = Path(data_dir)
    h = hashlib.sha256((data_dir / "manifest.json").read_bytes())
    events = data_dir / "events.parquet"
    if events.exists():
        h.update(events.read_bytes())
    for path in sorted(data_dir.glob("*/part-*.parquet")):
        h.update(f"{path.relative_to(data_dir)}:{path.stat().st_size};".encode())
    return h.hexdigest()[:16]


def combined_fingerprint(fingerprints: list[str]) -> str:
    """One fingerprint for datasets judged together, in the order given."""
    return hashlib.sha256(";".join(fingerprints).encode()).hexdigest()[:16]


def feature_set_identity(features: pd.DataFrame, feature_set: Any = None) -> str:
    """The hash of the feature set ``features`` was computed with: ``feature_set.hash``, or the
    table's own ``attrs["feature_set_hash"]`` (a table built outside a :class:`FeatureSet`, as
    the tests' synthetic columns, names its identity there). A table of unknown identity is an
    error: a model must never record a hash its features do not have."""
    if feature_set is not None:
        return str(feature_set.hash)
    if "feature_set_hash" in features.attrs:
        return str(features.attrs["feature_set_hash"])
    raise ValueError(
        "features given without their feature set: pass feature_set, or name the table's "
        "identity in features.attrs['feature_set_hash']"
    )


def write_table(
    data_dir: str | Path,
    out: str | Path,
    *,
    feature_set: Any = None,
    cadence_ms: int = 60_000,
    client: Any = None,
    progress: Progress | None = None,
    overwrite: bool = False,
) -> FeatureTable:
    """Compute a dataset folder's feature table into ``out``
    (:func:`foreshock.features.batch.write_feature_table`, on Dask with ``client``), and keep the
    rules' evidence of the same dataset with it (:meth:`RuleEvidence.attach_to`): the table
    ``train`` and ``evaluate`` read, what ``foreshock features`` writes and the dataset's cache
    holds."""
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.features.batch import write_feature_table

    table = write_feature_table(
        data_dir,
        out,
        dataset_fingerprint=dataset_fingerprint(data_dir),
        feature_set=feature_set if feature_set is not None else DEFAULT_FEATURE_SET,
        cadence_ms=cadence_ms,
        client=client,
        progress=progress,
        overwrite=overwrite,
    )
    RuleEvidence.read(data_dir, cadence_ms).attach_to(table)
    return table


def feature_table(
    data_dir: str | Path,
    cadence_ms: int = 60_000,
    feature_set: Any = None,
    *,
    table: str | Path | None = None,
    dask_address: str | None = None,
    progress: Progress | None = None,
) -> FeatureTable:
    """The feature table of a dataset folder: ``table`` (a folder ``foreshock features`` wrote),
    which must have been computed with ``feature_set`` (default: the shipped set) at ``cadence_ms``
    from this very dataset; or, without one, the dataset's cache entry for that identity, computed
    first if it is not there (on the Dask cluster at ``dask_address`` when given). A table or a
    cache entry of another identity raises :class:`~foreshock.features.table.FeatureTableError`."""
    from foreshock.features import DEFAULT_FEATURE_SET

    fs = feature_set if feature_set is not None else DEFAULT_FEATURE_SET
    identity = TableIdentity(str(fs.hash), int(cadence_ms), dataset_fingerprint(data_dir))
    if table is not None:
        return FeatureTable.open(table, expect=identity)
    key = f"{identity.feature_set_hash[:16]}-{cadence_ms}ms-{identity.dataset_fingerprint}"
    path = Path(data_dir) / CACHE_DIR / key
    if (path / "table.json").is_file():
        return FeatureTable.open(path, expect=identity)
    try:
        return write_table(data_dir, path, feature_set=fs, cadence_ms=cadence_ms, client=dask_address,
                           progress=progress)
    except OSError as exc:
        raise FeatureTableError(
            f"cannot write the feature cache {path} ({exc}): write a table elsewhere with "
            "`foreshock features --out DIR` and pass it with --features"
        ) from exc


def _labelled_rows(
    features: pd.DataFrame, names: list[str], events: pd.DataFrame, horizon_ms: int, end_ms: int
) -> pd.DataFrame:
    """Feature rows (float32) labelled, in the engines' row order."""
    rows = pd.DataFrame(features[names].to_numpy(dtype=np.float32, na_value=np.nan), columns=names)
    rows.insert(0, "node", features["node"].astype(str).to_numpy())
    rows.insert(1, "ts", features["ts"].to_numpy(dtype=np.int64))
    return label_rows(rows, events, horizon_ms, end_ms=end_ms)


@dataclass
class LabelledStream:
    """A dataset's labelled rows, read from its feature table a partition (a node group's day) at
    a time (:meth:`chunks`): the same rows, with the same columns, as :func:`build_labelled`'s frame.

    What the rules read of the raw telemetry gives each day's rows their evidence
    (:class:`~foreshock.models.baselines.RuleEvidence`): the evidence kept with the table, or,
    for a table written without it, read once, in one pass."""

    data_dir: Path
    table: FeatureTable
    horizon_ms: int
    manifest: dict[str, Any]
    fingerprint: str
    _evidence: RuleEvidence | None = field(default=None, repr=False)

    @property
    def feature_names(self) -> list[str]:
        return self.table.feature_names

    @property
    def feature_set_hash(self) -> str:
        return self.table.identity.feature_set_hash

    @property
    def cadence_ms(self) -> int:
        return self.table.identity.cadence_ms

    @property
    def chunk_count(self) -> int:
        return sum(-(-p.rows // CHUNK_ROWS) for p in self.table.partitions)

    def _keys(self, read: pd.DataFrame, events: pd.DataFrame, src: np.ndarray) -> pd.DataFrame:
        """Rows read of the table (node, ts) labelled, each with its place ``src`` (``_src``)."""
        rows = pd.DataFrame({"node": _category(read["node"].array),
                             "ts": read["ts"].to_numpy(dtype=np.int64),
                             "_src": src})
        return label_rows(rows, events, self.horizon_ms, end_ms=int(self.manifest["end_ms"]))

    def _rule_evidence(self) -> RuleEvidence:
        if self._evidence is None:
            self._evidence = RuleEvidence.of_table(self.table, self.data_dir)
        return self._evidence

    def rows_without_features(
        self, progress: Progress | None = None
    ) -> tuple[pd.DataFrame, list[tuple[int, int, int]]]:
        """Every labelled row, in each table day's (ts, node) order, with its rule evidence and its
        place among its day's partitions (``_src``, :meth:`FeatureTable.day_row_blocks`), no
        feature, in compact dtypes (:func:`compact_rows`); and per table day, its (day, first
        row, end) in that frame."""
        events = read_events(self.data_dir)
        evidence = self._rule_evidence()
        keys, days, at = [], [], 0
        for i, day in enumerate(self.table.days):
            rows = self.table.read_day(day, ["node", "ts"], places=True)
            labelled = self._keys(rows, events, rows["_place"].to_numpy())
            keys.append(compact_rows(pd.concat([labelled, evidence.of(labelled)], axis=1)))
            days.append((day, at, at + len(labelled)))
            at += len(labelled)
            del rows, labelled
            release_freed_memory()  # a day's temporaries lie on the heap below the rows kept
            if progress is not None:
                progress("labelling the feature table's rows", i + 1, len(self.table.days))
        if not keys:
            return pd.DataFrame(columns=["node", "ts", "_src", *RULE_COLUMNS]), days
        return concat_compact(keys), days

    def chunks(self) -> Iterator[FeatureBlock]:
        """The labelled rows with their rule evidence and their features, :data:`CHUNK_ROWS` rows
        of a partition at a time, the partitions as the table lists them: not a whole day of the
        fleet sorted (2,048 nodes' day is 3 M rows), nor a node group's day (440 k)."""
        evidence = self._rule_evidence()
        events = read_events(self.data_dir)
        names = self.feature_names
        for partition in self.table.partitions:
            for part in self.table.read_slices(partition, CHUNK_ROWS):
                keys = self._keys(part, events, np.arange(len(part), dtype=np.int32))
                src = keys.pop("_src").to_numpy()
                values = gather_rows([part[name].to_numpy() for name in names], src)
                del part
                yield FeatureBlock(pd.concat([keys, evidence.of(keys)], axis=1, copy=False), values)


# labelled columns held as categories in a frame of every row (a fleet's month is 85 M rows):
# 1 or 2 bytes a row instead of an 8-byte pointer
CATEGORY_COLUMNS = ("node", "cause", "detectable")


def compact_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with those of :data:`CATEGORY_COLUMNS` it has as categories (sorted: a category
    column sorts as its values do), every column in memory of its own rather than one block per
    dtype, so that :func:`concat_compact` frees each as it goes."""
    columns = {c: _category(rows[c].array) if c in CATEGORY_COLUMNS else rows[c].array.copy() for c in rows}
    return pd.DataFrame(columns, copy=False)


def _category(values: Any) -> pd.Categorical:
    """``values`` as a category array (sorted categories), a copy. A category array (a table's
    dictionary column) keeps its codes, recoded to sorted categories: made anew it would take an
    object per row on the way."""
    if isinstance(values, pd.Categorical):
        if values.categories.is_monotonic_increasing:
            return values.copy()
        return values.reorder_categories(values.categories.sort_values())
    return pd.Categorical(np.asarray(values, dtype=object))


def concat_compact(frames: list[pd.DataFrame], by_node_ts: bool = False) -> pd.DataFrame:
    """Frames as one, their category columns (made categories where they are not, as
    :func:`compact_rows` makes them) on the union of their categories (a concat of categories
    that differ would fall back to objects); ``by_node_ts``:
    in (node, ts) order, a stable sort. Empties ``frames``, which should hold the only references
    to them.

    Built a column at a time, each frame's copy of it freed once its rows are placed: the peak is
    the rows once plus a column and each row's place, not the rows twice over (a fleet's month
    is 85 M rows, several GB in these columns)."""
    if len(frames) == 1 and (not by_node_ts or sorted_by_node_ts(frames[0])):
        return frames.pop()
    names = list(frames[0].columns)
    parts = [{c: f[c].array for c in names} for f in frames]
    frames.clear()
    for part in parts:  # rows that are not compact_rows' have their category columns made so
        part.update({c: _category(a) for c, a in part.items() if c in CATEGORY_COLUMNS
                     and not isinstance(a, pd.Categorical)})
    unions = {c: sorted(set().union(*(part[c].categories for part in parts)))
              for c in names if c in CATEGORY_COLUMNS}
    place = _places_by_node_ts(parts, unions["node"]) if by_node_ts else None
    columns: dict[str, Any] = {}
    for name in names:
        pieces = [part.pop(name) for part in parts]
        if name in unions:
            pieces = [p.set_categories(unions[name]).codes for p in pieces]
            columns[name] = pd.Categorical.from_codes(_placed(pieces, place), categories=unions[name])
        else:
            columns[name] = _placed(pieces, place)
        release_freed_memory()
    return pd.DataFrame(columns, copy=False)


def _places_by_node_ts(parts: list[dict[str, Any]], nodes: list[str]) -> np.ndarray | None:
    """Where each row of the ``parts`` (one after another) goes in (node, ts) order, a stable
    sort (None: they are in that order already); ``nodes``: the union of their node categories.

    When the parts hold each node's hours in time order one part after another (a table's
    partitions read in turn, frames already sorted), each part is sorted by itself and its rows
    of a node placed after those of the parts before it: memory holds an index a row. Otherwise
    every row is sorted at once (the keys, an order and sort buffers: some 25 bytes a row)."""
    codes = [np.asarray(part["node"].set_categories(nodes).codes) for part in parts]
    total = sum(c.size for c in codes)
    place = np.empty(total, dtype=np.int32 if total < 2**31 else np.int64)
    counts = sum(np.bincount(c, minlength=len(nodes)) for c in codes)
    free = np.cumsum(counts) - counts  # each node's next place
    last = np.full(len(nodes), np.iinfo(np.int64).min)  # each node's latest ts so far
    lo = 0
    for part, code in zip(parts, codes, strict=True):
        if not code.size:
            continue
        ts = np.asarray(part["ts"], dtype=np.int64)
        order = np.lexsort((ts, code))
        code, ts = code[order], ts[order]
        first = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])  # each node's first row in the part
        run = np.diff(np.r_[first, code.size])
        mine = code[first]
        if np.any(ts[first] < last[mine]):
            del place
            return _sorted_places(parts, codes)
        last[mine] = ts[first + run - 1]
        place[lo + order] = free[code] + np.arange(code.size) - np.repeat(first, run)
        free[mine] += run
        lo += code.size
    return None if np.all(place[1:] > place[:-1]) else place


def _sorted_places(parts: list[dict[str, Any]], codes: list[np.ndarray]) -> np.ndarray:
    """:func:`_places_by_node_ts` of rows in any order: a stable sort of every row at once."""
    ts = np.concatenate([np.asarray(part["ts"], dtype=np.int64) for part in parts])
    order = np.lexsort((ts, np.concatenate(codes)))
    del ts
    place = np.empty(order.size, dtype=np.int32 if order.size < 2**31 else np.int64)
    place[order] = np.arange(order.size, dtype=place.dtype)
    return place


def _placed(pieces: list[Any], place: np.ndarray | None) -> Any:
    """The ``pieces`` (arrays) as one, the k-th of their rows at ``place[k]`` (in turn without
    ``place``), each piece dropped from ``pieces`` once placed. Pieces of different dtypes are
    joined by pandas first, which finds their common dtype."""
    pieces[:] = [p.to_numpy() if isinstance(p, pd.arrays.NumpyExtensionArray) else p for p in pieces]
    if len({p.dtype for p in pieces}) > 1:
        pieces[:] = [pd.concat([pd.Series(p, copy=False) for p in pieces], ignore_index=True).array]
    dtype, total = pieces[0].dtype, sum(len(p) for p in pieces)
    out = np.empty(total, dtype=dtype) if isinstance(dtype, np.dtype) else dtype.empty((total,))
    lo = freed = 0
    for i, piece in enumerate(pieces):
        pieces[i] = None
        hi = lo + len(piece)
        out[slice(lo, hi) if place is None else place[lo:hi]] = piece
        freed += piece.nbytes
        del piece
        if freed >= RELEASE_BYTES:  # the freed pieces would stay resident beside the new column
            release_freed_memory()
            freed = 0
        lo = hi
    return out


def open_labelled(
    data_dir: str | Path,
    horizon_ms: int,
    cadence_ms: int = 60_000,
    feature_set: Any = None,
    *,
    table: str | Path | None = None,
    dask_address: str | None = None,
    progress: Progress | None = None,
) -> LabelledStream:
    """The labelled rows of a dataset folder, a day at a time (see :func:`feature_table` for
    where the features come from)."""
    manifest = read_manifest(data_dir)  # a folder that is no dataset says so before anything is read
    found = feature_table(
        data_dir, cadence_ms, feature_set, table=table, dask_address=dask_address, progress=progress
    )
    return LabelledStream(Path(data_dir), found, horizon_ms, manifest, found.identity.dataset_fingerprint)


def build_labelled(
    data_dir: str | Path,
    horizon_ms: int,
    cadence_ms: int = 60_000,
    feature_set: Any = None,
    features: pd.DataFrame | None = None,
    dask_address: str | None = None,
    *,
    table: str | Path | None = None,
    progress: Progress | None = None,
) -> LabelledData:
    """The labelled rows: features (``features``: node, ts, feature columns; or from the feature
    table, see :func:`feature_table`) labelled, with the rule evidence attached. From a table,
    the frame holds no features: :class:`LabelledData` reads them when a step needs them.

    Features are float32, half the memory of the engines' float64: one row a
    minute for 512 nodes over 14 days is 10 million rows, 4 GB of features instead of 8. LightGBM
    bins them anyway: its splits fall midway between the values seen in training, so a float64
    value scored online lands on the side of every split its float32 rounding does, bar values
    within float32 precision (1 part in 10 million) of a split."""
    manifest = read_manifest(data_dir)
    if features is None:
        stream = open_labelled(
            data_dir,
            horizon_ms,
            cadence_ms,
            feature_set,
            table=table,
            dask_address=dask_address,
            progress=progress,
        )
        frame, days = stream.rows_without_features(progress)
        return LabelledData(
            frame,
            stream.feature_names,
            stream.feature_set_hash,
            cadence_ms,
            horizon_ms,
            manifest,
            stream.fingerprint,
            stream.table,
            days,
        )
    names = [c for c in features.columns if c not in ("node", "ts")]
    fs_hash = feature_set_identity(features, feature_set)
    frame = _labelled_rows(features, names, read_events(data_dir), horizon_ms, int(manifest["end_ms"]))
    del features
    frame = pd.concat([frame, rule_inputs(data_dir, frame, cadence_ms)], axis=1)
    fingerprint = dataset_fingerprint(data_dir)
    return LabelledData(frame, names, fs_hash, cadence_ms, horizon_ms, manifest, fingerprint)


class TableOnDask(str):
    """A Dask scheduler address that also knows where a labelled frame's rows live on disk, so
    the workers can read training rows from the feature table themselves (:meth:`rows`) instead
    of receiving them from the process that holds the frame. It is a ``str``, and goes wherever
    an address goes."""

    def __new__(cls, address: str, data: LabelledData) -> TableOnDask:
        if data.table is None:
            raise ValueError("the labelled frame was not read from a feature table")
        self = super().__new__(cls, address)
        self.table_path = str(Path(data.table.path).resolve())
        self.names = list(data.feature_names)
        self.days = list(data.days)
        self.src = data.frame["_src"].to_numpy(dtype=np.int64)
        return self

    def rows(self, positions: np.ndarray, extra: pd.DataFrame) -> Any:
        """A Dask DataFrame of the frame's rows at ``positions`` (their features, read on the
        workers, a day per partition, by the rows' places in their table day) beside ``extra``'s
        columns (one row per position)."""
        import dask
        import dask.dataframe as dd

        order = np.argsort(positions, kind="stable")
        positions, extra = positions[order], extra.iloc[order].reset_index(drop=True)
        parts = []
        for day, start, stop in self.days:
            lo, hi = np.searchsorted(positions, [start, stop])
            if hi > lo:
                parts.append(
                    dask.delayed(_table_rows)(
                        self.table_path, day, self.names, self.src[positions[lo:hi]],
                        extra.iloc[lo:hi].reset_index(drop=True),
                    )
                )
        meta = pd.concat(
            [pd.DataFrame({n: pd.Series(dtype=np.float32) for n in self.names}), extra.iloc[:0]], axis=1
        )
        return dd.from_delayed(parts, meta=meta)


def _table_rows(
    table_path: str, day: int, names: list[str], at: np.ndarray, extra: pd.DataFrame
) -> pd.DataFrame:
    """Rows ``at`` (places in the day, :meth:`FeatureTable.fill_day_rows`) of one day of a feature
    table as float32 features beside ``extra`` (on a Dask worker)."""
    values = np.empty((len(at), len(names)), dtype=np.float32)
    FeatureTable.open(table_path).fill_day_rows(day, at, names, values, np.arange(len(at)))
    return pd.concat([pd.DataFrame(values, columns=names, copy=False), extra], axis=1)
