"""A dataset folder read once, in time order, as slices that end on a bucket boundary.

Each telemetry table's parts follow each other in time and each part's rows are sorted by time
(:mod:`foreshock.ingest.dataset`), so reading a table's row groups in order gives its rows in
time order. :func:`time_slices` merges the three tables by time: it reads the next row group of
whichever table is furthest behind, and hands out, as one slice, every row read so far that is
older than the *cut*: the bucket boundary at or before the oldest of the tables' newest rows.
Every row of a bucket before the cut has been read, and none after it is in the slice, so a
bucket never straddles two slices. Memory holds one slice plus a row group of each table,
whatever the size of the dataset.

Only the columns a feature set reads are read; string columns come as dictionaries (pandas
categoricals), so a node id is decoded once per row group, not once per row. ``keep`` selects
the nodes of one pass (:mod:`foreshock.features.batch` reads a large dataset in several).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from foreshock.features.buckets import Columns
from foreshock.features.frames import KINDS, Codes, needed_columns, to_columns
from foreshock.features.spec import FeatureSet
from foreshock.ingest.dataset import part_paths, read_manifest, row_groups

__all__ = ["SLICE_ROWS", "time_slices", "dataset_extent", "gpu_rows"]

SLICE_ROWS: Final = 1 << 18
"""Rows (all tables together) gathered before a slice is handed out: tens of MB."""
_STRINGS: Final = ("node", "port", "state", "kind")


class _TableReader:
    """One telemetry table's row groups in time order, and the rows read but not yet handed out
    (as :func:`~foreshock.features.frames.to_columns` numeric columns)."""

    def __init__(
        self,
        data_dir: Path,
        kind: str,
        fs: FeatureSet,
        nodes: Codes,
        ports: Codes,
        keep: Callable[[str], bool] | None,
    ):
        self.kind = kind
        self._fs, self._nodes, self._ports, self._keep = fs, nodes, ports, keep
        self._groups = row_groups(data_dir, kind, needed_columns(kind, fs), _STRINGS)
        self._pending: list[Columns] = []
        self.pending_rows = 0
        self.newest = -np.inf  # the newest ts read: every older row of this table has been read
        self.done = False

    def advance(self) -> None:
        """Read the next row group (or learn that there is none)."""
        try:
            table = next(self._groups)
        except StopIteration:
            self.done = True
            return
        if not table.num_rows:
            return
        self.newest = max(self.newest, pc.max(table.column("ts")).as_py())
        frame = table.to_pandas()
        if self._keep is not None:
            node = frame["node"].astype("category").cat
            wanted = np.array([self._keep(str(n)) for n in node.categories] + [False])
            frame = frame[wanted[node.codes.to_numpy()]]
        if len(frame):
            self._pending.append(to_columns(self.kind, frame, self._fs, self._nodes, self._ports))
            self.pending_rows += len(frame)

    def take(self, cut: float) -> Columns | None:
        """The rows older than ``cut``; the rest stay pending."""
        if not self._pending:
            return None
        first = self._pending[0]
        cols = (
            first
            if len(self._pending) == 1
            else {k: np.concatenate([p[k] for p in self._pending]) for k in first}
        )
        older = cols["ts"] < cut
        if older.all():
            self._pending, self.pending_rows = [], 0
            return cols
        rest = {k: v[~older] for k, v in cols.items()}
        self._pending, self.pending_rows = [rest], len(rest["ts"])
        return {k: v[older] for k, v in cols.items()} if older.any() else None


def time_slices(
    data_dir: str | Path,
    fs: FeatureSet,
    nodes: Codes,
    ports: Codes,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[dict[str, Columns], float]]:
    """``(columns, cut)`` in time order: each kind's rows with ``ts < cut`` not handed out before,
    as :func:`~foreshock.features.frames.to_columns` gives them (node and port ids coded by
    ``nodes`` and ``ports``; kinds without such rows left out). The last slice has ``cut = inf``.

    ``keep(node)`` selects nodes."""
    read_manifest(data_dir)
    readers = [_TableReader(Path(data_dir), kind, fs, nodes, ports, keep) for kind in KINDS]
    handed = -np.inf
    while True:
        active = [r for r in readers if not r.done]
        oldest = min((r.newest for r in active), default=np.inf)
        cut = np.inf if not active else (oldest // fs.bucket_ms) * fs.bucket_ms
        pending = sum(r.pending_rows for r in readers)
        if not active or (cut > handed and pending >= SLICE_ROWS):
            columns = {r.kind: c for r in readers if (c := r.take(cut)) is not None}
            handed = cut
            if columns or not active:
                yield columns, cut
            if not active:
                return
        min(active, key=lambda r: r.newest).advance()


def dataset_extent(data_dir: str | Path) -> tuple[int, int] | None:
    """First and last ``ts`` of a dataset's telemetry, from the parts' row-group statistics
    (read from the column itself where a part has none); None for a dataset with no rows."""
    lo: list[int] = []
    hi: list[int] = []
    for kind in KINDS:
        for path in part_paths(data_dir, kind):
            meta = pq.ParquetFile(path).metadata
            if not meta.num_rows:
                continue
            col = meta.schema.to_arrow_schema().get_field_index("ts")
            stats = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
            if all(s is not None and s.has_min_max for s in stats):
                lo.append(min(int(s.min) for s in stats))
                hi.append(max(int(s.max) for s in stats))
            else:
                bounds = pc.min_max(pq.read_table(path, columns=["ts"]).column("ts")).as_py()
                lo.append(int(bounds["min"]))
                hi.append(int(bounds["max"]))
    return (min(lo), max(hi)) if lo else None


def gpu_rows(data_dir: str | Path) -> int:
    """GPU samples in a dataset (from the parts' metadata)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in part_paths(data_dir, "gpu"))
