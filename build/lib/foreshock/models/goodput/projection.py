"""Tier costs at a cluster's scale, projected from a drill on this machine and from published figures.

``foreshock drill --json`` measures, on one CPU machine, the bandwidth of each path the
training-side library moves state along (memory copy, replication to the buddy, restore from it,
durable write, durable restore) and the fixed parts of each recovery (detection, rendezvous,
worker start, first step). :func:`project` turns them into a tiered job's costs for a state size
per GPU and a cluster size:

* a path's time = bytes per GPU / the smaller of the drill's bandwidth (what the implementation
  achieved) and the published bandwidth of the hardware that path crosses on a GPU node (what
  the node allows). Every GPU moves its own shard, all at once, so per-GPU figures apply;
* a recovery = the drill scenario's fixed components + bytes per GPU / its restore path's
  bandwidth + the published time to initialise a job's communicators at that scale, which a
  two-process drill cannot show.

Every published figure is a :class:`Source` in ``SOURCES``; the CLI prints the ones it used.
Only the figures named here are cited; the rest come from the drill file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from foreshock.models.goodput.simulate import JobParams
from foreshock.models.goodput.tiers import TierParams

__all__ = ["SOURCES", "DrillReport", "DrillScenario", "PathTime", "Recovery", "Source", "TierProjection",
           "project", "reinit_source"]

BANDWIDTHS = ("memory_copy", "peer_replication", "peer_restore", "durable_write", "durable_restore")
FIXED_COMPONENTS = ("detection", "rendezvous", "worker_start", "first_step")
SCENARIOS = {"peer": "unwarned", "durable": "pair_lost", "migration": "warned"}  # recovery kind -> drill
# What each recovery moves, in the job model: a lost node is rebuilt from its buddy, a pair loss from
# storage, a warned node's memory goes straight to the spare over the same link. (The drill's own
# ``restore_source`` says which tier its ranks used; it is reported, not needed here.)
RESTORE_PATHS = {"peer": "peer_restore", "durable": "durable_restore", "migration": "peer_restore"}


@dataclass(frozen=True)
class Source:
    """One published figure: its value, what it is, and where it is printed."""

    key: str
    value: float
    unit: str
    figure: str
    reference: str
    url: str

    def line(self) -> str:
        return f"{self.figure}: {self.value:g} {self.unit} — {self.reference} <{self.url}>"


SOURCES: dict[str, Source] = {s.key: s for s in (
    Source("gpu_to_host", 64.0, "GB/s per GPU",
           "GPU→host copy (memory snapshot): PCIe Gen5 x16, 128 GB/s both directions, half each way",
           "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM 'Interconnect: PCIe Gen5 128 GB/s' "
           "(H200 SXM: PCIe Gen5 x16 too, MLCommons Inference v4.1 NVIDIA H200-SXM-141GBx8_TRT_MaxQ "
           "system description)", "https://www.nvidia.com/en-us/data-center/h100/"),
    Source("nic_per_gpu", 50.0, "GB/s per GPU",
           "replication and peer restore: one 400 Gb/s NIC per GPU (8 per node, 400 GB/s per node)",
           "The Llama 3 Herd of Models (Meta, 2024, arXiv:2407.21783) §3.3.1 Network: '400 Gbps "
           "interconnects between GPUs'; NVIDIA DGX BasePOD reference architecture, Core Components: "
           "DGX H100/H200 'eight single-port NVIDIA ConnectX-7 ... up to 400 Gb/s InfiniBand/Ethernet'",
           "https://arxiv.org/abs/2407.21783"),
    Source("storage_per_gpu", 2000.0 / 16384, "GB/s per GPU",
           "durable write and restore: 2 TB/s sustained storage throughput shared by 16,384 GPUs",
           "The Llama 3 Herd of Models (Meta, 2024, arXiv:2407.21783) §3.3.1 Storage: Tectonic, "
           "240 PB on 7,500 servers, 'sustainable throughput of 2 TB/s and a peak throughput of 7 TB/s'",
           "https://arxiv.org/abs/2407.21783"),
    Source("reinit_2048", 5.0, "s",
           "communicator initialisation of a 2,048-GPU job (used up to 2,048 GPUs)",
           "MegaScale: Scaling Large Language Model Training to More Than 10,000 GPUs (Jiang et al., "
           "NSDI '24), 'Collective Communication Group Initialization': 2,048 GPUs from 1,047 s to "
           "under 5 s", "https://www.usenix.org/conference/nsdi24/presentation/jiang-ziheng"),
    Source("reinit_10000", 30.0, "s",
           "communicator initialisation of a job of more than 10,000 GPUs (used above 2,048 GPUs)",
           "MegaScale (Jiang et al., NSDI '24), same section: 'more than 10,000 GPUs' under 30 s "
           "(its largest job: 12,288 GPUs; used as is at 16,384)",
           "https://www.usenix.org/conference/nsdi24/presentation/jiang-ziheng"),
)}
HARDWARE = {"memory_copy": "gpu_to_host", "peer_replication": "nic_per_gpu", "peer_restore": "nic_per_gpu",
            "durable_write": "storage_per_gpu", "durable_restore": "storage_per_gpu"}


def reinit_source(gpus: int) -> Source:
    """The cited communicator-initialisation time for a job of ``gpus`` GPUs (the next cited size up)."""
    return SOURCES["reinit_2048" if gpus <= 2048 else "reinit_10000"]


@dataclass(frozen=True)
class DrillScenario:
    """One recovery the drill measured: the tier its ranks restored from and its components (seconds)."""

    name: str
    restore_source: str | None
    components_s: Mapping[str, float]

    @property
    def fixed_s(self) -> float:
        """Detection + rendezvous + worker start + first step: what does not grow with the state."""
        return sum(float(self.components_s.get(c, 0.0)) for c in FIXED_COMPONENTS)


@dataclass(frozen=True)
class DrillReport:
    """The figures of ``foreshock drill --json`` that the projection uses (other keys are ignored)."""

    state_mb: float
    bandwidth_gb_s: Mapping[str, float]
    scenarios: Mapping[str, DrillScenario]
    origin: str = "drill"

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | Path) -> DrillReport:
        origin = "drill"
        if not isinstance(data, Mapping):
            origin = str(data)
            data = json.loads(Path(data).read_text())
        bandwidth = data.get("bandwidth_gb_per_s") or {}
        missing = [k for k in BANDWIDTHS
                   if not isinstance(bandwidth.get(k), int | float) or bandwidth[k] <= 0]
        if missing:
            raise ValueError(f"drill file has no positive bandwidth_gb_per_s for {', '.join(missing)}")
        scenarios = {}
        for entry in data.get("scenarios") or []:
            name, source = str(entry["name"]), entry.get("restore_source")
            components = {str(k): float(v) for k, v in (entry.get("components_seconds") or {}).items()}
            scenarios[name] = DrillScenario(name, None if source is None else str(source), components)
        absent = [name for name in SCENARIOS.values() if name not in scenarios]
        if absent:
            raise ValueError(f"drill file has no scenario {', '.join(absent)}")
        for name in SCENARIOS.values():
            scenario = scenarios[name]
            if not all(c in scenario.components_s for c in FIXED_COMPONENTS):
                raise ValueError(f"scenario {name}: components_seconds needs {', '.join(FIXED_COMPONENTS)}")
        return cls(float(data["state_mb"]), {k: float(bandwidth[k]) for k in BANDWIDTHS}, scenarios, origin)


@dataclass(frozen=True)
class PathTime:
    """Time to move one GPU's state along one path, and which bandwidth bounds it."""

    path: str
    seconds: float
    measured_gb_s: float
    cited: Source

    @property
    def bound(self) -> str:
        return "measured" if self.measured_gb_s <= self.cited.value else "cited"


@dataclass(frozen=True)
class Recovery:
    """One recovery at scale: the drill's fixed components + the restore + communicator initialisation."""

    scenario: str
    fixed_s: float
    restore: PathTime
    reinit: Source

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.restore.seconds + self.reinit.value


@dataclass(frozen=True)
class TierProjection:
    """A tiered job's costs at one cluster size, with where each figure came from.

    ``recoveries``: ``peer`` (unwarned failure), ``durable`` (pair loss), ``migration`` (warned).
    """

    gpus: int
    state_gb_per_gpu: float
    paths: Mapping[str, PathTime]
    recoveries: Mapping[str, Recovery]

    def tier_params(self) -> TierParams:
        """The tiers' costs; the pair-loss probability is left for the trace to give."""
        return TierParams(snapshot_s=self.paths["memory_copy"].seconds,
                          replicate_s=self.paths["peer_replication"].seconds,
                          durable_s=self.paths["durable_write"].seconds,
                          peer_recovery_s=self.recoveries["peer"].seconds,
                          durable_recovery_s=self.recoveries["durable"].seconds)

    def job_params(self, base: JobParams) -> JobParams:
        """``base`` (spares, refill) with these tiers and the projected warned migration."""
        return replace(base, migration_s=self.recoveries["migration"].seconds, tiers=self.tier_params())

    def sources(self) -> list[Source]:
        used = {p.cited.key: p.cited for p in self.paths.values()}
        used.update((r.reinit.key, r.reinit) for r in self.recoveries.values())
        return list(used.values())


def project(drill: DrillReport, state_gb_per_gpu: float, gpus: int) -> TierProjection:
    """The tiered job's costs for ``state_gb_per_gpu`` GB (1e9 bytes) of state on each of ``gpus`` GPUs.

    Paths scale with the state; the recoveries' fixed components and communicator initialisation
    do not. E.g. 0.4 GB restored from storage at 2 TB/s / 16,384 GPUs takes 3.28 s.
    """
    if state_gb_per_gpu <= 0 or gpus <= 0:
        raise ValueError("state_gb_per_gpu and gpus must be > 0")
    paths = {}
    for path in BANDWIDTHS:
        cited = SOURCES[HARDWARE[path]]
        measured = drill.bandwidth_gb_s[path]
        paths[path] = PathTime(path, state_gb_per_gpu / min(measured, cited.value), measured, cited)
    recoveries = {}
    for kind, name in SCENARIOS.items():
        recoveries[kind] = Recovery(name, drill.scenarios[name].fixed_s, paths[RESTORE_PATHS[kind]],
                                    reinit_source(gpus))
    return TierProjection(gpus, state_gb_per_gpu, paths, recoveries)
