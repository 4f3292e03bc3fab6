"""Feature declarations: names derive from parameters, the hash is stable and sensitive,
invalid specs are refused, and the default set covers every precursor the simulator injects."""

from __future__ import annotations

import pytest

from foreshock.features import DEFAULT_FEATURE_SET, Feature, FeatureSet, PeerFeature
from foreshock.features.kernels import AGGREGATIONS
from foreshock.features.spec import GPU_COUNTERS, field_kind
from foreshock.ingest.contract import LINK_COUNTERS

H = 3_600_000


def test_names_follow_parameters_and_are_lightgbm_safe():
    f = Feature("gpu", "gpu_temp", "gpus_above", 30 * 60_000, 85.5)
    assert f.name == "gpu_temp__gpus_above_85p5__30m"
    assert Feature("link", "symbol_error", "increase", H).name == "link_symbol_error__increase__1h"
    assert PeerFeature(Feature("gpu", "gpu_temp", "max", H), "z").name == "peer_z__gpu_temp__max__1h"
    for name in DEFAULT_FEATURE_SET.names:
        assert all(c.isalnum() or c == "_" for c in name), name


def test_hash_is_stable_and_changes_with_any_parameter():
    fs = DEFAULT_FEATURE_SET
    again = FeatureSet(fs.features, fs.peers, dict(fs.xid_classes), fs.bucket_ms, fs.live_ms, fs.version)
    assert again.hash == fs.hash and len(fs.hash) == 64
    first = fs.features[0]
    changed = [
        FeatureSet(fs.features, fs.peers, fs.xid_classes, version="2"),
        FeatureSet(
            # a window that no feature of the set has
            (Feature(first.source, first.field, first.agg, 17 * 60_000), *fs.features[1:]),
            (),
            fs.xid_classes,
        ),
        FeatureSet(fs.features, fs.peers, {**fs.xid_classes, "bus": (79, 999)}),
        FeatureSet(fs.features[::-1], fs.peers, fs.xid_classes),
    ]
    assert len({fs.hash, *(c.hash for c in changed)}) == 1 + len(changed)


@pytest.mark.parametrize(
    "feature, message",
    [
        (Feature("gpu", "gpu_temp", "increase", H), "does not apply"),
        (Feature("gpu", "no_such_field", "max", H), "unknown field"),
        (Feature("gpu", "gpu_temp", "max", 90_000), "multiple"),
        (Feature("gpu", "gpu_temp", "max", 8 * 24 * H), "7 days"),
        (Feature("gpu", "gpu_temp", "gpus_above", H), "threshold required"),
        (Feature("gpu", "gpu_temp", "max", H, 3.0), "threshold not allowed"),
        (Feature("xid", "nope", "count", H), "unknown Xid class"),
        (Feature("gpu", "gpu_temp", "median", H), "unknown aggregation"),
    ],
)
def test_invalid_specs_are_refused(feature, message):
    with pytest.raises(ValueError, match=message):
        FeatureSet((feature,), xid_classes={"bus": (79,)})


def test_duplicate_names_and_orphan_peers_are_refused():
    f = Feature("gpu", "gpu_temp", "max", H)
    with pytest.raises(ValueError, match="unique"):
        FeatureSet((f, f))
    with pytest.raises(ValueError, match="base feature"):
        FeatureSet((f,), (PeerFeature(Feature("gpu", "gpu_temp", "min", H), "z"),))


def test_every_aggregation_is_used_by_the_default_set():
    assert {f.agg for f in DEFAULT_FEATURE_SET.features} == set(AGGREGATIONS)


def test_default_set_covers_every_precursor_and_counter():
    names = " ".join(DEFAULT_FEATURE_SET.names)
    # precursors the simulator injects: ecc, thermal, nvlink, ib_link, power, pcie; plus Xid storms
    for needle in (
        "ecc_sbe",
        "ecc_dbe",
        "remapped_rows",
        "retired",
        "gpu_temp__slope",
        "memory_temp",
        "thermal_violation",
        "power_usage__std",
        "power_violation",
        "nvlink_crc",
        "nvlink_replay",
        "nvlink_recovery",
        "pcie_replay",
        "link_symbol_error",
        "link_link_downed",
        "link_state__ports_down",
        "xid_memory__count",
        "xid_bus__since",
        "peer_z__",
        "peer_rank__",
    ):
        assert needle in names, needle
    windows = {f.window_ms for f in DEFAULT_FEATURE_SET.features}
    assert min(windows) <= 10 * 60_000 and max(windows) == 24 * H
    for counter in [c for c in GPU_COUNTERS if c.startswith(("ecc_", "nvlink_", "pcie"))]:
        assert field_kind("gpu", counter) == "counter"
    assert set(LINK_COUNTERS) >= {f.field for f in DEFAULT_FEATURE_SET.features if f.source == "link"} - {
        "state"
    }


def test_select_keeps_peers_whose_base_survives():
    fs = DEFAULT_FEATURE_SET.select(
        ["gpu_temp__max__30m", "peer_z__gpu_temp__max__30m", "peer_z__gpu_temp__slope__2h"]
    )
    assert fs.names == ["gpu_temp__max__30m", "peer_z__gpu_temp__max__30m"]
