"""Leakage checks: a feature row at ``t`` must not know anything stamped after ``t``.

:func:`point_in_time_violations` is the check that catches a feature reading the future: it
computes features twice, on the dataset truncated at a cutoff and on the full dataset, and
compares every row at or before the cutoff. A causal feature gives the same value both times; a
feature that looks ahead (a forward shift, a centred window, a statistic over the whole series)
differs, and is named. The labels have their own guard in :mod:`foreshock.models.labels` (a row never sees
the failure it is labelled with); the shuffled-label test checks the pipeline end to end.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from foreshock.ingest.dataset import TABLES, part_paths, read_manifest

__all__ = ["LeakageError", "truncate_dataset", "point_in_time_violations", "assert_point_in_time"]


class LeakageError(AssertionError):
    """A feature's value at some row depends on data stamped after that row."""


def truncate_dataset(src: str | Path, dst: str | Path, cutoff_ms: int) -> Path:
    """Copy a dataset keeping only records stamped ``<= cutoff_ms`` (telemetry, events, ground
    truth); the manifest's ``end_ms`` becomes the cutoff."""
    src, dst = Path(src), Path(dst)
    manifest = read_manifest(src)
    for table in TABLES:
        (dst / table).mkdir(parents=True, exist_ok=True)
        for path in part_paths(src, table):
            part = pq.read_table(path, filters=[("ts", "<=", cutoff_ms)])
            if part.num_rows:
                pq.write_table(part, dst / table / path.name)
    for name in ("events.parquet", "ground_truth.parquet"):
        if (src / name).exists():
            pq.write_table(pq.read_table(src / name, filters=[("ts", "<=", cutoff_ms)]), dst / name)
    (dst / "manifest.json").write_text(json.dumps({**manifest, "end_ms": min(cutoff_ms, manifest["end_ms"])}))
    return dst


def point_in_time_violations(
    compute: Callable[[Path], pd.DataFrame],
    data_dir: str | Path,
    work_dir: str | Path,
    cutoff_ms: int,
    rtol: float = 1e-9,
    atol: float = 1e-9,
) -> dict[str, int]:
    """Feature columns whose values at rows ``ts <= cutoff_ms`` change when the data after the
    cutoff exists, with the number of rows that differ. ``compute(dir)`` returns a frame of
    node, ts and feature columns. Empty means no leak seen at this cutoff."""
    truncated = truncate_dataset(data_dir, Path(work_dir) / "truncated", cutoff_ms)
    past = compute(truncated)
    full = compute(Path(data_dir))
    full = full[full["ts"] <= cutoff_ms]
    merged = past.merge(full, on=["node", "ts"], how="inner", suffixes=("_past", "_full"))
    if len(merged) == 0:
        raise ValueError("no rows at or before the cutoff to compare")
    names = [c for c in past.columns if c not in ("node", "ts")]
    out: dict[str, int] = {}
    for name in names:
        a = merged[f"{name}_past"].to_numpy(dtype=np.float64, na_value=np.nan)
        b = merged[f"{name}_full"].to_numpy(dtype=np.float64, na_value=np.nan)
        same = np.isclose(a, b, rtol=rtol, atol=atol) | (np.isnan(a) & np.isnan(b))
        if not same.all():
            out[name] = int((~same).sum())
    missing = len(full) - len(merged)
    if missing:
        out["<rows missing when truncated>"] = int(missing)
    return out


def assert_point_in_time(
    compute: Callable[[Path], pd.DataFrame], data_dir: str | Path, work_dir: str | Path, cutoffs: list[int]
) -> None:
    """Raise :class:`LeakageError` naming every feature that reads past any of ``cutoffs``."""
    for i, cutoff in enumerate(cutoffs):
        bad = point_in_time_violations(compute, data_dir, Path(work_dir) / f"cut{i}", cutoff)
        if bad:
            raise LeakageError(f"features read data after the row's time (cutoff {cutoff}): {bad}")
