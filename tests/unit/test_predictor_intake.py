"""A poll taken a log at a time (``time_anomalies`` then ``PartitionState.take``, as the service does)
is the same as each message judged and added in turn (``time_anomaly`` then ``PartitionState.add``):
the same messages refused with the same reasons, the same effective times, progress, floors, cuts,
nodes out of service and first boundary. Random logs with late, early and far-off records, and
cuts replayed from a journal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.ingest.columns import record_columns
from foreshock.ingest.contract import GpuSample, NodeEvent, Topic, XidEvent, encode
from foreshock.predictor.held import HeldRecords
from foreshock.predictor.partition import PartitionState, time_anomalies, time_anomaly
from tests.unit.test_predictor_service import ENGINES, PERIOD

pytestmark = pytest.mark.timeout(300)

T0 = 1_735_689_600_000
M = 60_000
FUTURE, PAST = 5 * M, 2 * M


def _record(topic: str, node: str, ts: int, i: int):
    if topic == Topic.GPU:
        return GpuSample(node=node, ts=ts, gpu=i % 8, gpu_temp=40.0 + i % 50, ecc_sbe_vol_total=i)
    if topic == Topic.XID:
        return XidEvent(node=node, ts=ts, xid=79 if i % 2 else 48, gpu=None if i % 3 else i % 8)
    return NodeEvent(node=node, ts=ts, event=("failed", "repaired", "drained", "up")[i % 4])


# one message: its topic, its records' offsets from T0 (minutes, a few far off), its receipt
MESSAGE = st.tuples(
    st.sampled_from([Topic.GPU, Topic.GPU, Topic.XID, Topic.NODE_EVENTS]),
    st.lists(st.one_of(st.integers(-3, 30), st.sampled_from([-600, 400])), min_size=1, max_size=4),
    st.integers(-2, 30),
)
CUTS = st.lists(st.tuples(st.sampled_from([Topic.GPU, Topic.XID]), st.integers(0, 30), st.integers(0, 40)),
                max_size=3)


def _logs(messages):
    """Per topic, its messages in log order: (offset, records, receipt)."""
    out: dict[str, list] = {}
    for i, (topic, minutes, receipt) in enumerate(messages):
        log = out.setdefault(topic, [])
        records = [_record(topic, f"n{(i + j) % 3}", T0 + m * M + j, i + j) for j, m in enumerate(minutes)]
        log.append((len(log), records, T0 + receipt * M))
    return out


def _state(cuts) -> PartitionState:
    state = PartitionState(2, ENGINES.new(), PERIOD, lateness_ms=M)
    state.replay({"until": T0 + until * M, "cuts": {topic: offset}} for topic, offset, until in cuts)
    return state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MESSAGE, min_size=1, max_size=25), CUTS, st.integers(0, 4))
def test_a_poll_at_once_is_each_message_in_turn(messages, cuts, split):
    one, batched = _state(cuts), _state(cuts)
    reasons_one, reasons_batched = {}, {}
    for topic, log in _logs(messages).items():
        for offset, records, receipt in log:
            why = time_anomaly(one, topic, records, receipt, future_ms=FUTURE, past_ms=PAST)
            reasons_one[(topic, offset)] = why
            one.add(topic, offset, [] if why else records)
        for part in (log[:split], log[split:]):  # a log read in two polls
            if not part:
                continue
            counts = np.array([len(records) for _, records, _ in part])
            cols = record_columns(topic, [r for _, rs, _ in part for r in rs], batched.columns[topic])
            refused = time_anomalies(batched, topic, cols["ts"], counts, np.array([r for *_, r in part]),
                                     future_ms=FUTURE, past_ms=PAST)
            for i, (offset, _, _) in enumerate(part):
                reasons_batched[(topic, offset)] = refused.get(i)
            keep = ~np.repeat(np.isin(np.arange(len(part)), list(refused)), counts)
            counts[list(refused)] = 0
            offsets = np.array([o for o, _, _ in part])
            batched.take(topic, offsets, counts, {k: v[keep] for k, v in cols.items()})
    assert reasons_batched == reasons_one
    for topic in (Topic.GPU, Topic.XID, Topic.NODE_EVENTS):
        assert batched.held_times(topic) == one.held_times(topic)
    def clock(s: PartitionState) -> tuple:
        return s.progress, s.floors, s.positions, s.next_boundary, s.pending_cuts()

    assert clock(batched) == clock(one)
    moments = [T0 + m * M for m in range(0, 40, 5)]
    assert [batched.away_at(t) for t in moments] == [one.away_at(t) for t in moments]


def test_held_records_come_back_from_a_checkpoint_and_from_one_that_held_records():
    state = PartitionState(0, ENGINES.new(), PERIOD)
    gpu = [GpuSample(node="n1", ts=T0 + i, gpu=i, gpu_temp=50.0 + i) for i in range(3)]
    state.add(Topic.GPU, 0, gpu)
    state.add(Topic.XID, 0, [XidEvent(node="n1", ts=T0 + 5, xid=79)])
    back = PartitionState.restore(ENGINES.new(), state.meta(), PERIOD)
    taken, again = state._held.take(T0 + M), back._held.take(T0 + M)
    assert list(taken) == list(again) == [Topic.GPU, Topic.XID]
    for topic in taken:
        assert taken[topic][0].tolist() == again[topic][0].tolist()
        for name, col in taken[topic][1].items():
            assert np.array_equal(col, again[topic][1][name], equal_nan=col.dtype != object), name
    legacy = HeldRecords.restore([[Topic.GPU, T0 + 7, encode(gpu)]], state.columns)  # records, one time
    assert legacy.times(Topic.GPU) == [T0 + 7] * 3 and len(legacy) == 3
    with pytest.raises(ValueError, match="unknown topic"):
        HeldRecords.restore([["no.such.topic", T0, b"[]"]], state.columns)
