"""The feature table on disk: parquet partitions by node group and day, and what they were made from.

``foreshock features`` writes it once; ``train`` and ``evaluate`` read it instead of computing the
features again. A table is a folder::

    table.json                                identity, columns, and every partition (written last)
    group=3/day=2026-01-01/part.parquet       node, ts, then the features (float32), sorted by (ts, node)

A *group* is a peer group of nodes (:attr:`~foreshock.features.spec.FeatureSet.peer_partitions`):
each partition holds every row of its nodes at its day's ticks, peer features included, so a
process (or a Dask worker) writes its partitions without seeing anyone else's rows. Features
are stored as float32: the model bins them anyway (see :func:`foreshock.models.frame.build_labelled`),
and the table is half the size of the engines' float64.

The table records its *identity*: the feature set's hash, the cadence and the fingerprint of the
dataset it was computed from. A reader states the identity it expects and a different one is an
error (:class:`FeatureTableError`), never a silent recompute. A folder without ``table.json`` is
an unfinished write (a crash part way): it is refused, and a new write replaces it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "DAY_MS",
    "FORMAT_VERSION",
    "FeatureTableError",
    "TableIdentity",
    "Partition",
    "FeatureTable",
    "TableWriter",
    "gather_rows",
    "release_freed_memory",
]

DAY_MS: Final = 86_400_000
FORMAT_VERSION: Final = 1
_META: Final = "table.json"
_ATTACHED: Final = "attached="


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand the pages of freed buffers back to the system: Arrow's memory pool's and, with glibc,
    the C heap's (``malloc_trim``).

    Both keep what was freed resident. Arrow's pool (mimalloc) keeps the pages of a table read
    after it is dropped, as much as the largest read; glibc keeps arrays under 32 MiB on its heap
    once a larger one has been freed, and a freed block there stays resident while anything
    above it lives. A frame joined from many pieces frees them a column at a time, scattered
    over the heap: without this the process would hold the freed pieces and the joined columns
    at once."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


class FeatureTableError(ValueError):
    """A folder that is not a complete feature table, or one made from something else."""


@dataclass(frozen=True)
class TableIdentity:
    """What a table was computed from: a table answers for these three, and nothing else."""

    feature_set_hash: str
    cadence_ms: int
    dataset_fingerprint: str

    def mismatches(self, other: TableIdentity) -> list[str]:
        """Human-readable differences from ``other`` (the identity a reader expects)."""
        return [
            f"{k} is {getattr(self, k)!r}, expected {getattr(other, k)!r}"
            for k in ("feature_set_hash", "cadence_ms", "dataset_fingerprint")
            if getattr(self, k) != getattr(other, k)
        ]


@dataclass(frozen=True)
class Partition:
    """One parquet file of the table: a group of nodes over one UTC day."""

    group: int
    day: int  # days since the epoch (UTC)
    rows: int
    path: str  # relative to the table folder

    @property
    def start_ms(self) -> int:
        return self.day * DAY_MS


def partition_path(group: int, day: int) -> str:
    """Where partition (``group``, ``day``) lives inside a table folder."""
    date = datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m-%d")
    return f"group={group}/day={date}/part.parquet"


class TableWriter:
    """Writes partitions into a table folder; :meth:`finish` writes ``table.json`` last.

    Partition files are written under a temporary name and renamed, so a crash leaves no torn
    file; without ``table.json`` the folder is not a table. Any process may write partitions
    (each Dask worker writes its own); one process calls :meth:`finish` with all of them.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def prepare(self, overwrite: bool = False) -> None:
        """Make an empty folder: refuses a complete table unless ``overwrite``; clears a torn one."""
        if (self.path / _META).exists() and not overwrite:
            raise FeatureTableError(f"{self.path} already holds a feature table (overwrite it explicitly)")
        if self.path.exists():
            ours = (_META, "group=", _ATTACHED, ".")  # metadata, partitions, attachments, files being written
            if any(not p.name.startswith(ours) for p in self.path.iterdir()):
                raise FeatureTableError(f"{self.path} holds files that are not a feature table's: left alone")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)

    def write(self, group: int, day: int, table: pd.DataFrame, names: Sequence[str]) -> Partition:
        """Write one partition: ``node``, ``ts``, then ``names`` as float32."""
        rel = partition_path(group, day)
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        columns = {
            "node": pa.array(table["node"].astype(str).to_numpy(), pa.string()),
            "ts": pa.array(table["ts"].to_numpy(dtype=np.int64), pa.int64()),
            **{n: pa.array(table[n].to_numpy(dtype=np.float32), pa.float32()) for n in names},
        }
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        # float columns are not dictionary-encoded: they hardly repeat, and trying costs time
        pq.write_table(pa.table(columns), tmp, compression="zstd", use_dictionary=["node"])
        os.replace(tmp, target)
        return Partition(group, day, len(table), rel)

    def finish(
        self, identity: TableIdentity, names: Sequence[str], partitions: Sequence[Partition], **extra: Any
    ) -> FeatureTable:
        """Record the identity and the partitions: the table is complete from here on."""
        meta = {
            "format_version": FORMAT_VERSION,
            "identity": asdict(identity),
            "feature_names": list(names),
            "partitions": [asdict(p) for p in sorted(partitions, key=lambda p: (p.day, p.group))],
            **extra,
        }
        tmp = self.path / f".{_META}.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path / _META)
        return FeatureTable.open(self.path)


@dataclass(frozen=True)
class FeatureTable:
    """A complete feature table (open it with :meth:`open`)."""

    path: Path
    identity: TableIdentity
    feature_names: list[str]
    partitions: list[Partition]
    meta: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, expect: TableIdentity | None = None) -> FeatureTable:
        """The table at ``path``; with ``expect``, an error unless the table has that identity."""
        path = Path(path)
        meta_path = path / _META
        if not meta_path.is_file():
            raise FeatureTableError(
                f"{path} is not a complete feature table: no {_META} (write one with `foreshock features`)"
            )
        meta = json.loads(meta_path.read_text())
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise FeatureTableError(f"{meta_path}: format_version {version} is not {FORMAT_VERSION}")
        table = cls(
            path,
            TableIdentity(**meta["identity"]),
            list(meta["feature_names"]),
            [Partition(**p) for p in meta["partitions"]],
            meta,
        )
        if expect is not None:
            table.check(expect)
        return table

    def check(self, expect: TableIdentity) -> None:
        """An error naming every difference between this table's identity and ``expect``."""
        wrong = self.identity.mismatches(expect)
        if wrong:
            raise FeatureTableError(f"feature table {self.path} does not match: " + "; ".join(wrong))

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    def attach(self, name: str, frame: pd.DataFrame) -> None:
        """Keep ``frame`` with the table under ``name``: what else the table's readers read of
        the same dataset, computed once beside it (the rules' evidence). Written under a
        temporary name and renamed, so a crash leaves no torn file."""
        target = self.path / f"{_ATTACHED}{name}.parquet"
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, target)

    def attached(self, name: str) -> pd.DataFrame | None:
        """What :meth:`attach` kept under ``name``, or None."""
        path = self.path / f"{_ATTACHED}{name}.parquet"
        return pd.read_parquet(path) if path.is_file() else None

    @property
    def days(self) -> list[int]:
        return sorted({p.day for p in self.partitions})

    def read(self, partition: Partition, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One partition (``node`` as str, ``ts`` int64, features float32). What Arrow held to
        read it is handed back (:func:`release_freed_memory`)."""
        frame = _read_partition(self.path / partition.path, columns).to_pandas()
        release_freed_memory()
        return frame

    def read_slices(self, partition: Partition, rows: int) -> Iterator[pd.DataFrame]:
        """One partition (as :meth:`read`), ``rows`` rows at a time: a reader that scores rows one
        by one holds a slice, not a node group's day (a 2,048-node fleet's is 440 k rows, its
        features 180 MB, which Arrow and pandas each hold once more while reading it whole)."""
        with pq.ParquetFile(self.path / partition.path) as file:
            for batch in file.iter_batches(batch_size=rows):
                yield batch.to_pandas()
                del batch
                release_freed_memory()

    def read_day(self, day: int, columns: Sequence[str] | None = None, places: bool = False) -> pd.DataFrame:
        """Every group's rows of one day, sorted by (ts, node): the engines' row order. With
        ``places``, each row's place among the day's partitions read one after another (``_place``,
        int32): what :meth:`day_row_blocks` reads rows by."""
        parts = [self.read(p, columns) for p in self.partitions if p.day == day]
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["node", "ts"])
        if places:
            frame["_place"] = np.arange(len(frame), dtype=np.int32)
        return frame.sort_values(["ts", "node"], kind="stable", ignore_index=True)

    def fill_day_rows(
        self, day: int, at: np.ndarray, columns: Sequence[str], out: np.ndarray, rows: np.ndarray
    ) -> None:
        """Write the rows at places ``at`` of ``day`` (:meth:`day_row_blocks`), only ``columns``,
        into ``out``: the k-th into ``out[rows[k]]``, one column of ``out`` per column."""
        for mine, values in self.day_row_blocks(day, at, columns):
            out[rows[mine]] = values

    def day_row_blocks(
        self, day: int, at: np.ndarray, columns: Sequence[str]
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The rows at places ``at`` of ``day``, only ``columns``, a partition at a time: ``(which
        of at, their values)``, float32, one column per column. A row's place is among the day's
        partitions read one after another (:meth:`read_day`'s ``_place``), so no read of the day
        sorts it again: each partition's columns are read by themselves and only the rows asked
        for are taken, and memory holds one node group's day, not the fleet's (2,048 nodes' day
        of features is over a gigabyte). What Arrow held of each is handed back
        (:func:`release_freed_memory`)."""
        parts = [p for p in self.partitions if p.day == day]
        bounds = np.cumsum([0, *(p.rows for p in parts)])
        src = np.asarray(at, dtype=np.int64)
        part_of = np.searchsorted(bounds, src, side="right") - 1
        for i, partition in enumerate(parts):
            mine = np.flatnonzero(part_of == i)
            if not mine.size:
                continue
            table = _read_partition(self.path / partition.path, columns)
            values = gather_rows([table.column(name).to_numpy() for name in columns], src[mine] - bounds[i])
            del table
            release_freed_memory()
            yield mine, values

    def iter_days(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        """:meth:`read_day` of each day in time order: the whole table, one day in memory at a time."""
        for day in self.days:
            yield self.read_day(day, columns)

    def read_all(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The whole table, sorted by (ts, node)."""
        days = list(self.iter_days(columns))
        if not days:
            return pd.DataFrame(columns=["node", "ts", *self.feature_names])
        return pd.concat(days, ignore_index=True)


def _read_partition(path: Path, columns: Sequence[str] | None) -> pa.Table:
    """One partition file, ``columns`` only (every column when None), a chunk per row group.
    ``pq.read_table`` goes through the dataset reader, whose 128 Ki-row batches leave a
    partition's columns in pieces that every ``to_numpy`` joins again: reading a 2,048-node day's
    features through it took 1.4 times as long, 1.8 times for a tenth of its rows."""
    with pq.ParquetFile(path) as file:
        return file.read(columns=list(columns) if columns else None)


def gather_rows(columns: Sequence[np.ndarray], at: np.ndarray) -> np.ndarray:
    """Rows ``at`` of ``columns``, float32, one row per row and a column per column: each column
    gathered into a row of its own (contiguous writes), then the whole turned once. Arrow's
    ``take`` of a partition, or a column at a time into the matrix's strided columns, cost about
    twice as much."""
    gathered = np.empty((len(columns), len(at)), dtype=np.float32)
    for j, column in enumerate(columns):
        np.take(np.asarray(column, dtype=np.float32), at, out=gathered[j])
    return np.ascontiguousarray(gathered.T)
