"""Fleet records: one table of failure and repair history, whatever system it came from.

A fleet record is one *spell* of one unit (a GPU, a node, any replaceable component) in
service at one location: it starts at ``install_time`` (installed, or back from repair), ends
at ``end_time`` with a failure of ``kind`` or, when ``censored`` is true, without one (removed
for another reason, or still running when the records stop). A repairable unit that comes back
has ``repaired_time`` set on the failed spell and a new spell starting then. Columns:

======================  ==========================================================================
``unit``                the component or node (serial number, host name); required
``location``            where it sat (rack, cname, slot); may be empty
``install_time``        start of the spell (UTC)
``end_time``            failure, removal, or end of observation (UTC), not before ``install_time``
``kind``                the failure's kind (``DBE``, ``Unknown Error``, ...); required unless censored
``censored``            true when the spell ended without a failure
``repaired_time``       when a failed unit was back in service (UTC); empty if never or unknown
======================  ==========================================================================

Any further column is kept as text (a batch, a vendor, a rack row) so analyses can group by it.
:func:`read_csv` reads the generic CSV a site exports from its ticketing system
(``docs/fleet-records.md``); :func:`validate` checks any frame in this shape and raises
:class:`FleetRecordError` naming the row and the field of every problem it finds.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

__all__ = [
    "COLUMNS",
    "REQUIRED",
    "FleetRecordError",
    "validate",
    "read_csv",
    "spells",
    "unit_lifetimes",
]

COLUMNS: Final = ("unit", "location", "install_time", "end_time", "kind", "censored", "repaired_time")
REQUIRED: Final = ("unit", "install_time", "end_time", "censored")
_TIMES: Final = ("install_time", "end_time", "repaired_time")
_TRUE: Final = frozenset({"true", "1", "yes", "y", "t"})
_FALSE: Final = frozenset({"false", "0", "no", "n", "f"})
_MAX_LISTED: Final = 20
_SECONDS_PER_DAY: Final = 86_400.0


class FleetRecordError(ValueError):
    """Records that cannot be used; the message lists each bad row (line number) and field."""

    def __init__(self, where: str, problems: list[str]):
        self.problems = problems
        shown = problems[:_MAX_LISTED]
        more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        super().__init__(f"{where}: {len(problems)} bad record(s):\n  " + "\n  ".join(shown) + more)


def _times(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Times in UTC (ISO 8601; naive ones read as UTC) and the mask of values given but unreadable."""
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        return values.dt.tz_convert("UTC"), pd.Series(False, index=values.index)
    if pd.api.types.is_datetime64_dtype(values.dtype):
        return values.dt.tz_localize("UTC"), pd.Series(False, index=values.index)
    text = _texts(values)
    given = text.notna()
    parsed = pd.to_datetime(text, utc=True, errors="coerce", format="ISO8601")
    return parsed, given & parsed.isna()


def _texts(values: pd.Series) -> pd.Series:
    """Stripped text, ``None`` where empty or missing."""
    text = values.astype("string").str.strip()
    return text.astype(object).where((text.notna() & (text != "")).to_numpy(dtype=bool), None)


def _flags(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Booleans from true/false/1/0/yes/no, and the mask of values that are none of those."""
    if pd.api.types.is_bool_dtype(values.dtype):
        return values.astype(bool), pd.Series(False, index=values.index)
    text = values.astype("string").str.strip().str.lower()
    true, false = text.isin(_TRUE).fillna(False), text.isin(_FALSE).fillna(False)
    return true.astype(bool), ~(true | false).astype(bool)


def _build(frame: pd.DataFrame, labels: list[str], where: str) -> pd.DataFrame:
    """Check and normalise; every problem is reported with its row's label and the field."""
    problems: list[tuple[int, str]] = []

    def flag(mask: pd.Series, field: str, why: Any) -> None:
        for pos in np.flatnonzero(mask.to_numpy(dtype=bool)):
            problems.append((int(pos), f"{labels[pos]}, field {field}: {why(pos) if callable(why) else why}"))

    out = pd.DataFrame(index=frame.index)
    raw = {c: frame[c] if c in frame else pd.Series(None, index=frame.index, dtype=object) for c in COLUMNS}
    out["unit"] = _texts(raw["unit"])
    flag(out["unit"].isna(), "unit", "empty (every record names its unit)")
    out["location"] = _texts(raw["location"])
    for field in _TIMES:
        out[field], unreadable = _times(raw[field])
        flag(unreadable, field, lambda pos, f=field: f"{raw[f].iloc[pos]!r} is not a date and time")
        if field != "repaired_time":
            flag(out[field].isna() & ~unreadable, field, "empty")
    out["censored"], unreadable = _flags(raw["censored"])
    flag(unreadable, "censored", lambda pos: f"{raw['censored'].iloc[pos]!r} is not true or false")
    out["kind"] = _texts(raw["kind"])
    no_kind = ~out["censored"] & ~unreadable & out["kind"].isna()
    flag(no_kind, "kind", "empty for a failure (censored is false)")
    start, end, back = out["install_time"], out["end_time"], out["repaired_time"]
    flag(end < start, "end_time", lambda pos: f"{end.iloc[pos]} is before install_time {start.iloc[pos]}")
    flag(back < end, "repaired_time", lambda pos: f"{back.iloc[pos]} is before end_time {end.iloc[pos]}")
    flag(back.notna() & out["censored"], "repaired_time", "set on a censored record (no failure to repair)")
    if not problems:
        _overlaps(out, labels, problems)
    if problems:
        raise FleetRecordError(where, [text for _, text in sorted(problems)])
    for name in frame.columns:
        if name not in COLUMNS:
            out[name] = frame[name] if frame[name].dtype.kind in "biuf" else _texts(frame[name])
    out = out[list(COLUMNS) + [c for c in out.columns if c not in COLUMNS]]
    return out.sort_values(["unit", "install_time"], kind="stable").reset_index(drop=True)


def _overlaps(frame: pd.DataFrame, labels: list[str], problems: list[tuple[int, str]]) -> None:
    """A unit is in one place at a time: a spell may not start before its previous one ended."""
    order = frame.reset_index(drop=True).sort_values(["unit", "install_time", "end_time"], kind="stable")
    same = order["unit"].eq(order["unit"].shift())
    previous_end = order["end_time"].shift()
    previous_pos = pd.Series(order.index, index=order.index).shift()
    for pos in order.index[(same & (order["install_time"] < previous_end)).to_numpy()]:
        problems.append((int(pos), (
            f"{labels[pos]}, field install_time: {order.at[pos, 'install_time']} is before the end "
            f"({previous_end[pos]}) of unit {order.at[pos, 'unit']!r}'s previous record "
            f"({labels[int(previous_pos[pos])]})")))


def validate(frame: pd.DataFrame, where: str = "records") -> pd.DataFrame:
    """Check a frame of fleet records and return it normalised (UTC times, sorted by unit and time).

    Rows are named by their position (``row 3``). Raises :class:`FleetRecordError` listing every
    bad row and field, or naming the missing columns.
    """
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise FleetRecordError(where, [f"missing column(s): {', '.join(missing)}"])
    return _build(frame.reset_index(drop=True), [f"row {i}" for i in range(len(frame))], where)


def read_csv(path: str | Path) -> pd.DataFrame:
    """Read a site's exported records (``docs/fleet-records.md``): a header line, then one spell a line.

    Rows are named by their line in the file (``line 4``), as an editor shows them.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise FleetRecordError(str(path), [f"line 1 (header): missing column(s): {', '.join(missing)}"])
        reader.fieldnames = header
        rows, labels = [], []
        for row in reader:
            if None in row:
                raise FleetRecordError(str(path), [f"line {reader.line_num}: more fields than the header"])
            rows.append(row)
            labels.append(f"line {reader.line_num}")
    frame = pd.DataFrame(rows, columns=header, dtype=object)
    return _build(frame, labels, str(path))


def spells(records: pd.DataFrame) -> pd.DataFrame:
    """The records with ``duration_days`` (time in the spell) and ``failed`` (not censored):
    the survival view of a repairable unit's times between failures."""
    out = records.copy()
    out["duration_days"] = (out["end_time"] - out["install_time"]).dt.total_seconds() / _SECONDS_PER_DAY
    out["failed"] = ~out["censored"].astype(bool)
    return out


def unit_lifetimes(records: pd.DataFrame, observed_until: pd.Timestamp | None = None) -> pd.DataFrame:
    """One row per unit: its whole life in service, the survival view of a replaceable component.

    ``duration_days`` adds up the unit's spells (a unit moved or reseated keeps its age). The life
    ends in a failure (``failed``) when the unit had a failure and left service before
    ``observed_until`` (default: the last ``end_time``); a unit repaired and still in service then
    is censored. ``location`` and the other columns are those of the unit's longest spell, and
    ``kind`` that of its last failure; ``spells`` counts its spells.
    """
    view = spells(records)
    until = view["end_time"].max() if observed_until is None else pd.Timestamp(observed_until)
    grouped = view.groupby("unit", sort=True)
    longest = view.loc[grouped["duration_days"].idxmax()].set_index("unit")
    failures = view[view["failed"]].sort_values("end_time").groupby("unit")["kind"].last()
    out = longest.drop(columns=["duration_days", "failed", "kind", "censored", "end_time",
                                "install_time", "repaired_time"])
    out.insert(0, "duration_days", grouped["duration_days"].sum())
    out.insert(1, "failed", grouped["failed"].any() & (grouped["end_time"].max() < until))
    out.insert(2, "kind", failures.reindex(out.index))
    out.insert(3, "first_install", grouped["install_time"].min())
    out.insert(4, "last_end", grouped["end_time"].max())
    out.insert(5, "spells", grouped.size())
    return out.reset_index()
