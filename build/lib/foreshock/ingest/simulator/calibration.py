"""Calibrating a profile from a real fault trace (InfiniteHBD: 400 servers, 349 days).

The trace (stepfun-ai/InfiniteHBD-Trace ``fault_trace.json``) lists ``fault_start`` and
``fault_end`` events per node with a (Level, Class, Desc) fault type and a time in days.
:data:`INFINITEHBD_CAUSES` folds its 40 descriptions into the causes of
``datasets/profiles/infinitehbd.toml``; :func:`summarize_trace` gives each cause's count,
share and lognormal repair-time fit (median hours, sigma of log hours), and the rate per
GPU-day, which is what the profile ships. ``python -m foreshock.ingest.simulator.calibration TRACE``
prints them.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = ["INFINITEHBD_CAUSES", "CauseFit", "TraceSummary", "summarize_trace"]

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
