"""Titan (Ostrouchov et al., SC20) beside its own published tables: what the notebook checks.

The study released, with the paper, its per-GPU analysis table (``gc_summary_loc.csv``) and the
list of Titan's service nodes (``titan.service.txt``). :func:`location_counts` sets the figures
Foreshock derives from the raw GPU lives (``load_titan`` then ``unit_lifetimes``) beside them, per
level of the cabinet: node positions against the machine's layout less its service nodes, GPUs
and failed GPUs against the study's table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pandas as pd

from foreshock.models.fleet.records import validate
from foreshock.models.fleet.sources import CRAY_LEVELS, cray_location, oak_ridge_time

__all__ = ["read_study_summary", "read_service_nodes", "location_counts", "deaths", "POSITIONS_PER"]

POSITIONS_PER: Final = {"cage": 3, "slot": 8, "node": 4}
"""Levels inside one cabinet: 3 cages x 8 slots (blades) x 4 nodes."""


def read_study_summary(path: str | Path) -> pd.DataFrame:
    """The study's per-GPU table in the shape of ``unit_lifetimes``: ``unit, duration_days,
    failed, last_end, batch`` and the levels of its location (that of the GPU's longest life)."""
    raw = pd.read_csv(path, dtype={"SN": str})
    out = raw[["SN", "days", "dead", "batch", *CRAY_LEVELS]].rename(
        columns={"SN": "unit", "days": "duration_days", "dead": "failed"})
    out["failed"] = out["failed"].astype(bool)
    out.insert(3, "last_end", oak_ridge_time(raw["last"]))
    return out


def deaths(lifetimes: pd.DataFrame) -> pd.DataFrame:
    """Fleet records with one row per GPU, ending at its last removal: a failure if it died.

    The GPU's service time is laid back from its last removal as if unbroken (the study's table
    keeps no install time), so per-period failure counts are exact and unit-hours approximate.
    """
    return validate(pd.DataFrame({
        "unit": lifetimes["unit"],
        "install_time": lifetimes["last_end"] - pd.to_timedelta(lifetimes["duration_days"], unit="D"),
        "end_time": lifetimes["last_end"], "kind": "died", "censored": ~lifetimes["failed"],
    }), where="GPU deaths")


def read_service_nodes(path: str | Path) -> pd.DataFrame:
    """Titan's service nodes (no GPU): ``cname`` and its levels."""
    raw = pd.read_csv(path, sep=r"\s+", header=None, names=["nid", "hex", "cname", "type", "state", "mode"])
    return pd.concat([raw[["cname"]], cray_location(raw["cname"])], axis=1)


def location_counts(lifetimes: pd.DataFrame, study: pd.DataFrame, service: pd.DataFrame,
                    records: pd.DataFrame) -> pd.DataFrame:
    """Per level of ``cage``, ``slot`` and ``node``: ``positions`` (node positions a GPU ever sat
    in, from ``records``) beside ``positions_layout`` (cabinets x positions per level less the
    service nodes there); ``gpus`` and ``failed`` (Foreshock's, by each GPU's longest life)
    beside ``study_gpus`` and ``study_failed`` (the study's table)."""
    cabinets = len(pd.concat([records[["col", "row"]], service[["col", "row"]]]).drop_duplicates())
    per_cabinet = POSITIONS_PER["cage"] * POSITIONS_PER["slot"] * POSITIONS_PER["node"]
    positions = records[list(CRAY_LEVELS)].drop_duplicates()
    rows = []
    for level, count in POSITIONS_PER.items():
        layout = cabinets * per_cabinet // count
        for value in range(count):
            rows.append({
                "level": level, "value": value,
                "positions": int((positions[level] == value).sum()),
                "positions_layout": layout - int((service[level] == value).sum()),
                "gpus": int((lifetimes[level] == value).sum()),
                "study_gpus": int((study[level] == value).sum()),
                "failed": int(lifetimes.loc[lifetimes[level] == value, "failed"].sum()),
                "study_failed": int(study.loc[study[level] == value, "failed"].sum()),
            })
    return pd.DataFrame(rows)
