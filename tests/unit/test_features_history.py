"""A node's history (its failures and returns to service) in both engines.

The random parity streams (test_features_parity) and the reference definitions
(test_features_reference) cover the history aggregations over minutes; these pin down what they
are for, over weeks: a failure before a return still counts after it (the window reset is about
telemetry bursts, not history), the online engine agrees with the batch engine over 40 days of
sparse telemetry while it forgets what no window reaches any more, a duplicate or late event
counts once and still counts, and the state travels in the risk service's checkpoints.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foreshock.features.batch import compute_features
from foreshock.features.history import EventLog
from foreshock.features.online import OnlineFeatureEngine
from foreshock.features.spec import Feature, FeatureSet
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.engines import OnlineEngines
from tests.unit.test_features_parity import assert_same

M = 60_000
H = 60 * M
D = 24 * H
T0 = 1_767_225_600_000  # 2026-01-01, a bucket boundary
FS = FeatureSet(
    (
        Feature("gpu", "ecc_sbe_vol_total", "increase", 30 * M),
        Feature("node", "failed", "count", 7 * D),
        Feature("node", "failed", "count", 30 * D),
        Feature("node", "returned", "since", 30 * D),
    )
)
FAILS = [(1, "a"), (20, "a"), (33, "a"), (36, "b")]  # (day, node): each at 10:00, back at 12:00


def _gpu(days: int = 40) -> pd.DataFrame:
    """Nodes a and b, one sample every 5 minutes; an SBE burst 20 minutes before each failure."""
    ts = T0 + np.arange(0, days * D, 5 * M)
    frames = []
    for node in ("a", "b"):
        sbe = np.full(len(ts), 100.0)
        for day, who in FAILS:
            if who == node:
                sbe[ts >= T0 + day * D + 9 * H + 40 * M] += 50  # the burst (cumulative)
        frames.append(pd.DataFrame({"node": node, "ts": ts + 1_000, "gpu": 0, "ecc_sbe_vol_total": sbe}))
    return pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable", ignore_index=True)


def _events() -> pd.DataFrame:
    rows = []
    for day, node in FAILS:
        rows.append((node, T0 + day * D + 10 * H, "failed"))
        rows.append((node, T0 + day * D + 12 * H, "repaired"))
    rows.append(("b", T0 + 2 * D, "drained"))  # Foreshock's own drain is not a failure
    rows.append(("b", T0 + 3 * D, "up"))
    return pd.DataFrame(rows, columns=["node", "ts", "event"])


def _row(table: pd.DataFrame, node: str, t: int) -> pd.Series:
    return table[(table["node"] == node) & (table["ts"] == t)].iloc[0]


def test_a_failure_before_a_return_still_counts_after_it():
    table = compute_features(gpu=_gpu(3), events=_events(), feature_set=FS, cadence_ms=10 * M)
    before = _row(table, "a", T0 + 1 * D + 10 * H)  # the failure at 10:00 is not seen yet
    assert before["ecc_sbe_vol_total__increase__30m"] == 50.0
    assert before["node_failed__count__7d"] == 0.0
    after = _row(table, "a", T0 + 1 * D + 13 * H)  # back at 12:00: the burst is gone, the failure is not
    assert after["ecc_sbe_vol_total__increase__30m"] == 0.0
    assert after["node_failed__count__7d"] == 1.0
    assert after["node_failed__count__30d"] == 1.0
    assert after["node_returned__since__30d"] == 3600.0
    untouched = _row(table, "b", T0 + 1 * D + 13 * H)
    assert untouched["node_failed__count__30d"] == 0.0 and np.isnan(untouched["node_returned__since__30d"])
    b_later = _row(table, "b", T0 + 2 * D + 13 * H)
    assert b_later["node_failed__count__30d"] == 0.0, "a drain is not a failure"


def test_windows_of_a_week_and_a_month_count_the_failures_they_hold():
    table = compute_features(gpu=_gpu(), events=_events(), feature_set=FS, cadence_ms=6 * H)
    a = table[table["node"] == "a"].set_index("ts")
    at = T0 + 34 * D  # a failed on days 1, 20 and 33
    assert a.loc[at, "node_failed__count__7d"] == 1.0
    assert a.loc[at, "node_failed__count__30d"] == 2.0  # day 1 is 33 days back
    assert a.loc[at, "node_returned__since__30d"] == pytest.approx((D - 12 * H) / 1000)
    assert a.loc[T0 + 32 * D, "node_failed__count__7d"] == 0.0


@pytest.mark.parametrize("events_late", [False, True])
def test_the_online_engine_agrees_over_forty_days_and_forgets_what_no_window_reaches(tmp_path, events_late):
    gpu, events = _gpu(), _events()
    events = pd.concat([events, events.iloc[:3]], ignore_index=True)  # redelivered: counts once
    batch = compute_features(gpu=gpu, events=events, feature_set=FS, cadence_ms=6 * H)
    engine = OnlineFeatureEngine(FS, tolerance_ms=0, history_ms=D)  # reads back to the day's start
    store = CheckpointStore(tmp_path, OnlineEngines(FS).load)
    for day in range(40):
        lo, hi = T0 + day * D, T0 + (day + 1) * D
        todays = events[(events["ts"] >= lo) & (events["ts"] < hi)]
        if not events_late:
            engine.update_frame("events", todays)
        engine.update_frame("gpu", gpu[(gpu["ts"] >= lo) & (gpu["ts"] < hi)])
        if events_late:  # after the day's telemetry has moved the frontier past them
            engine.update_frame("events", todays)
        if day % 9 == 4:  # the risk service's checkpoint, then a restart from it
            store.save(0, engine, {})
            engine, _ = store.load(0)
        for t in range(hi - 18 * H, hi + 1, 6 * H):
            want = batch[batch["ts"] == t].reset_index(drop=True)
            assert_same(engine.features_at(t), want, FS.names, f"day {day}, {(t - lo) / H:g} h")
    held = engine._history  # after day 40, only the failures of the last 30 days (and a bit) remain
    assert len(held) == 6 and held.ts.min() > T0 + 9 * D, held


def test_the_event_log_counts_each_event_once_in_any_order():
    log = EventLog.of(np.array([1, 0, 1, 1]), np.array([0, 0, 0, 1]), np.array([30, 10, 20, 5]))
    log = log.add(np.array([1]), np.array([0]), np.array([20]))  # again
    node, t = np.array([0, 1, 1, 2]), np.array([100, 25, 100, 100])
    assert log.before(0, node, t).tolist() == [1, 1, 2, 0]
    assert log.before(1, node, t).tolist() == [0, 1, 1, 0]
    assert log.last_before(0, node, t)[:3].tolist() == [10, 20, 30]
    assert log.since(20).ts.tolist() == [20, 30]
