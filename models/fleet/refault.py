"""Calibrating a simulator profile's ``[refault]`` table to a real trace's repeat-failure curve.

The curve is measured by :func:`foreshock.models.fleet.repeat.repeat_failure_curve`; the model
fitted to it is the simulator's own (``foreshock.ingest.simulator.calibration.fit_refault``).
``python -m foreshock.models.fleet.refault TRACE PROFILE`` prints the table for a
``fault_trace.json`` and the profile it extends: with the InfiniteHBD trace and
``datasets/profiles/infinitehbd.toml``, what ``datasets/profiles/infinitehbd-refault.toml`` ships.
"""

from __future__ import annotations

import sys

import pandas as pd

from foreshock.ingest.simulator.calibration import fit_refault, refault_toml
from foreshock.ingest.simulator.profile import Profile, Refault, load_profile
from foreshock.models.fleet.records import spells
from foreshock.models.fleet.repeat import DEFAULT_WINDOWS, repeat_failure_curve
from foreshock.models.fleet.sources import load_infinitehbd

__all__ = ["failures_per_unit_day", "calibrate_refault"]


def failures_per_unit_day(records: pd.DataFrame) -> float:
    """Failures per day a unit is in service (down time for repair not counted)."""
    view = spells(records)
    return float(view["failed"].sum() / view["duration_days"].sum())


def calibrate_refault(
    records: pd.DataFrame, profile: Profile, windows: tuple[pd.Timedelta, ...] = DEFAULT_WINDOWS
) -> Refault:
    """The ``[refault]`` table for ``profile`` whose curve comes closest to the records' at
    ``windows`` (1 h ... 30 d), at the profile's failure rate and repair times over the span of
    the records."""
    curve = repeat_failure_curve(records, windows).frame
    return fit_refault(curve["window_hours"].to_numpy(), curve["p_refault"].to_numpy(),
                       profile.node_failures_per_day(), profile.mean_repair_days(_span_days(records)))


def _span_days(records: pd.DataFrame) -> float:
    return (records["end_time"].max() - records["install_time"].min()) / pd.Timedelta(days=1)


def main(trace_path: str, profile_path: str) -> None:
    records = load_infinitehbd(trace_path)
    profile = load_profile(profile_path)
    print(f"# trace: {failures_per_unit_day(records):.6f} failures per server-day in service; profile "
          f"{profile.name}: {profile.node_failures_per_day():.6f}, "
          f"{profile.mean_repair_days(_span_days(records)):.2f} days mean repair")
    print(refault_toml(calibrate_refault(records, profile)), end="")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
