"""A node's windows start afresh when it comes back into service, in both engines.

The random parity streams (test_features_parity) prove the engines agree with returns in the
stream; these pin down what the cut means on a hand-made case: the burst before a repair is
gone from the rows after it, the rows before it still show it, and a set without the cut keeps it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.features.batch import compute_features
from foreshock.features.online import OnlineFeatureEngine
from foreshock.features.returns import NO_FLOOR, window_floors
from tests.unit.test_features_parity import assert_same

M = 60_000
T0 = 1_767_225_600_000  # 2026-01-01, a bucket boundary
FS = DEFAULT_FEATURE_SET.select(["ecc_sbe_vol_total__increase__30m", "gpu_temp__max__30m"])
RETURN = T0 + 20 * M + 30_000  # mid-bucket: the windows start at the next bucket, T0 + 21m


def _gpu() -> pd.DataFrame:
    """One node, a sample a minute for 40 minutes; an SBE burst (+50) and a hot GPU (90 C) at 10m."""
    minutes = np.arange(40)
    return pd.DataFrame(
        {
            "node": "a",
            "ts": T0 + minutes * M + 1_000,
            "gpu": 0,
            "ecc_sbe_vol_total": np.where(minutes >= 10, 150.0, 100.0),
            "gpu_temp": np.where(minutes == 10, 90.0, 60.0),
        }
    )


EVENTS = pd.DataFrame(
    {"node": ["a", "a"], "ts": [T0 + 10 * M + 2_000, RETURN], "event": ["failed", "repaired"]}
)


def _at(table: pd.DataFrame, minute: int) -> pd.Series:
    return table.set_index("ts").loc[T0 + minute * M]


def test_rows_after_a_return_no_longer_see_the_burst_before_it():
    table = compute_features(gpu=_gpu(), events=EVENTS, feature_set=FS, cadence_ms=M)
    before = _at(table, 20)
    assert before["ecc_sbe_vol_total__increase__30m"] == 50.0
    assert before["gpu_temp__max__30m"] == 90.0
    assert T0 + 21 * M not in set(table["ts"]), "nothing sent since the return: no row yet"
    after = _at(table, 22)  # reads the bucket of 21m only
    assert after["ecc_sbe_vol_total__increase__30m"] == 0.0
    assert after["gpu_temp__max__30m"] == 60.0

    kept = compute_features(
        gpu=_gpu(), events=EVENTS, feature_set=dataclasses.replace(FS, reset_on_return=False), cadence_ms=M
    )
    assert _at(kept, 22)["ecc_sbe_vol_total__increase__30m"] == 50.0
    assert dataclasses.replace(FS, reset_on_return=False).hash != FS.hash


@pytest.mark.parametrize("event_first", [True, False])
def test_the_online_engine_cuts_the_same_windows_even_when_the_return_arrives_late(event_first):
    batch = compute_features(gpu=_gpu(), events=EVENTS, feature_set=FS, cadence_ms=M)
    engine = OnlineFeatureEngine(FS, tolerance_ms=0, history_ms=40 * M)  # reads back to 20m
    if event_first:
        engine.update_frame("events", EVENTS)
    engine.update_frame("gpu", _gpu())  # the frontier passes the return
    if not event_first:
        engine.update_frame("events", EVENTS)
    for minute in (20, 22, 35, 40):
        t = T0 + minute * M
        want = batch[batch["ts"] == t].reset_index(drop=True)
        assert_same(engine.features_at(t), want, FS.names, f"{minute} min")


def test_a_tick_sees_the_returns_before_it_and_starts_at_the_next_whole_bucket():
    ticks = np.array([T0 + 20 * M, T0 + 21 * M, T0 + 22 * M])
    node = np.array([0, 0, 1])
    ts = np.array([T0 + 20 * M, T0 + 5 * M + 1, T0 + 21 * M - 1])  # node 0: two returns
    floors = window_floors(node, ts, 3, ticks, M)
    b = T0 // M
    assert floors[0].tolist() == [b + 6, b + 20, b + 20]  # the one at 20m counts from tick 21m
    assert floors[1].tolist() == [NO_FLOOR, b + 21, b + 21]  # 1 ms before 21m: seen at 21m
    assert (floors[2] == NO_FLOOR).all()
