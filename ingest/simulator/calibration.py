"""Calibrating a profile from a real fault trace (InfiniteHBD: 400 servers, 349 days).

The trace (stepfun-ai/InfiniteHBD-Trace ``fault_trace.json``) lists ``fault_start`` and
``fault_end`` events per node with a (Level, Class, Desc) fault type and a time in days.
:data:`INFINITEHBD_CAUSES` folds its 40 descriptions into the causes of
``datasets/profiles/infinitehbd.toml``; :func:`summarize_trace` gives each cause's count,
share and lognormal repair-time fit (median hours, sigma of log hours), and the rate per
GPU-day, which is what the profile ships. ``python -m foreshock.ingest.simulator.calibration TRACE``
prints them.

Repeat failures (a profile's ``[refault]`` table) are fitted by :func:`fit_refault` to the trace's
repeat-failure curve, P(another fault within W of a repair), which ``foreshock.models.fleet``
measures from the trace's records: ``python -m foreshock.models.fleet.refault TRACE`` prints
the table (``datasets/profiles/infinitehbd-refault.toml``).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy.optimize import least_squares
from scipy.special import ndtr

from foreshock.ingest.simulator.profile import Refault

__all__ = ["INFINITEHBD_CAUSES", "CauseFit", "TraceSummary", "summarize_trace", "refault_toml",
           "refault_curve", "fit_refault"]

INFINITEHBD_SERVERS: Final = 400
INFINITEHBD_DAYS: Final = 349
INFINITEHBD_GPUS_PER_SERVER: Final = 8
_MIN_REPAIR_HOURS: Final = 1 / 60  # a fault closed in the same minute still took the node out

INFINITEHBD_CAUSES: Final[dict[tuple[str, str], str]] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): "gpu_ecc",
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): "gpu_ecc",
    ("GPU", "GPU device unknow error"): "gpu_lost",
    ("GPU", "GPU Lost"): "gpu_lost",
    ("GPU", "nvidia-smi Timeout"): "gpu_lost",
    ("GPU", "GPU device not found"): "gpu_lost",
    ("GPU", "GPU PCI link width low"): "gpu_pcie_link",
    ("GPU", "GPU xid Error"): "gpu_xid",
    ("GPU", "GPU Temperature High"): "gpu_thermal",
    ("GPU", "GPU P2P Bandwidth Low"): "gpu_nvlink",
    ("GPU", "Silent Data Corruption"): "silent_data_corruption",
    ("Parameter Plane Cable", "Link Down"): "ib_link_down",
    ("Change", "Y-cables Taken offline"): "ib_link_down",
    ("Change", "Remote Optical Module Failure"): "ib_link_down",
    ("NIC", "*"): "nic",
    ("Power Supply", "*"): "power_supply",
    ("Fan", "*"): "fan",
    ("Motherboard", "*"): "host_hardware",
    ("Motherboard Battery", "*"): "host_hardware",
    ("CPU", "*"): "host_hardware",
    ("RAID Card", "*"): "host_hardware",
    ("Riser Card", "*"): "host_hardware",
    ("Other Failures", "*"): "unknown",  # under both Hardware and Software levels: cause unknown
    ("Software Tool", "*"): "software",
    ("File System", "*"): "software",
    ("Operating System", "*"): "software",
    ("Firmware", "*"): "software",
    ("Unknown Error", "*"): "unknown",
    ("Stress Test Failure", "*"): "unknown",
    ("System Crash", "*"): "unknown",
    ("Training Task Troubleshooting", "*"): "unknown",
    ("Test", "*"): "unknown",
}


def cause_of(fault_class: str, desc: str) -> str:
    """The profile cause of one trace fault type; raises KeyError for a type the map lacks."""
    return INFINITEHBD_CAUSES.get((fault_class, desc)) or INFINITEHBD_CAUSES[(fault_class, "*")]


@dataclass(frozen=True, slots=True)
class CauseFit:
    cause: str
    count: int
    share: float
    repair_median_hours: float
    repair_sigma: float


@dataclass(frozen=True, slots=True)
class TraceSummary:
    faults: int
    interruptions_per_gpu_day: float
    causes: tuple[CauseFit, ...]


def summarize_trace(
    events: list[dict[str, Any]],
    servers: int = INFINITEHBD_SERVERS,
    days: float = INFINITEHBD_DAYS,
    gpus_per_server: int = INFINITEHBD_GPUS_PER_SERVER,
) -> TraceSummary:
    """Count faults per cause and fit repair times (a start matches the next end of its node and type)."""
    open_faults: dict[tuple, list[float]] = defaultdict(list)
    repairs: dict[str, list[float]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["event_time"]):
        ft = e["fault_type"]
        key = (e["node_id"], ft["Level"], ft["Class"], ft["Desc"])
        if e["event_type"] == "fault_start":
            open_faults[key].append(e["event_time"])
        elif open_faults[key]:
            hours = (e["event_time"] - open_faults[key].pop(0)) * 24
            repairs[cause_of(ft["Class"], ft["Desc"])].append(max(hours, _MIN_REPAIR_HOURS))
    total = sum(len(v) for v in repairs.values())
    fits = []
    for cause, hours in sorted(repairs.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        logs = np.log(hours)
        fits.append(
            CauseFit(
                cause,
                len(hours),
                len(hours) / total,
                float(np.exp(np.median(logs))),
                float(logs.std()) if len(hours) > 1 else 1.0,
            )
        )
    return TraceSummary(total, total / (servers * days * gpus_per_server), tuple(fits))


def refault_toml(refault: Refault) -> str:
    """A ``[refault]`` table as TOML, ready to paste into a profile."""
    return "[refault]\n" + "".join(f"{f.name} = {getattr(refault, f.name):.4g}\n" for f in fields(refault))


def refault_curve(
    refault: Refault, hours: np.ndarray, failures_per_day: float, down_days: float
) -> np.ndarray:
    """P(a node fails again within ``hours`` of a repair) under the simulator's refault model.

    A repair fails with probability p and the node fails again after a lognormal delay;
    otherwise the node fails at its own Poisson rate (a lemon's m times a healthy node's). The
    healthy rate is the one that keeps the cluster at ``failures_per_day`` per node-day up, each
    failure taking ``down_days`` to repair, as the simulator sets it.
    """
    p = refault.failed_repair_probability
    hours = np.asarray(hours, dtype=float)
    first = refault.first_failure_rate(failures_per_day, down_days) / 24.0
    lemons = refault.lemon_repair_share(first * 24.0, down_days)
    delay = ndtr((np.log(hours) - np.log(refault.failed_repair_median_hours))
                 / max(refault.failed_repair_sigma, 1e-9))
    m = refault.lemon_rate_multiplier
    own = lemons * -np.expm1(-m * first * hours) + (1.0 - lemons) * -np.expm1(-first * hours)
    return p * delay + (1.0 - p) * own


_REFAULT_START: Final = (0.2, 1.5, 1.5, 0.05, 10.0)
_REFAULT_BOUNDS: Final = ([0.0, 0.05, 0.1, 0.0, 1.0], [0.9, 48.0, 4.0, 0.5, 200.0])


def fit_refault(
    hours: np.ndarray, observed: np.ndarray, failures_per_day: float, down_days: float
) -> Refault:
    """The ``[refault]`` table whose :func:`refault_curve` is closest (least squares) to an observed
    repeat-failure curve, for a cluster failing ``failures_per_day`` per node-day up with repairs
    of ``down_days`` on average (the profile's ``mean_repair_days`` over the trace's span)."""
    hours, observed = np.asarray(hours, dtype=float), np.asarray(observed, dtype=float)

    def residuals(x: np.ndarray) -> np.ndarray:
        return refault_curve(Refault(*x), hours, failures_per_day, down_days) - observed

    result = least_squares(residuals, np.array(_REFAULT_START), bounds=_REFAULT_BOUNDS)
    return Refault(*(float(v) for v in result.x))


def main(path: str) -> None:
    summary = summarize_trace(json.loads(Path(path).read_text()))
    print(f"faults={summary.faults} interruptions_per_gpu_day={summary.interruptions_per_gpu_day:.7f}")
    for f in summary.causes:
        print(
            f"{f.cause:24s} count={f.count:4d} share={f.share:.6f} "
            f"repair_median_hours={f.repair_median_hours:.2f} repair_sigma={f.repair_sigma:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
