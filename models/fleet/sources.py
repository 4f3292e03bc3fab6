"""Readers from published fleet data into fleet records (:mod:`foreshock.models.fleet.records`).

:func:`load_titan` reads the Titan supercomputer's GPU lives (``datasets/traces/titan``, the data
of Ostrouchov et al., SC20); :func:`load_infinitehbd` the InfiniteHBD fault trace of 400 training
servers (``datasets/traces/infinitehbd``). Both come back validated, in the one shape every
analysis takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from foreshock.ingest.simulator.calibration import INFINITEHBD_DAYS, INFINITEHBD_SERVERS, cause_of
from foreshock.models.fleet.records import validate

__all__ = ["CRAY_LEVELS", "cray_location", "oak_ridge_time", "load_titan", "load_infinitehbd",
           "from_ground_truth", "TRACE_ORIGIN"]

CRAY_LEVELS: Final = ("col", "row", "cage", "slot", "node")
"""A Cray cname's levels: cabinet column and row, cage in the cabinet (0 = bottom), slot (blade), node."""
_CNAME: Final = r"^c(\d+)-(\d+)c(\d+)s(\d+)n(\d+)$"
_TITAN_ZONE: Final = "America/New_York"
_TITAN_REBUILD: Final = pd.Timestamp("2016-01-01", tz=_TITAN_ZONE)
TRACE_ORIGIN: Final = pd.Timestamp(0, unit="s", tz="UTC")
"""Day 0 of a trace that gives relative times only (InfiniteHBD): records start at the Unix epoch."""


def cray_location(cnames: pd.Series) -> pd.DataFrame:
    """``c13-3c1s0n0`` -> col 13, row 3, cage 1, slot 0, node 0 (integers); ValueError naming a bad one."""
    parts = cnames.astype(str).str.extract(_CNAME)
    bad = parts[0].isna()
    if bad.any():
        raise ValueError(f"not a Cray cname (c<col>-<row>c<cage>s<slot>n<node>): {cnames[bad].iloc[0]!r}")
    parts.columns = list(CRAY_LEVELS)
    return parts.astype(int)


def load_titan(path: str | Path) -> pd.DataFrame:
    """Titan's GPU lives (``gc_full.csv[.gz]``) as fleet records, one per GPU life at a location.

    A life's ``kind`` is the event that ended it (``DBE``: double-bit ECC error; ``OTB``: off the
    bus): the row's own event, else the last further event the file lists for that GPU at that
    location during the life. Two serial numbers are listed at a second location during a life
    elsewhere (a recording error: a GPU is in one place at a time); the nested lives are dropped,
    where the study's summary counts them. A life without one is censored (the GPU was moved, pulled in a
    rework, or still in service at the end). GPUs are replaced, not repaired, so
    ``repaired_time`` is empty. Extra columns: ``batch`` (``old``: the GPUs Titan was built with,
    first installed before 2016; ``new``: those of the 2016-2017 rework) and the cname's levels
    :data:`CRAY_LEVELS`.

    Times in the file are Oak Ridge's local time (its durations count the daylight-saving hour):
    they are read in US Eastern time and kept in UTC, and a life ends ``duration`` after it began
    (which settles the hour a clock change makes ambiguous).
    """
    raw = pd.read_csv(path, dtype={"SN": str, "location": str, "event": str})
    raw["insert"] = oak_ridge_time(raw["insert"])
    raw["remove"] = oak_ridge_time(raw["remove"])
    lives = _one_place_at_a_time(raw[raw["insert"].notna()])
    more = raw[raw["insert"].isna() & raw["event"].notna()]
    attached = more.merge(lives[["SN", "location", "insert", "remove"]].reset_index(),
                          on=["SN", "location"], suffixes=("_event", ""))
    attached = attached[attached["remove_event"].between(attached["insert"], attached["remove"])]
    last_event = attached.sort_values("remove_event").groupby("index")["event"].last()
    kind = lives["event"].fillna(last_event.reindex(lives.index))
    first_install = lives.groupby("SN")["insert"].transform("min")
    records = pd.DataFrame({
        "unit": lives["SN"],
        "location": lives["location"],
        "install_time": lives["insert"],
        "end_time": lives["insert"] + pd.to_timedelta(lives["duration"], unit="s"),
        "kind": kind,
        "censored": kind.isna(),
        "repaired_time": pd.NaT,
        "batch": np.where(first_install < _TITAN_REBUILD, "old", "new"),
    })
    records = validate(records, where=str(path))
    return pd.concat([records, cray_location(records["location"])], axis=1)


def oak_ridge_time(local: pd.Series) -> pd.Series:
    """Oak Ridge wall-clock times -> UTC (an ambiguous fall-back hour is read as daylight time)."""
    return pd.to_datetime(local).dt.tz_localize(_TITAN_ZONE, ambiguous=True, nonexistent="shift_forward") \
        .dt.tz_convert("UTC")


def _one_place_at_a_time(lives: pd.DataFrame) -> pd.DataFrame:
    """The lives without those that start before an earlier life of the same GPU has ended."""
    lives = lives.sort_values(["SN", "insert"], kind="stable")
    earlier_end = lives.groupby("SN")["remove"].cummax().groupby(lives["SN"]).shift()
    return lives[~(lives["insert"] < earlier_end)].reset_index(drop=True)


def load_infinitehbd(
    path: str | Path,
    servers: int = INFINITEHBD_SERVERS,
    days: float = INFINITEHBD_DAYS,
    origin: pd.Timestamp = TRACE_ORIGIN,
) -> pd.DataFrame:
    """The InfiniteHBD ``fault_trace.json`` as fleet records: each server's up spells.

    A server is up from the start of the trace (or its return from repair) until its next
    ``fault_start``; ``kind`` is the fault's description, ``repaired_time`` its ``fault_end``
    (paired with the next end of the same server and fault type, as the goodput loader pairs
    them). A fault that starts while the server is already down joins that repair (the server
    returns when both are closed). The last spell runs, censored, to the end of the trace. The
    trace lists only the servers that faulted, so the other ``servers`` minus those appear as
    ``quiet-NNN`` units up for the whole trace. Times are ``origin`` plus the trace's days.
    Extra columns: ``level``, ``fault_class`` and ``cause`` (the simulator profile's cause).
    """
    events = json.loads(Path(path).read_text())
    events.sort(key=lambda e: (e["event_time"], e["event_type"] != "fault_start"))
    pending: dict[tuple[str, str, str, str], list[float]] = {}
    faults: list[tuple[str, float, float, str, str, str]] = []
    for e in events:
        ft = e["fault_type"]
        key = (e["node_id"], ft["Level"], ft["Class"], ft["Desc"])
        if e["event_type"] == "fault_start":
            pending.setdefault(key, []).append(float(e["event_time"]))
        else:
            faults.append((e["node_id"], pending[key].pop(0), float(e["event_time"]),
                           ft["Desc"], ft["Level"], ft["Class"]))
    rows = []
    for node, group in _by_node(faults).items():
        up_since = 0.0
        for start, end, desc, level, fclass in group:
            rows.append((node, up_since, start, desc, False, end, level, fclass))
            up_since = end
        if up_since < days:
            rows.append((node, up_since, days, None, True, None, None, None))
    quiet = servers - len({r[0] for r in rows})
    rows += [(f"quiet-{i:03d}", 0.0, days, None, True, None, None, None) for i in range(max(quiet, 0))]
    frame = pd.DataFrame(rows, columns=["unit", "install", "end", "kind", "censored", "repaired",
                                        "level", "fault_class"])

    def at(day: pd.Series) -> pd.Series:  # the trace's days as whole microseconds, gaps kept
        micros = pd.Series((day * 86_400e6).round(), dtype="Float64").astype("Int64")
        return origin + pd.to_timedelta(micros, unit="us")

    records = pd.DataFrame({
        "unit": frame["unit"], "location": None,
        "install_time": at(frame["install"]), "end_time": at(frame["end"]),
        "kind": frame["kind"], "censored": frame["censored"], "repaired_time": at(frame["repaired"]),
        "level": frame["level"], "fault_class": frame["fault_class"],
        "cause": [cause_of(c, d) if c else None
                  for c, d in zip(frame["fault_class"], frame["kind"], strict=True)],
    })
    return validate(records, where=str(path))


def _by_node(faults: list[tuple[str, float, float, str, str, str]]) -> dict[str, list[list]]:
    """Each node's faults in time order, a fault that starts while the node is down merged into
    the one it is down for (which keeps its kind and ends when the later of the two does)."""
    out: dict[str, list[list]] = {}
    for node, start, end, desc, level, fclass in sorted(faults, key=lambda f: (f[0], f[1], f[2])):
        group = out.setdefault(node, [])
        if group and start < group[-1][1]:
            group[-1][1] = max(group[-1][1], end)
        else:
            group.append([start, end, desc, level, fclass])
    return out


def from_ground_truth(truth: pd.DataFrame, nodes: list[str], start_ms: int, end_ms: int) -> pd.DataFrame:
    """A simulated run's failures (``ground_truth.parquet``'s ``node, ts, cause, repair_ts``) as
    fleet records of its ``nodes`` over ``[start_ms, end_ms)``: each node's up spells between
    failures, ``kind`` the failure's cause. A repair that ends after the run is not seen."""
    def at(ms: pd.Series) -> pd.Series:  # nullable integers: pandas 3.1 casting floats with NaN overflowed
        return pd.to_datetime(pd.Series(ms, dtype="Int64"), unit="ms", utc=True).dt.as_unit("ns")

    rows = []
    by_node = {node: group.sort_values("ts") for node, group in truth.groupby("node")}
    for node in nodes:
        up = start_ms
        for f in by_node.get(node, truth.iloc[:0]).itertuples():
            repaired = f.repair_ts if f.repair_ts < end_ms else None
            rows.append((node, up, f.ts, f.cause, False, repaired))
            if repaired is None:
                break
            up = repaired
        else:
            rows.append((node, up, end_ms, None, True, None))
    frame = pd.DataFrame(rows, columns=["unit", "install", "end", "kind", "censored", "repaired"])
    return validate(pd.DataFrame({
        "unit": frame["unit"], "install_time": at(frame["install"]), "end_time": at(frame["end"]),
        "kind": frame["kind"], "censored": frame["censored"],
        "repaired_time": at(frame["repaired"]),
    }), where="ground truth")
