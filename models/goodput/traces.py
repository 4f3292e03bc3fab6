"""Failure traces the goodput simulator replays: drawn from a profile, read from a simulated
dataset's ground truth, or the real InfiniteHBD trace.

A trace is the list of interruptions that hit a training job spanning ``nodes × gpus_per_node``
GPUs over ``duration_s``: when each failure lands, how long its node is out for repair, and its
cause. Node identities only matter for repair bookkeeping, so the simulator treats the job's
nodes as interchangeable slots.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foreshock.ingest.dataset import read_ground_truth, read_manifest
from foreshock.ingest.simulator.calibration import cause_of
from foreshock.ingest.simulator.profile import parse_profile, read_profile_data
from foreshock.ingest.simulator.schedule import draw_schedule
from foreshock.models.reliability import SECONDS_PER_DAY

__all__ = [
    "FailureTrace",
    "INFINITEHBD_NODES",
    "INFINITEHBD_GPUS_PER_NODE",
    "load_infinitehbd",
    "load_profile",
    "from_profile",
    "from_ground_truth",
    "resize",
]

INFINITEHBD_NODES = 400
INFINITEHBD_GPUS_PER_NODE = 8
INFINITEHBD_DAYS = 349.0
DEFAULT_REPAIR_MEDIAN_HOURS = 24.0
DEFAULT_REPAIR_SIGMA = 1.5  # log-normal spread of repair times when a profile gives none


@dataclass(frozen=True)
class FailureTrace:
    """Failures of one job's nodes, sorted by time (seconds since the trace start)."""

    name: str
    nodes: int
    gpus_per_node: int
    duration_s: float
    fail_s: np.ndarray
    repair_s: np.ndarray
    cause: np.ndarray
    node: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.fail_s)
        if not (len(self.repair_s) == len(self.cause) == len(self.node) == n):
            raise ValueError("fail_s, repair_s, cause and node must have the same length")
        if n and (np.any(np.diff(self.fail_s) < 0) or self.fail_s[0] < 0):
            raise ValueError("fail_s must be sorted and non-negative")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def days(self) -> float:
        return self.duration_s / SECONDS_PER_DAY

    @property
    def mtbf_s(self) -> float:
        """Observed mean time between failures of the whole job (``inf`` without failures)."""
        return self.duration_s / len(self.fail_s) if len(self.fail_s) else math.inf

    def __len__(self) -> int:
        return len(self.fail_s)


def _make(name: str, nodes: int, gpus_per_node: int, duration_s: float, fail_s: Any, repair_s: Any,
          cause: Any, node: Any) -> FailureTrace:
    order = np.argsort(np.asarray(fail_s, dtype=float), kind="stable")
    return FailureTrace(name, nodes, gpus_per_node, float(duration_s),
                        np.asarray(fail_s, dtype=float)[order], np.asarray(repair_s, dtype=float)[order],
                        np.asarray(cause, dtype=object)[order], np.asarray(node, dtype=np.int64)[order])


def load_infinitehbd(path: str | Path) -> FailureTrace:
    """Read the InfiniteHBD ``fault_trace.json`` (400 servers × 8 GPUs, 349 days).

    Each ``fault_start`` is paired with the next ``fault_end`` of the same node and fault type
    (ends sort after starts at equal times, so zero-length faults pair up). A fault that starts
    while the same node is still in an earlier fault is dropped: the node is already out of the
    job. The cause is the ``datasets/profiles/infinitehbd.toml`` cause the simulator's calibration
    maps the fault type to (``gpu_ecc``, ``ib_link_down``, ``unknown``, ...), so per-cause recall
    measured on data simulated from that profile applies to the real faults.
    """
    events = json.loads(Path(path).read_text())
    events.sort(key=lambda e: (e["event_time"], e["event_type"] != "fault_start"))
    open_faults: dict[tuple[str, str, str, str], list[float]] = {}
    rows: list[tuple[str, float, float, str]] = []
    for e in events:
        ft = e["fault_type"]
        key = (e["node_id"], ft["Level"], ft["Class"], ft["Desc"])
        if e["event_type"] == "fault_start":
            open_faults.setdefault(key, []).append(e["event_time"])
        else:
            cause = cause_of(ft["Class"], ft["Desc"])
            rows.append((e["node_id"], open_faults[key].pop(0), e["event_time"], cause))
    frame = pd.DataFrame(rows, columns=["node", "start", "end", "cause"]).sort_values(["node", "start"])
    previous_end = frame.groupby("node")["end"].transform(lambda s: s.cummax().shift(fill_value=-1.0))
    frame = frame[frame["start"] >= previous_end]
    node_index = {n: i for i, n in enumerate(sorted(frame["node"].unique()))}
    return _make("infinitehbd", INFINITEHBD_NODES, INFINITEHBD_GPUS_PER_NODE,
                 INFINITEHBD_DAYS * SECONDS_PER_DAY,
                 frame["start"].to_numpy() * SECONDS_PER_DAY,
                 (frame["end"] - frame["start"]).to_numpy() * SECONDS_PER_DAY,
                 frame["cause"].to_numpy(), frame["node"].map(node_index).to_numpy())


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read a cluster profile TOML (``datasets/profiles/<name>.toml``) as a plain dict, the
    profile it ``extends`` filled in."""
    return read_profile_data(path)


def _repair_median_hours(entry: Mapping[str, Any], cluster: Mapping[str, Any]) -> float:
    """The failure entry's ``repair_median_hours``, else the cluster's, else 24 h."""
    fallback = cluster.get("repair_median_hours", DEFAULT_REPAIR_MEDIAN_HOURS)
    return float(entry.get("repair_median_hours", fallback))


def from_profile(profile: Mapping[str, Any], *, gpus: int, days: float, seed: int = 0) -> FailureTrace:
    """Draw a Poisson failure trace for a job of ``gpus`` GPUs from a cluster profile.

    Uses ``[cluster] interruptions_per_gpu_day`` and ``gpus_per_node``; causes are drawn by the
    ``[[failure]]`` entries' ``share``; repair times are log-normal around the entry's (or the
    cluster's) median repair time when the profile gives one (``repair_median_hours``, spread
    ``[cluster] repair_sigma``), else around 24 h. Assumes independent exponential inter-arrival
    times, as the closed forms do.

    A profile with a ``[refault]`` table (failed repairs and lemon nodes, e.g.
    ``infinitehbd-refault``) is drawn node by node by the cluster simulator's own schedule
    (:func:`foreshock.ingest.simulator.schedule.draw_schedule`): each node is down for its repair
    and fails again as the table says, so a burn-in (:mod:`foreshock.models.goodput.burnin`) has
    repeat failures to hold back. Such a profile must be complete (it is validated as the
    simulator validates it).
    """
    if "refault" in profile:
        return _from_schedule(profile, gpus=gpus, days=days, seed=seed)
    cluster = profile.get("cluster", {})
    rate = float(cluster["interruptions_per_gpu_day"])
    gpus_per_node = int(cluster.get("gpus_per_node", 8))
    entries = list(profile.get("failure", [])) or [{"cause": "unknown", "share": 1.0}]
    shares = np.array([float(e.get("share", 1.0)) for e in entries])
    rng = np.random.default_rng(seed)
    nodes = math.ceil(gpus / gpus_per_node)
    duration_s = days * SECONDS_PER_DAY
    count = rng.poisson(rate * nodes * gpus_per_node * days)
    fail_s = np.sort(rng.uniform(0.0, duration_s, count))
    pick = rng.choice(len(entries), size=count, p=shares / shares.sum())
    medians_h = np.array([_repair_median_hours(e, cluster) for e in entries])[pick]
    sigma = float(cluster.get("repair_sigma", DEFAULT_REPAIR_SIGMA))
    repair_s = medians_h * 3600.0 * np.exp(sigma * rng.standard_normal(count))
    causes = np.array([str(e.get("cause", "unknown")) for e in entries], dtype=object)[pick]
    return _make(str(profile.get("name", "profile")), nodes, gpus_per_node, duration_s, fail_s, repair_s,
                 causes, rng.integers(0, nodes, count))


def _from_schedule(profile: Mapping[str, Any], *, gpus: int, days: float, seed: int) -> FailureTrace:
    """The failures the cluster simulator draws for ``profile``'s nodes over ``days``."""
    name = str(profile.get("name", "profile"))
    spec = parse_profile({k: v for k, v in profile.items() if k != "name"}, name)
    nodes = math.ceil(gpus / spec.cluster.gpus_per_node)
    end_ms = int(days * SECONDS_PER_DAY * 1000)
    failures = draw_schedule(spec, nodes, 0, end_ms, seed).failures
    fail_ms = np.array([f.ts for f in failures], dtype=np.int64)
    repair_ms = np.array([f.repair_ts for f in failures], dtype=np.int64) - fail_ms
    return _make(name, nodes, spec.cluster.gpus_per_node, days * SECONDS_PER_DAY, fail_ms / 1000.0,
                 repair_ms / 1000.0, [f.cause for f in failures], [f.node for f in failures])


def from_ground_truth(directory: str | Path) -> FailureTrace:
    """The failures a simulated dataset injected (``DIR/ground_truth.parquet`` + ``manifest.json``).

    The job spans every node of the simulated cluster over the dataset's time range.
    """
    manifest, truth = read_manifest(directory), read_ground_truth(directory)
    start_ms = int(manifest["start_ms"])
    fail_ms = truth["ts"].to_numpy(dtype=np.int64)
    repair_s = np.maximum(0.0, (truth["repair_ts"].to_numpy(dtype=np.int64) - fail_ms) / 1000.0)
    fail_s = (fail_ms - start_ms) / 1000.0
    node = truth["node"].str.removeprefix("node").astype(int).to_numpy()
    return _make(str(manifest["profile"]), int(manifest["nodes"]),
                 int(manifest["gpus_per_node"]), (int(manifest["end_ms"]) - start_ms) / 1000.0,
                 fail_s, repair_s, truth["cause"].astype(str).to_numpy(), node)


def resize(trace: FailureTrace, gpus: int, seed: int = 0) -> FailureTrace:
    """The same cluster's failure process seen by a job of ``gpus`` GPUs.

    Fewer nodes: a random subset of the trace's nodes (keeping their real failures). More
    nodes: the trace is tiled, each extra copy circularly shifted in time by a random offset so
    copies do not fail in lockstep. Rates per node are preserved either way.
    """
    nodes = math.ceil(gpus / trace.gpus_per_node)
    if nodes == trace.nodes:
        return trace
    rng = np.random.default_rng(seed)
    copies = math.ceil(nodes / trace.nodes)
    offsets = np.concatenate([[0.0], rng.uniform(0.0, trace.duration_s, copies - 1)])
    fail = np.concatenate([(trace.fail_s + off) % trace.duration_s for off in offsets])
    node = np.concatenate([trace.node + k * trace.nodes for k in range(copies)])
    keep = np.isin(node, rng.permutation(copies * trace.nodes)[:nodes])
    node_ids = np.unique(node[keep], return_inverse=True)[1]
    return _make(trace.name, nodes, trace.gpus_per_node, trace.duration_s, fail[keep],
                 np.tile(trace.repair_s, copies)[keep], np.tile(trace.cause, copies)[keep], node_ids)
