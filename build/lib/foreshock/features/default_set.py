"""The feature set Foreshock ships: one or more features for every precursor in ``reference/``.

Precursors (``ecc``, ``thermal``, ``power``, ``nvlink``, ``pcie``, ``ib_link``, Xid storms)
each get short windows (the burst that precedes a failure) and long ones (the baseline a burst
stands out against); peer features compare each node with the cluster at the same tick. The error
counters are counted over 5-10, 20-30 and 60 minutes: a foreshock keeps accelerating until the
failure while a harmless transient of the same size peaks and fades, and only the last minutes
set against the last half hour show which one is under way (the half hour also holds several
times the counts of five minutes, so it is the steadier estimate of the current rate).

Xid classes follow the NVIDIA catalogue (``reference/xid_catalog.csv``): memory (ECC, page
retirement and row remapping), nvlink, bus (79: fallen off the bus), gsp/fatal (GPU stopped,
GSP and micro-controller errors), application (faults usually caused by the job); any other
code counts as ``other``. Changing any of this changes :attr:`FeatureSet.hash`.
"""

from __future__ import annotations

from typing import Final

from foreshock.features.spec import Feature, FeatureSet, PeerFeature

__all__ = ["DEFAULT_FEATURE_SET", "XID_CLASSES", "risk_direction", "RISK_DIRECTIONS"]

M: Final = 60_000
H: Final = 60 * M

XID_CLASSES: Final[dict[str, tuple[int, ...]]] = {
    "memory": (48, 63, 64, 92, 94, 95, 140, 156),
    "nvlink": (74, 136, 144, 145, 146, 147, 148, 149, 150, 155),
    "bus": (79,),
    "fatal": (46, 61, 62, 109, 110, 119, 120, 143, 158),
    "application": (8, 13, 31, 43, 45),
}


def _gpu(field: str, agg: str, *windows: int, threshold: float | None = None) -> list[Feature]:
    return [Feature("gpu", field, agg, w, threshold) for w in windows]


def _link(field: str, agg: str, *windows: int) -> list[Feature]:
    return [Feature("link", field, agg, w) for w in windows]


_FEATURES: Final = [
    # ECC and memory health
    *_gpu("ecc_sbe_vol_total", "increase", 5 * M, 10 * M, 20 * M, 30 * M, H, 6 * H),
    *_gpu("ecc_sbe_vol_total", "gpus_increasing", H, threshold=0),
    *_gpu("ecc_dbe_vol_total", "increase", H, 24 * H),
    *_gpu("ecc_sbe_agg_total", "increase", 24 * H),
    *_gpu("retired_sbe", "increase", 24 * H),
    *_gpu("retired_dbe", "increase", 24 * H),
    *_gpu("retired_pending", "max", H),
    *_gpu("correctable_remapped_rows", "increase", 10 * M, 30 * M, H, 24 * H),
    *_gpu("uncorrectable_remapped_rows", "increase", H, 24 * H),
    *_gpu("row_remap_pending", "max", H),
    *_gpu("row_remap_failure", "max", H),
    # thermal
    *_gpu("gpu_temp", "last", 5 * M),
    *_gpu("gpu_temp", "max", 30 * M),
    *_gpu("gpu_temp", "mean", 30 * M),
    *_gpu("gpu_temp", "std", 30 * M),
    # one GPU hotter than its siblings (a failing thermal interface): the workload moves them together
    *_gpu("gpu_temp", "spread", 10 * M),
    *_gpu("gpu_temp", "slope", 30 * M, 2 * H),
    *_gpu("gpu_temp", "gpus_above", 30 * M, threshold=85),
    *_gpu("memory_temp", "max", 30 * M),
    *_gpu("memory_temp", "slope", 2 * H),
    *_gpu("thermal_violation", "increase", H),
    # clock-event bitmask: 0x1 alone is "GPU idle"; any value above 1 means a throttle reason is set
    *_gpu("clocks_event_reasons", "gpus_above", 10 * M, threshold=1),
    *_gpu("sm_clock", "min", 30 * M),
    # power
    *_gpu("power_usage", "mean", 30 * M),
    *_gpu("power_usage", "max", 30 * M),
    *_gpu("power_usage", "std", 30 * M),
    *_gpu("power_violation", "increase", H),
    # NVLink and PCIe
    *_gpu("nvlink_crc_flit_error_count_total", "increase", 5 * M, 10 * M, 20 * M, 30 * M, H, 6 * H),
    *_gpu("nvlink_crc_data_error_count_total", "increase", 10 * M, 20 * M, 30 * M, H),
    *_gpu("nvlink_replay_error_count_total", "increase", 10 * M, 20 * M, 30 * M, H),
    *_gpu("nvlink_recovery_error_count_total", "increase", H),
    *_gpu("pcie_replay_counter", "increase", 10 * M, 20 * M, 30 * M, H, 6 * H),
    # InfiniBand links
    *_link("symbol_error", "increase", 5 * M, 10 * M, 20 * M, 30 * M, H, 6 * H),
    *_link("link_error_recovery", "increase", H, 6 * H),
    *_link("link_downed", "increase", 6 * H),
    *_link("port_rcv_errors", "increase", 10 * M, 20 * M, 30 * M, H),
    *_link("port_rcv_remote_physical_errors", "increase", H),
    *_link("local_link_integrity_errors", "increase", H),
    *_link("state", "ports_down", 10 * M),
    # context
    *_gpu("gpu_util", "mean", 30 * M),
    # Xid events by class
    *[
        Feature("xid", cls, agg, w)
        for cls in (*XID_CLASSES, "other")
        for agg, w in (("count", H), ("count", 24 * H), ("since", 24 * H))
    ],
]

_BY_NAME: Final = {f.name: f for f in _FEATURES}
_PEERS: Final = [
    *[
        PeerFeature(_BY_NAME[n], "z")
        for n in (
            "gpu_temp__max__30m",
            "gpu_temp__slope__2h",
            "power_usage__mean__30m",
            "ecc_sbe_vol_total__increase__1h",
            "link_symbol_error__increase__1h",
        )
    ],
    *[
        PeerFeature(_BY_NAME[n], "rank")
        for n in (
            "gpu_temp__max__30m",
            "ecc_sbe_vol_total__increase__1h",
            "pcie_replay_counter__increase__1h",
        )
    ],
]

DEFAULT_FEATURE_SET: Final = FeatureSet(tuple(_FEATURES), tuple(_PEERS), XID_CLASSES, version="1")


def risk_direction(feature: Feature | PeerFeature) -> int:
    """+1 where a higher value can only mean a node closer to failure, -1 where a lower one does,
    0 where it can mean either: the monotone constraint the trees are trained under.

    Error counts, error Xids, GPUs or ports in trouble and every temperature statistic except
    ``std`` are evidence (+1); a lower SM clock is throttling (-1). The workload (power,
    utilisation), ``std`` (how much the samples vary), application Xids (usually the job's own
    faults) and the time since an Xid are left free. A peer feature points where its base does.
    """
    f = feature.base if isinstance(feature, PeerFeature) else feature
    if f.source == "xid":
        return 0 if f.field == "application" or f.agg == "since" else 1
    if f.agg == "std" or f.field in ("power_usage", "gpu_util"):
        return 0
    if f.field == "sm_clock":
        return -1
    if f.field in ("gpu_temp", "memory_temp"):
        return 1
    return 1 if f.agg in ("increase", "gpus_increasing", "gpus_above", "max", "ports_down") else 0


RISK_DIRECTIONS: Final[dict[str, int]] = {
    p.name: risk_direction(p) for p in (*DEFAULT_FEATURE_SET.features, *DEFAULT_FEATURE_SET.peers)
}
""":func:`risk_direction` of every column of the default set, by name."""
