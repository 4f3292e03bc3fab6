"""Foreshocks: present before detectable failures, absent before the others, for every precursor kind."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from foreshock.ingest.simulator import PRECURSORS, Simulator, parse_profile

MINUTE = 60_000


def one_cause_profile(kind: str):
    """Every failure is of one kind, half of them detectable, lead 60-120 min; no other noise sources."""
    return parse_profile(
        {
            "cluster": {
                "gpus_per_node": 8,
                "interruptions_per_gpu_day": 0.08,
                "repair_median_hours": 1.0,
                "repair_sigma": 0.3,
            },
            "failure": [
                {
                    "cause": f"{kind}_fault",
                    "share": 1.0,
                    "xid": [79],
                    "precursor": kind,
                    "lead_minutes": [60, 120],
                    "detectable": 0.5,
                    "scope": "node" if kind == "power" else "gpu",
                }
            ],
            "noise": {
                "benign_xid_per_gpu_day": 0.01,
                "false_alarms_per_failure": 0.0,
                "noisy_gpu_fraction": 0.0,
            },
        },
        kind,
    )


def rise(column: str) -> Callable[[pd.DataFrame, pd.DataFrame], float]:
    return lambda last, _: float(last[column].iloc[-1] - last[column].iloc[0])


# signal of each kind: (last 15 min before the failure, 30 min long before any foreshock) -> value
SIGNALS: dict[str, tuple[str, Callable[[pd.DataFrame, pd.DataFrame], float], float, float]] = {
    # kind: (table, signal, at least this before detectable, at most this before undetectable)
    "ecc": ("gpu", rise("ecc_sbe_vol_total"), 20, 2),
    "nvlink": ("gpu", rise("nvlink_crc_flit_error_count_total"), 10, 1),
    "pcie": ("gpu", rise("pcie_replay_counter"), 5, 1),
    "thermal": ("gpu", lambda last, ref: float(last.gpu_temp.mean() - ref.gpu_temp.mean()), 4.0, 3.0),
    "power": ("gpu", lambda last, _: float((last.clocks_event_reasons & 0x80 > 0).sum()), 1, 0),
    "ib_link": ("link", rise("symbol_error"), 50, 12),  # healthy links see a few bursts of symbol errors
}


def test_every_precursor_kind_has_a_signal_check():
    assert set(SIGNALS) == set(PRECURSORS) - {"none"}


@pytest.mark.parametrize("kind", sorted(SIGNALS))
def test_foreshock_before_detectable_failures_only(kind):
    sim = Simulator(
        one_cause_profile(kind), nodes=8, duration_ms=3 * 1440 * MINUTE, interval_ms=30_000, seed=3
    )
    table_name, signal, present, absent = SIGNALS[kind]
    data = pa.concat_tables([getattr(c, table_name) for c in sim.chunks()]).to_pandas()
    seen = {True: [], False: []}
    for f in sim.schedule.failures:
        unit = f.gpu if f.gpu is not None else 0
        mine = data[
            (data.node == sim.node_names[f.node])
            & ((data.gpu == unit) if table_name == "gpu" else (data.port == f"mlx5_{unit}/1"))
        ]
        last = mine[(mine.ts >= f.ts - 15 * MINUTE) & (mine.ts < f.ts)]
        ref = mine[(mine.ts >= f.ts - 150 * MINUTE) & (mine.ts < f.ts - 120 * MINUTE)]
        if len(last) < 20 or len(ref) < 20:  # the node was down then (an earlier failure)
            continue
        seen[f.detectable].append(signal(last, ref))
    assert len(seen[True]) >= 3 and len(seen[False]) >= 3, seen
    assert min(seen[True]) >= present, seen
    assert max(seen[False]) <= absent, seen


def test_foreshock_grows_towards_the_failure():
    sim = Simulator(
        one_cause_profile("ecc"), nodes=8, duration_ms=3 * 1440 * MINUTE, interval_ms=30_000, seed=3
    )
    gpu = pa.concat_tables([c.gpu for c in sim.chunks()]).to_pandas()
    for f in (f for f in sim.schedule.failures if f.detectable):
        mine = gpu[(gpu.node == sim.node_names[f.node]) & (gpu.gpu == f.gpu)]
        lead = f.ts - f.precursor_start_ms
        early = mine[(mine.ts >= f.precursor_start_ms) & (mine.ts < f.precursor_start_ms + lead // 2)]
        late = mine[(mine.ts >= f.ts - lead // 2) & (mine.ts < f.ts)]
        early_rise = early.ecc_sbe_vol_total.iloc[-1] - early.ecc_sbe_vol_total.iloc[0]
        late_rise = late.ecc_sbe_vol_total.iloc[-1] - late.ecc_sbe_vol_total.iloc[0]
        assert late_rise > 2 * early_rise


def test_noise_sources_exist_on_healthy_nodes():
    """Healthy GPUs still show benign Xids, corrected errors on noisy parts and false-alarm foreshocks."""
    profile = parse_profile(
        {
            "cluster": {"gpus_per_node": 8, "interruptions_per_gpu_day": 0.02},
            "failure": [
                {
                    "cause": "ecc_fault",
                    "share": 1.0,
                    "xid": [48],
                    "precursor": "ecc",
                    "lead_minutes": [60, 120],
                    "detectable": 1.0,
                }
            ],
            "noise": {
                "benign_xid_per_gpu_day": 0.5,
                "false_alarms_per_failure": 3.0,
                "noisy_gpu_fraction": 0.1,
            },
        },
        "noisy",
    )
    sim = Simulator(profile, nodes=16, duration_ms=1440 * MINUTE, interval_ms=60_000, seed=9)
    chunks = list(sim.chunks())
    xid = pa.concat_tables([c.xid for c in chunks]).to_pandas()
    gpu = pa.concat_tables([c.gpu for c in chunks]).to_pandas()
    failed_nodes = {sim.node_names[f.node] for f in sim.schedule.failures}
    healthy = gpu[~gpu.node.isin(failed_nodes)]
    assert set(xid.xid) & {13, 31, 43}
    sbe = healthy.groupby(["node", "gpu"]).ecc_sbe_vol_total.max()
    assert (sbe > 0).sum() >= 2
    assert np.isfinite(healthy.gpu_temp).all()
    # false alarms: a real-looking burst of corrected errors that stops, with no failure after it
    alarms = [
        a
        for a in sim.schedule.episodes
        if not a.failure
        and sim.node_names[a.node] not in failed_nodes
        and a.end_ms + (a.end_ms - a.start_ms) < sim.end_ms
    ]
    assert len(alarms) >= 3
    for a in alarms:
        mine = (
            gpu[(gpu.node == sim.node_names[a.node]) & (gpu.gpu == a.gpu)].set_index("ts").ecc_sbe_vol_total
        )
        length = a.end_ms - a.start_ms
        during = mine.loc[a.start_ms : a.end_ms]
        after = mine.loc[a.end_ms : a.end_ms + length]
        rise_during, rise_after = during.iloc[-1] - during.iloc[0], after.iloc[-1] - after.iloc[0]
        assert rise_during >= 10 and rise_after < rise_during / 5, (a, rise_during, rise_after)


def test_links_flap_only_in_the_run_up_to_a_link_failure():
    sim = Simulator(
        one_cause_profile("ib_link"), nodes=8, duration_ms=3 * 1440 * MINUTE, interval_ms=30_000, seed=3
    )
    link = pa.concat_tables([c.link for c in sim.chunks()]).to_pandas()
    down = link[link.state == "DOWN"]
    assert set(link.state) == {"ACTIVE", "DOWN"} and len(down) >= 3
    windows = [
        (sim.node_names[f.node], f"mlx5_{f.gpu}/1", f.precursor_start_ms, f.ts)
        for f in sim.schedule.failures
        if f.detectable
    ]
    for row in down.itertuples():
        assert any(n == row.node and p == row.port and a <= row.ts < b for n, p, a, b in windows), row
        assert row.link_downed >= 1
