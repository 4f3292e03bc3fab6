"""Why nodes fail: the failure mix, foreshock timelines, Xid frequencies and time between failures.

Inputs are a dataset folder in the layout of :mod:`foreshock.ingest.dataset` (simulated, or collected and
labelled the same way) and, for the expected mix, a failure profile. Tables come back as pandas
DataFrames a notebook can show; each ``plot_*`` draws one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from foreshock.ingest.collectors.xid_policy import XidPolicy
from foreshock.ingest.dataset import read_ground_truth, read_manifest, read_table
from foreshock.ingest.simulator.profile import Profile

__all__ = [
    "Signal",
    "SIGNALS",
    "PRECURSOR_SIGNAL",
    "SEVERITY_COLORS",
    "profile_shares",
    "failure_mix",
    "plot_failure_mix",
    "pick_foreshock_example",
    "pick_healthy_node",
    "node_signals",
    "plot_foreshocks",
    "xid_frequency",
    "plot_xid_frequency",
    "time_between_failures",
    "plot_time_between_failures",
]

_HOUR_MS: Final = 3_600_000


@dataclass(frozen=True)
class Signal:
    """One per-node foreshock signal: a telemetry column reduced over the node's GPUs or ports.

    Counters (``counter=True``) are shown as their increase since the start of the window, so a
    healthy node sits near zero and a foreshock shows as a climb.
    """

    label: str
    table: str
    column: str
    reduce: str  # "max" or "sum" over the node's GPUs / ports at one instant
    counter: bool


SIGNALS: Final = (
    Signal("GPU temperature, hottest GPU (°C)", "gpu", "gpu_temp", "max", False),
    Signal("ECC single-bit errors (increase)", "gpu", "ecc_sbe_vol_total", "sum", True),
    Signal("NVLink CRC flit errors (increase)", "gpu", "nvlink_crc_flit_error_count_total", "sum", True),
    Signal("PCIe replays (increase)", "gpu", "pcie_replay_counter", "sum", True),
    Signal("Power-violation time (increase, µs)", "gpu", "power_violation", "sum", True),
    Signal("InfiniBand symbol errors (increase)", "link", "symbol_error", "sum", True),
)
PRECURSOR_SIGNAL: Final = {
    "thermal": SIGNALS[0],
    "ecc": SIGNALS[1],
    "nvlink": SIGNALS[2],
    "pcie": SIGNALS[3],
    "power": SIGNALS[4],
    "ib_link": SIGNALS[5],
}
"""The signal in which each simulator precursor kind shows first."""

SEVERITY_COLORS: Final = {"FATAL": "#c0392b", "NONFATAL": "#e6a23c", "UNKNOWN": "#7f8c8d"}


def profile_shares(profile: Profile) -> dict[str, float]:
    """Cause -> share of all interruptions, as the profile declares it."""
    return {f.cause: f.share for f in profile.failures}


def failure_mix(truth: pd.DataFrame, shares: Mapping[str, float]) -> pd.DataFrame:
    """Observed failures per cause beside the profile's share of them.

    Columns: ``cause``, ``failures``, ``observed_share``, ``profile_share``, ``expected`` (profile
    share x total failures). Every cause of either side appears; rows sorted by profile share.
    """
    counts = truth["cause"].astype(str).value_counts()
    causes = list(dict.fromkeys([*sorted(shares, key=lambda c: -shares[c]), *counts.index]))
    total = int(counts.sum())
    out = pd.DataFrame({"cause": causes})
    out["failures"] = [int(counts.get(c, 0)) for c in causes]
    out["observed_share"] = out["failures"] / total if total else 0.0
    out["profile_share"] = [float(shares.get(c, 0.0)) for c in causes]
    out["expected"] = out["profile_share"] * total
    return out


def plot_failure_mix(mix: pd.DataFrame, title: str = "Failure mix by cause: observed vs profile") -> Figure:
    """Side-by-side horizontal bars of observed and profile shares, one row per cause."""
    fig = Figure(figsize=(8, 0.32 * len(mix) + 1.6))
    ax = fig.subplots()
    y = np.arange(len(mix))[::-1]
    ax.barh(y + 0.2, mix["profile_share"], height=0.4, color="#95a5a6", label="profile share")
    ax.barh(
        y - 0.2,
        mix["observed_share"],
        height=0.4,
        color="#2c7fb8",
        label=f"observed share ({int(mix['failures'].sum())} failures)",
    )
    ax.set_yticks(y, mix["cause"], fontsize=8)
    ax.set_xlabel("share of failures")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def pick_foreshock_example(truth: pd.DataFrame, start_ms: int, hours_before: float = 6.0) -> pd.Series:
    """The detectable failure with the longest foreshock whose window lies inside the data.

    Raises ``ValueError`` when no failure gave warning (no row with ``precursor_start_ms``).
    """
    warned = truth[truth["detectable"].fillna(False).astype(bool) & truth["precursor_start_ms"].notna()]
    fits = warned[warned["ts"] - int(hours_before * _HOUR_MS) >= start_ms]
    pool = fits if len(fits) else warned
    if pool.empty:
        raise ValueError("no failure in this dataset announced itself (no precursor)")
    lead = pool["ts"] - pool["precursor_start_ms"].astype("int64")
    return pool.loc[lead.idxmax()]


def pick_healthy_node(truth: pd.DataFrame, nodes: int, start_ms: int, end_ms: int) -> str:
    """The first node id with no failure and no repair in ``[start_ms, end_ms)``."""
    busy = truth[(truth["ts"] < end_ms) & (truth["repair_ts"] >= start_ms)]["node"]
    for i in range(nodes):
        node = f"node{i:04d}"
        if node not in set(busy):
            return node
    raise ValueError("every node fails or is in repair during that window")


def node_signals(
    data_dir: str | Path, node: str, start_ms: int, end_ms: int, signals: tuple[Signal, ...] = SIGNALS
) -> pd.DataFrame:
    """One row per sampling instant of ``node`` in ``[start_ms, end_ms)``, one column per signal label.

    Counters are reduced over GPUs/ports, then shown as increase since the window's first sample.
    """
    parts = []
    for table in dict.fromkeys(s.table for s in signals):
        mine = [s for s in signals if s.table == table]
        cols = list(dict.fromkeys(["node", "ts", *(s.column for s in mine)]))
        frame = read_table(data_dir, table, columns=cols, start_ms=start_ms, end_ms=end_ms)
        frame = frame[frame["node"] == node]
        grouped = frame.groupby("ts")
        for s in mine:
            series = grouped[s.column].agg(s.reduce).astype(float).rename(s.label)
            if s.counter and len(series):
                series = series - series.iloc[0]
            parts.append(series)
    return pd.concat(parts, axis=1).sort_index()


def plot_foreshocks(
    failing: pd.DataFrame, healthy: pd.DataFrame, failure: pd.Series, healthy_node: str
) -> Figure:
    """Each signal against hours to the failure: the failing node in red, a healthy node in grey.

    ``failing``/``healthy`` come from :func:`node_signals` over the same window; ``failure`` is a
    ground-truth row (the dashed line is its instant, the shaded band its foreshock).
    """
    t0 = int(failure["ts"])
    failing, healthy = _break_gaps(failing), _break_gaps(healthy)
    cols = list(failing.columns)
    lead_signal = PRECURSOR_SIGNAL.get(str(failure["precursor"]))
    fig = Figure(figsize=(10, 1.9 * ((len(cols) + 1) // 2) + 0.8))
    axes = fig.subplots((len(cols) + 1) // 2, 2, sharex=True).ravel()
    for ax, col in zip(axes, cols, strict=False):
        ax.plot((healthy.index - t0) / _HOUR_MS, healthy[col], color="#7f8c8d", lw=1, label=healthy_node)
        ax.plot((failing.index - t0) / _HOUR_MS, failing[col], color="#c0392b", lw=1.2, label=failure["node"])
        ax.axvline(0, color="black", ls="--", lw=1)
        if pd.notna(failure["precursor_start_ms"]):
            ax.axvspan((int(failure["precursor_start_ms"]) - t0) / _HOUR_MS, 0, color="#f5b7b1", alpha=0.35)
        shows = lead_signal is not None and col == lead_signal.label
        ax.set_title(
            f"{col}  <- this precursor" if shows else col, fontsize=9, color="#c0392b" if shows else "black"
        )
        ax.tick_params(labelsize=8)
    for ax in axes[len(cols) :]:
        ax.set_visible(False)
    for ax in axes[-2:]:
        ax.set_xlabel("hours relative to the failure")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"Foreshocks of {failure['node']} ({failure['cause']}, precursor {failure['precursor']}) "
        f"beside healthy {healthy_node}",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def _break_gaps(frame: pd.DataFrame) -> pd.DataFrame:
    """Insert a NaN row inside every gap longer than 3 sampling intervals (node down), so lines break."""
    if len(frame) < 3:
        return frame
    ts = frame.index.to_numpy(dtype=np.int64)
    step = np.diff(ts)
    holes = ts[:-1][step > 3 * np.median(step)] + 1
    if holes.size == 0:
        return frame
    gap_rows = pd.DataFrame(np.nan, index=holes, columns=frame.columns)
    return pd.concat([frame, gap_rows]).sort_index()


def xid_frequency(xid: pd.DataFrame, policy: XidPolicy) -> pd.DataFrame:
    """Xid codes by how often they occur, with the policy's mnemonic, severity and action.

    ``events`` sums the ``count`` column (folded floods count every occurrence); ``nodes`` is how
    many distinct nodes reported the code. Sorted by events, most frequent first.
    """
    if xid.empty:
        return pd.DataFrame(columns=["xid", "events", "nodes", "mnemonic", "severity", "action"])
    grouped = xid.groupby("xid").agg(events=("count", "sum"), nodes=("node", "nunique")).reset_index()
    rules = [policy.lookup(int(x)) for x in grouped["xid"]]
    grouped["mnemonic"] = [r.mnemonic for r in rules]
    grouped["severity"] = [r.severity for r in rules]
    grouped["action"] = [r.action for r in rules]
    return grouped.sort_values(["events", "xid"], ascending=[False, True], ignore_index=True)


def plot_xid_frequency(freq: pd.DataFrame, title: str = "Xid codes by frequency and severity") -> Figure:
    """Horizontal bars of events per Xid code, coloured by the policy's severity."""
    fig = Figure(figsize=(8, 0.35 * max(len(freq), 1) + 1.6))
    ax = fig.subplots()
    y = np.arange(len(freq))[::-1]
    colors = [SEVERITY_COLORS.get(s, SEVERITY_COLORS["UNKNOWN"]) for s in freq["severity"]]
    ax.barh(y, freq["events"], color=colors)
    ax.set_yticks(
        y, [f"Xid {x} {m[:28]}" for x, m in zip(freq["xid"], freq["mnemonic"], strict=True)], fontsize=8
    )
    for sev, color in SEVERITY_COLORS.items():
        if sev in set(freq["severity"]):
            ax.barh([np.nan], [np.nan], color=color, label=sev)
    ax.set_xlabel("events (occurrences)")
    ax.set_title(title)
    if len(freq):
        ax.legend(title="severity", fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def time_between_failures(data_dir: str | Path) -> tuple[pd.Series, float]:
    """Gaps between consecutive failures anywhere in the cluster (hours), and the mean gap of a
    Poisson process with the observed rate (run length / failures, hours)."""
    truth, manifest = read_ground_truth(data_dir), read_manifest(data_dir)
    ts = np.sort(truth["ts"].to_numpy(dtype=np.int64))
    gaps = pd.Series(np.diff(ts) / _HOUR_MS, name="hours between failures")
    span_h = (int(manifest["end_ms"]) - int(manifest["start_ms"])) / _HOUR_MS
    return gaps, span_h / len(ts) if len(ts) else float("inf")


def plot_time_between_failures(
    gaps: pd.Series, mean_gap_hours: float, title: str = "Time between failures (whole cluster)"
) -> Figure:
    """Histogram of gaps (density) with the exponential law of the same mean: Poisson failures."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if len(gaps):
        ax.hist(
            gaps,
            bins=min(30, max(5, len(gaps) // 2)),
            density=True,
            color="#2c7fb8",
            alpha=0.7,
            label=f"observed ({len(gaps)} gaps, mean {gaps.mean():.1f} h)",
        )
        x = np.linspace(0, float(gaps.max()) * 1.05, 200)
        ax.plot(
            x,
            np.exp(-x / mean_gap_hours) / mean_gap_hours,
            color="#c0392b",
            label=f"exponential, mean {mean_gap_hours:.1f} h",
        )
        ax.legend(fontsize=8)
    ax.set_xlabel("hours between consecutive failures")
    ax.set_ylabel("density")
    ax.set_title(title)
    fig.tight_layout()
    return fig
