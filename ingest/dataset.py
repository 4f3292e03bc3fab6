"""The on-disk dataset: what the simulator writes and what features, models and notebooks read.

A dataset folder holds ``manifest.json``, one parquet part per time chunk for each telemetry
table (``gpu/``, ``xid/``, ``link/``, named ``part-NNNNN.parquet``), ``events.parquet`` (node
lifecycle) and ``ground_truth.parquet`` (one row per injected failure). Rows of a part are
sorted by ``(ts, node, ...)`` and parts follow each other in time, so reading the parts in name
order gives one time-ordered table. Timestamps are int64 epoch milliseconds, UTC.

Readers return pandas DataFrames with plain string columns (never categoricals), whatever
encoding the writer chose on disk, so downstream code sees one set of dtypes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from foreshock.ingest.contract import GPU_FIELDS, LINK_COUNTERS

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "MANIFEST_KEYS",
    "DatasetError",
    "DatasetWriter",
    "read_manifest",
    "read_table",
    "read_events",
    "read_ground_truth",
    "part_paths",
    "row_groups",
    "EVENT_SCHEMA",
    "GROUND_TRUTH_SCHEMA",
    "XID_SCHEMA",
]

SCHEMA_VERSION: Final = 1
TABLES: Final = ("gpu", "xid", "link")
MANIFEST_KEYS: Final = (
    "schema_version",
    "profile",
    "nodes",
    "gpus_per_node",
    "start_ms",
    "end_ms",
    "interval_ms",
    "seed",
)

XID_SCHEMA: Final = pa.schema(
    [
        ("node", pa.string()),
        ("ts", pa.int64()),
        ("gpu", pa.int64()),
        ("xid", pa.int64()),
        ("count", pa.int64()),
        ("message", pa.string()),
        ("pci_bus_id", pa.string()),
    ]
)
EVENT_SCHEMA: Final = pa.schema(
    [
        ("node", pa.string()),
        ("ts", pa.int64()),
        ("event", pa.string()),
        ("cause", pa.string()),
        ("detectable", pa.bool_()),
        ("detail", pa.string()),
    ]
)
GROUND_TRUTH_SCHEMA: Final = pa.schema(
    [
        ("node", pa.string()),
        ("ts", pa.int64()),
        ("cause", pa.string()),
        ("detectable", pa.bool_()),
        ("precursor", pa.string()),
        ("precursor_start_ms", pa.int64()),
        ("precursor_strength", pa.float64()),
        ("repair_ts", pa.int64()),
    ]
)
_LEADING: Final[dict[str, tuple[str, ...]]] = {
    "gpu": ("node", "ts", "gpu"),
    "xid": tuple(XID_SCHEMA.names),
    "link": ("node", "ts", "port", "kind", "state"),
}


class DatasetError(ValueError):
    """A folder that is not a readable dataset, or a write that would break the layout."""


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest as a dict; raises :class:`DatasetError` if it is missing a required key."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise DatasetError(f"{directory} is not a dataset: no manifest.json")
    manifest = json.loads(path.read_text())
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise DatasetError(f"{path}: manifest lacks {', '.join(missing)}")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise DatasetError(f"{path}: schema_version {manifest['schema_version']} is not {SCHEMA_VERSION}")
    return manifest


def part_paths(directory: str | Path, table: str) -> list[Path]:
    """The parts of ``table`` in time order (their names sort in time order)."""
    if table not in TABLES:
        raise DatasetError(f"unknown table {table!r}; expected one of {', '.join(TABLES)}")
    return sorted((Path(directory) / table).glob("part-*.parquet"))


def row_groups(
    directory: str | Path,
    table: str,
    columns: Sequence[str],
    dictionary: Sequence[str] = (),
    any_of: Sequence[str] = (),
) -> Iterator[pa.Table]:
    """``table``'s row groups in time order (its parts follow each other in time and a part's rows
    are sorted by time), each with those of ``columns`` its part holds: a reader holds one row
    group, not a part of a million rows. ``dictionary`` columns come as dictionaries (a string
    decoded once per row group, not once per row). With ``any_of``, a part holding none of those
    columns is skipped unread."""
    for path in part_paths(directory, table):
        names = set(pq.read_schema(path).names)
        if any_of and names.isdisjoint(any_of):
            continue
        file = pq.ParquetFile(path, read_dictionary=[c for c in dictionary if c in names])
        held = [c for c in columns if c in names]
        for i in range(file.num_row_groups):
            yield file.read_row_group(i, columns=held)


def _empty_schema(table: str) -> pa.Schema:
    if table == "xid":
        return XID_SCHEMA
    if table == "gpu":
        return pa.schema(
            [("node", pa.string()), ("ts", pa.int64()), ("gpu", pa.int64())]
            + [(f, pa.float64()) for f in GPU_FIELDS]
        )
    return pa.schema(
        [(c, pa.string()) if c != "ts" else (c, pa.int64()) for c in _LEADING["link"]]
        + [(f, pa.int64()) for f in LINK_COUNTERS]
    )


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Dictionary-encoded columns become plain strings so every reader sees the same dtypes."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    return table.to_pandas()


def read_table(
    directory: str | Path,
    table: str,
    columns: Sequence[str] | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> pd.DataFrame:
    """One telemetry table (``"gpu"``, ``"xid"`` or ``"link"``) as a time-ordered DataFrame.

    ``columns`` limits what is read (cheaper on wide GPU tables); ``start_ms``/``end_ms``
    (half-open) keep only rows in that time range, skipping whole parts outside it.
    """
    read_manifest(directory)
    paths = part_paths(directory, table)
    filters = []
    if start_ms is not None:
        filters.append(("ts", ">=", start_ms))
    if end_ms is not None:
        filters.append(("ts", "<", end_ms))
    cols = list(columns) if columns is not None else None
    if cols is not None and filters and "ts" not in cols:
        cols_read = [*cols, "ts"]
    else:
        cols_read = cols
    tables = [pq.read_table(p, columns=cols_read, filters=filters or None) for p in paths]
    tables = [t for t in tables if t.num_rows] or tables[:1]
    if not tables:
        schema = _empty_schema(table)
        names = cols if cols is not None else schema.names
        return _to_pandas(schema.empty_table().select(names))
    out = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    if cols is not None:
        out = out.select(cols)
    return _to_pandas(out)


def _read_single(directory: str | Path, name: str, schema: pa.Schema) -> pd.DataFrame:
    read_manifest(directory)
    path = Path(directory) / name
    table = pq.read_table(path) if path.is_file() else schema.empty_table()
    return _to_pandas(table)


def read_events(directory: str | Path) -> pd.DataFrame:
    """Node lifecycle events (``failed``, ``repaired``, ...), sorted by time."""
    return _read_single(directory, "events.parquet", EVENT_SCHEMA)


def read_ground_truth(directory: str | Path) -> pd.DataFrame:
    """One row per injected failure: node, ts, cause, detectable, precursor, precursor_start_ms,
    precursor_strength, repair_ts.

    ``precursor_start_ms`` is a nullable ``Int64`` column: null when the failure gave no warning.
    ``precursor_strength`` is the foreshock's intensity at the failure (null without one; the
    simulator's harmless transients peak at no more than its profile's ``false_alarm_strength``);
    datasets simulated before it was recorded lack the column.
    """
    frame = _read_single(directory, "ground_truth.parquet", GROUND_TRUTH_SCHEMA)
    frame["precursor_start_ms"] = frame["precursor_start_ms"].astype("Int64")
    return frame


class DatasetWriter:
    """Writes one dataset folder chunk by chunk, so memory holds one time chunk at a time.

    Call :meth:`write_part` for each time chunk in time order: a chunk goes into the current
    part of its table as a row group; :meth:`end_part` closes the current parts of every table
    so the next chunks start new ones (part N of each table covers the same time). Then
    :meth:`write_events` and :meth:`write_ground_truth`, and :meth:`write_manifest` last: a
    folder with a manifest is complete. Refuses a folder that already holds a dataset unless
    ``overwrite``. Output bytes depend only on the tables given (deterministic).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        overwrite: bool = False,
        compression: str = "zstd",
    ):
        self.directory = Path(directory)
        self.compression = compression
        if (self.directory / "manifest.json").exists():
            if not overwrite:
                raise DatasetError(f"{self.directory} already holds a dataset (use overwrite)")
            (self.directory / "manifest.json").unlink()
        for table in TABLES:
            for old in part_paths(self.directory, table):
                old.unlink()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._parts = dict.fromkeys(TABLES, 0)
        self._open: dict[str, pq.ParquetWriter] = {}

    def write_part(self, table: str, data: pa.Table) -> Path:
        """Append the next time chunk of ``table``; its leading columns must follow the layout.

        Returns the path of the part it went into.
        """
        if table not in TABLES:
            raise DatasetError(f"unknown table {table!r}; expected one of {', '.join(TABLES)}")
        lead = _LEADING[table]
        if tuple(data.column_names[: len(lead)]) != lead:
            got = tuple(data.column_names[: len(lead)])
            raise DatasetError(f"{table} part must start with columns {lead}, got {got}")
        writer = self._open.get(table)
        if writer is not None and not writer.schema.equals(data.schema):
            raise DatasetError(
                f"{table} chunk schema differs from its part's: {data.schema} vs {writer.schema}"
            )
        if writer is None:
            folder = self.directory / table
            folder.mkdir(exist_ok=True)
            path = folder / f"part-{self._parts[table]:05d}.parquet"
            writer = self._open[table] = pq.ParquetWriter(path, data.schema, compression=self.compression)
            self._parts[table] += 1
        writer.write_table(data)
        return Path(writer.where)

    def end_part(self) -> None:
        """Finish the current parts; the next :meth:`write_part` of each table starts a new one."""
        for table in list(self._open):
            self._open.pop(table).close()

    def write_events(self, data: pa.Table) -> Path:
        """Node lifecycle events (``EVENT_SCHEMA``)."""
        return self._write_single("events.parquet", data, EVENT_SCHEMA)

    def write_ground_truth(self, data: pa.Table) -> Path:
        """The injected failures (``GROUND_TRUTH_SCHEMA``)."""
        return self._write_single("ground_truth.parquet", data, GROUND_TRUTH_SCHEMA)

    def _write_single(self, name: str, data: pa.Table, schema: pa.Schema) -> Path:
        path = self.directory / name
        pq.write_table(data.select(schema.names).cast(schema), path, compression=self.compression)
        return path

    def write_manifest(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest last; it must carry every key of ``MANIFEST_KEYS``."""
        self.end_part()
        missing = [k for k in MANIFEST_KEYS if k not in manifest and k != "schema_version"]
        if missing:
            raise DatasetError(f"manifest lacks {', '.join(missing)}")
        path = self.directory / "manifest.json"
        body = {"schema_version": SCHEMA_VERSION, **manifest}
        path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        return path
