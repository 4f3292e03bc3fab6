"""A restart republishes the scores of a run that never stopped (on the in-memory bus; the same
against a real broker with kill -9: tests/integration/test_predictor_chaos.py).

What used to make a replay differ, each with its test: partitions checkpointed at different
moments resumed at different boundaries, and a boundary's peers came from whichever partitions
closed it in the same cycle; a log read to its end did not wait for a record that arrived late,
which a replay then found in the log; and "future" was judged by the wall clock, which has moved
on by the time of a replay.
"""

from __future__ import annotations

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import GpuSample, NodeEvent, Topic, XidEvent, partition_of
from foreshock.ingest.simulator import stream
from foreshock.ingest.stream import publish
from foreshock.predictor.checkpoint import CheckpointStore
from foreshock.predictor.partition import PartitionState, receipt_of, time_anomaly
from tests.fixtures.predictor import simulator
from tests.unit.test_predictor_service import ENGINES, PERIOD, by_key, drain, make_service

M = 60_000


def agree(*runs: list) -> dict[tuple[str, int], float]:
    """The union of the runs' scores; fails on a (node, ts) published with two values."""
    union: dict[tuple[str, int], float] = {}
    for scores in runs:
        for s in scores:
            key = (s.node, s.ts)
            assert union.setdefault(key, s.probability) == s.probability, f"{key}: two values"
    return union


def test_partitions_checkpointed_at_different_moments_replay_the_same_scores(risk_model_dir, tmp_path):
    sim = simulator(minutes=60)
    bus = InMemoryBus(partitions=4)
    stream(sim, bus)
    reference = by_key(drain(make_service(bus, risk_model_dir, tmp_path / "ref", group="ref")))
    first = make_service(bus, risk_model_dir, tmp_path / "run", group="run", max_records=7)
    part = {n: partition_of(n, 4) for n in sim.node_names}
    total = {p: sum(1 for n, _ in reference if part[n] == p) for p in range(4)}
    before: list = []
    saved: set[int] = set()
    while len(saved) < 4:  # each partition saved halfway through its own scores, at its own moment
        before += first.run_once()
        done = {p: sum(1 for s in before if part[s.node] == p) for p in range(4)}
        for p in sorted(set(range(4)) - saved):
            if done[p] >= total[p] // 2:
                first.checkpoint([p])
                saved.add(p)
    for _ in range(5):
        before += first.run_once()
    first._stream.consumer.close()  # the kill: what followed each partition's save is replayed
    store = CheckpointStore(tmp_path / "run" / "ckpt", ENGINES.load)
    resume = {p: store.load(p)[1]["next_boundary"] for p in range(4)}
    assert len(set(resume.values())) > 1, f"the partitions must resume at different boundaries: {resume}"
    after = drain(make_service(bus, risk_model_dir, tmp_path / "run", group="run", max_records=7))
    assert agree(before, after) == reference
    assert min(s.ts for s in after) < max(s.ts for s in before), "the restart replayed nothing"


def test_a_record_that_came_after_its_boundary_closed_counts_where_it_did_before_the_crash(
        risk_model_dir, tmp_path):
    """The node-event log is read to its end when boundary T closes; then a drain dated before T
    arrives. The running service, which has scored the node at T, counts it from the next boundary
    on; a replay finds it in the log before T closes, and without the journal's cut would not score
    the node at T."""
    sim = simulator(minutes=40)
    bus = InMemoryBus(partitions=2)
    node = sim.node_names[0]
    t20, t30 = sim.start_ms + 20 * M, sim.start_ms + 30 * M
    late_for = -(-(t30 - 5 * M) // PERIOD) * PERIOD  # the last boundary closed when the Xid arrives
    drained = NodeEvent(node=node, ts=late_for - 30_000, event="drained")
    first = make_service(bus, risk_model_dir, tmp_path / "run", group="run")
    scores: list = []

    def live(ts: int) -> None:
        if ts == t20:
            scores.extend(drain(first))
            first.checkpoint()  # what a restart resumes from
        if ts == t30:
            scores.extend(drain(first))
            assert (node, late_for) in by_key(scores), "the event's boundary has closed before it arrives"
            publish(bus, [drained])
            scores.extend(drain(first))

    stream(sim, bus, on_step=live)
    scores += drain(first)
    first._stream.consumer.close()  # killed: no checkpoint since t20
    replayed = drain(make_service(bus, risk_model_dir, tmp_path / "run", group="run"))
    assert min(s.ts for s in replayed) <= late_for
    assert agree(scores, replayed) == by_key(scores)
    assert not {ts for n, ts in by_key(scores) if n == node and ts > late_for}  # drained from then on
    # the test can fail: a service that reads the same log from scratch, with no journal, does not
    # score the node at T
    fresh = by_key(drain(make_service(bus, risk_model_dir, tmp_path / "fresh", group="fresh")))
    assert (node, late_for - PERIOD) in fresh and (node, late_for) not in fresh


def test_the_journal_survives_a_torn_line_and_a_checkpoint_starts_it_afresh(tmp_path):
    store = CheckpointStore(tmp_path, ENGINES.load)
    store.journal(3, {"until": 10, "cuts": {Topic.XID: 4}})
    store.journal(3, {"until": 20, "cuts": {Topic.XID: 4, Topic.NODE_EVENTS: 0}})
    with open(tmp_path / "p0003" / "journal", "ab") as fh:
        fh.write(b'{"until": 30, "cu')  # a write that never returned
    assert [e["until"] for e in store.journaled(3)] == [10, 20]
    state = PartitionState(3, ENGINES.new(), PERIOD)
    state.replay(store.journaled(3))
    state.add(Topic.XID, 3, [XidEvent(node="n", ts=5, xid=79)])  # before the cuts' offset: as it is
    state.add(Topic.XID, 4, [XidEvent(node="n", ts=6, xid=79)])  # at it: after the later cut
    assert state.held_times(Topic.XID) == [5, 21]
    assert state.pending_cuts() == [{"until": 20, "cuts": {Topic.NODE_EVENTS: 0}}]
    store.save(3, state.engine, state.meta())
    assert store.journaled(3) == []
    _, meta = store.load(3)
    again = PartitionState.restore(ENGINES.new(), meta, PERIOD)
    again.add(Topic.NODE_EVENTS, 0, [])
    assert again.floors == {Topic.XID: 21, Topic.NODE_EVENTS: 21}


def test_a_cut_is_made_only_for_a_log_that_could_still_bring_an_earlier_record():
    state = PartitionState(1, ENGINES.new(), PERIOD)
    t0 = 1_735_689_600_000
    state.add(Topic.GPU, 0, [GpuSample(node="n", ts=t0 + 11 * M, gpu=0)])
    state.add(Topic.XID, 7, [XidEvent(node="n", ts=t0 + 2 * M, xid=79)])
    state.close(t0 + 10 * M)
    lag = {(Topic.GPU, 1): 5, (Topic.XID, 1): 0, (Topic.LINK, 1): 0}
    entry = state.cut((Topic.GPU, Topic.XID, Topic.LINK), lag)
    # the GPU log has unread records (they come after what closed); the Xid and link logs are read
    # to their end, one with an old newest record, one with none yet
    assert entry == {"until": t0 + 10 * M, "cuts": {Topic.XID: 8, Topic.LINK: 0}}
    assert state.cut((Topic.GPU, Topic.XID, Topic.LINK), lag) is None  # nothing new
    state.add(Topic.XID, 8, [XidEvent(node="n", ts=t0 + 9 * M, xid=79)])
    assert state.held_times(Topic.XID) == [t0 + 10 * M + 1]  # after T


def test_future_is_judged_by_the_log_time_that_a_replay_reads_again():
    state = PartitionState(0, ENGINES.new(), PERIOD)
    t0 = 1_735_689_600_000
    record = GpuSample(node="n", ts=t0 + 6 * M, gpu=0)
    check = lambda receipt: time_anomaly(state, Topic.GPU, [record], receipt,  # noqa: E731
                                         future_ms=5 * M, past_ms=M)
    # refused when it was produced (log time t0), and again by a replay an hour later
    assert "after its receipt" in check(receipt_of(t0, clock_ms=t0))
    assert "after its receipt" in check(receipt_of(t0, clock_ms=t0 + 60 * M))
    # a producer's clock ahead of the service's does not let it in: the service's clock caps
    assert "after its receipt" in check(receipt_of(t0 + 60 * M, clock_ms=t0))
    assert check(receipt_of(None, clock_ms=t0 + 60 * M)) is None  # no log time (in-memory bus)
