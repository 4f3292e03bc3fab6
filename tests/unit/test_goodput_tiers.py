"""The tiered checkpoint job model: the replay against its closed form, hand timelines, the
pair-loss estimate and the Young/Daly intervals of each tier."""

from __future__ import annotations

import doctest
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import foreshock.models.goodput.tiers
from foreshock.models.goodput import (
    FailureTrace,
    JobParams,
    OperatingPoint,
    TierParams,
    ettr_tiered,
    from_profile,
    load_infinitehbd,
    pair_loss_probability,
    run_strategies,
    simulate,
    tier_intervals,
)
from foreshock.models.goodput.tiers import MAX_DURABLE_EVERY, ettr_tiered_with_prediction
from foreshock.models.reliability import daly_interval_seconds, mitigation_success_probability

from .test_goodput_simulate import exponential_trace, hand_trace

INFINITEHBD = Path(__file__).resolve().parents[2] / "datasets" / "traces" / "infinitehbd" / "fault_trace.json"


@pytest.mark.parametrize("mtbf_h, snapshot_s, durable_s, peer_s, durable_recovery_s, q", [
    (3.0, 1.0, 60.0, 60.0, 600.0, 0.05),     # frequent pair losses: the durable tier matters
    (3.0, 0.1, 3.0, 40.0, 60.0, 1e-3),       # a 16k-GPU-like job with a fast memory tier
    (1.0, 5.0, 120.0, 300.0, 1800.0, 0.2),   # slow tiers, many failures
    (2.0, 2.0, 30.0, 120.0, 900.0, 1.0),     # every failure takes both copies
    (14.4, 0.5, 30.0, 90.0, 900.0, 0.0),     # no pair losses: the durable tier never used
])
def test_tiered_replay_agrees_with_the_closed_form(mtbf_h, snapshot_s, durable_s, peer_s, durable_recovery_s,
                                                    q):
    tiers = TierParams(snapshot_s, 0.0, durable_s, peer_s, durable_recovery_s, q)
    mtbf = mtbf_h * 3600
    interval, every = tier_intervals(tiers, mtbf)
    trace = exponential_trace(mtbf, 20_000, seed=int(mtbf_h * 10))
    result = simulate(trace, interval, JobParams(tiers=tiers), durable_every=every)
    expected = ettr_tiered(interval, every, tiers, trace.mtbf_s)
    assert result.ettr == pytest.approx(expected, rel=0.01)
    assert 1 - result.ettr == pytest.approx(1 - expected, rel=0.03)  # the lost share too, not just ETTR
    expected_losses = q * len(trace)  # binomial: within 4 standard deviations
    assert abs(result.pair_losses - expected_losses) <= 4 * math.sqrt(expected_losses * (1 - q)) + 1


def test_tiered_replay_with_prediction_agrees_with_the_first_order_closed_form():
    trace = exponential_trace(3 * 3600.0, 20_000, seed=4)
    tiers = TierParams(0.2, 0.0, 5.0, 40.0, 60.0, 0.01)
    tiered = JobParams(migration_s=30.0, spares=10**6, tiers=tiers)  # the closed form assumes a free spare
    op = OperatingPoint(recall=0.5, lead_time_s=600.0, false_alarms_per_1000_node_days=2.0)
    result = run_strategies(trace, JobParams(), op, strategies=("tiered+foreshock",),
                            tiered=tiered)["tiered+foreshock"]
    expected = ettr_tiered_with_prediction(result.interval_s, result.durable_every, tiers, trace.mtbf_s,
                                           recall=0.5, lead_time_s=600.0, migration_s=30.0,
                                           false_alarms_per_day=2.0 * trace.nodes / 1000)
    assert result.ettr == pytest.approx(expected, rel=0.01)
    caught = 0.5 * mitigation_success_probability(600.0, tiers.snapshot_s + 30.0)
    assert result.crashes == pytest.approx(len(trace) * (1 - caught), rel=0.03)
    # The memory interval is Daly's for the failures left unwarned.
    daly = daly_interval_seconds(0.2, trace.mtbf_s / (1 - caught))
    assert result.interval_s == pytest.approx(daly, rel=1e-9)


# Hand timeline: interval 100, snapshot stall 1, durable every 5th snapshot with a further 10 s stall.
# A cycle is 5 × 101 + 10 = 515 s; snapshots end at 101, 202, 303, 404, 515 (durable), 616, ..., 1030
# (durable), 1131, 1232, 1333, ... A failure at 1234.5 has 12 snapshots (1,200 s of compute) behind it, the
# last durable one at 10 (1,000 s).
HAND = TierParams(snapshot_s=1.0, replicate_s=0.0, durable_s=10.0, peer_recovery_s=20.0,
                  durable_recovery_s=50.0, pair_loss_probability=0.0)


def _after(restart_at: float, since: int, horizon: float = 10_000.0) -> float:
    """Compute done from ``restart_at`` to the horizon by a run starting ``since`` snapshots into a cycle."""
    v = horizon - restart_at + since * 101.0
    cycles, r = divmod(v, 515.0)
    done = min(r // 101.0, 5)
    return cycles * 500 + (500 if done >= 5 else done * 100 + min(r - done * 101, 100)) - since * 100


def test_hand_computed_tiered_timelines():
    params, trace = JobParams(migration_s=5.0, tiers=HAND), hand_trace([1234.5])
    assert _after(1234.5 + 20, 2) == pytest.approx(8491.5)  # the helper itself, checked once by hand
    # Unwarned: loses the 34.5 s since snapshot 12, restarts 20 s later 2 snapshots past the durable one.
    peer = simulate(trace, 100.0, params, durable_every=5, pair_lost=np.array([False]))
    assert peer.productive_s == pytest.approx(1200 + 8491.5)
    assert (peer.crashes, peer.pair_losses, peer.durable_every) == (1, 0, 5)
    # Taking both copies: back to the durable snapshot at 1,000 s; storage restore 50 s.
    pair = simulate(trace, 100.0, params, durable_every=5, pair_lost=np.array([True]))
    assert pair.productive_s == pytest.approx(1000 + _after(1234.5 + 50, 0))
    assert pair.pair_losses == 1
    assert peer.productive_s - pair.productive_s > 200  # two memory intervals of work, plus 30 s of recovery
    # A replication delay of 5 s: snapshot 12 (ended 1232) had not reached the buddy at 1234.5.
    slow = replace(params, tiers=replace(HAND, replicate_s=5.0))
    late = simulate(trace, 100.0, slow, durable_every=5, pair_lost=np.array([False]))
    assert late.productive_s == pytest.approx(1100 + _after(1234.5 + 20, 1))
    # Warned at 1200: the memory snapshot (1 s) and the migration (5 s) lose nothing and write nothing
    # durable; the run resumes at 1206, 11 snapshots (1 past durable) and 1,169 s of compute in.
    warned = simulate(trace, 100.0, params, durable_every=5, warn_s=np.array([1200.0]))
    assert (warned.crashes, warned.avoided, warned.migrations) == (0, 1, 1)
    assert warned.productive_s == pytest.approx(1169 + _after(1206, 1))
    # No failure at all: only the stalls cost.
    calm = simulate(hand_trace([]), 100.0, params, durable_every=5)
    assert calm.productive_s == pytest.approx(_after(0, 0))


def test_failures_during_recovery_restart_it_and_a_pair_loss_switches_it_to_storage():
    params = JobParams(tiers=HAND)
    # A second failure 10 s into the peer recovery restarts it (20 s from 1244.5); a pair loss then 5 s
    # into that switches to the storage restore (50 s from 1249.5), back at the durable 1,000 s.
    trace = hand_trace([1234.5, 1244.5, 1249.5])
    result = simulate(trace, 100.0, params, durable_every=5, pair_lost=np.array([False, False, True]))
    assert result.crashes == 3 and result.pair_losses == 1
    assert result.productive_s == pytest.approx(1000 + _after(1249.5 + 50, 0))


def test_pair_loss_probability_counts_close_pairs_of_different_nodes():
    fail = np.array([0.0, 5.0, 5.0, 100.0, 104.0, 300.0])
    node = np.array([0, 1, 2, 0, 0, 3])
    trace = FailureTrace("pairs", 4, 8, 1000.0, fail, np.ones(6), np.array(["x"] * 6, dtype=object), node)
    # Within 10 s: (0, 5 on node 1), (0, 5 on node 2), (5, 5): 3 pairs; 100 and 104 are one node.
    assert pair_loss_probability(trace, 10.0) == pytest.approx(3 / 6 / 3)
    assert pair_loss_probability(trace, 4.0) == pytest.approx(1 / 6 / 3)  # only the simultaneous pair
    assert pair_loss_probability(trace, 1000.0) == pytest.approx((15 - 3) / 6 / 3)  # node 0 thrice: 3 same


def test_pair_loss_probability_on_the_real_trace_matches_a_naive_count():
    trace = load_infinitehbd(INFINITEHBD)
    for window in (60.0, 600.0):
        pairs = sum(1 for i in range(len(trace)) for k in range(i)
                    if trace.fail_s[i] - trace.fail_s[k] <= window and trace.node[i] != trace.node[k])
        assert pair_loss_probability(trace, window) == pytest.approx(pairs / len(trace) / (trace.nodes - 1))
    # Real faults come in bursts: far more close pairs than independent failures at that rate would give.
    independent = 60.0 / trace.mtbf_s / (trace.nodes - 1)
    assert pair_loss_probability(trace, 60.0) > 50 * independent


def test_pair_loss_probability_of_a_poisson_draw_is_its_rate_times_the_window():
    profile = {"cluster": {"gpus_per_node": 8, "interruptions_per_gpu_day": 0.000474}}
    trace = from_profile(profile, gpus=16384, days=3650, seed=3)
    window = 100.0
    expected_pairs = len(trace) * window / trace.mtbf_s  # earlier failures within the window, per failure
    q = pair_loss_probability(trace, window)
    counted = q * len(trace) * (trace.nodes - 1)
    assert counted == pytest.approx(expected_pairs, abs=4 * math.sqrt(expected_pairs))


def test_each_tier_interval_is_daly_for_its_stall_and_the_failures_it_protects_against():
    tiers = TierParams(0.08, 0.4, 3.3, 37.0, 40.0, 2e-4)
    mtbf = 3 * 3600.0
    memory, every = tier_intervals(tiers, mtbf)
    assert memory == pytest.approx(daly_interval_seconds(0.08, mtbf))
    durable = daly_interval_seconds(3.3, mtbf / 2e-4)
    assert every == round(durable / (memory + 0.08))
    # Rarer pair losses: rarer durable snapshots; none at all: never.
    assert tier_intervals(replace(tiers, pair_loss_probability=2e-6), mtbf)[1] > 5 * every
    assert tier_intervals(replace(tiers, pair_loss_probability=0.0), mtbf) == (memory, MAX_DURABLE_EVERY)
    # A snapshot is never due before the previous one reached the buddy.
    assert tier_intervals(replace(tiers, replicate_s=600.0), mtbf)[0] == 600.0
    with pytest.raises(ValueError):
        tier_intervals(replace(tiers, pair_loss_probability=None), mtbf)


def test_the_durable_tier_is_what_pair_losses_cost():
    # Same failures, same tiers: with every failure taking both copies the loss is the durable cycle's.
    trace = exponential_trace(6 * 3600.0, 3_000, seed=9)
    tiers = TierParams(0.5, 0.0, 30.0, 60.0, 300.0, 0.0)
    params = JobParams(tiers=tiers)
    none = simulate(trace, 120.0, params, durable_every=30, pair_lost=np.zeros(len(trace), bool))
    every = simulate(trace, 120.0, params, durable_every=30, pair_lost=np.ones(len(trace), bool))
    assert none.ettr == pytest.approx(ettr_tiered(120.0, 30, tiers, trace.mtbf_s), rel=0.01)
    both = replace(tiers, pair_loss_probability=1.0)
    assert every.ettr == pytest.approx(ettr_tiered(120.0, 30, both, trace.mtbf_s), rel=0.01)
    # Per crash, about half a durable cycle (30 × 120.5 + 30 s) more is lost, and 240 s more recovery.
    extra_per_crash = (none.productive_s - every.productive_s) / len(trace)
    assert extra_per_crash == pytest.approx((30 * 120.5 + 30) / 2 - 120.5 / 2 + 240, rel=0.15)


def test_tiered_parameters_are_checked():
    with pytest.raises(ValueError):
        TierParams(-1.0, 0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        TierParams(1.0, 0.0, 1.0, 1.0, 1.0, 1.5)
    with pytest.raises(ValueError):
        simulate(hand_trace([]), math.inf, JobParams(tiers=HAND))


def test_doctests():
    assert doctest.testmod(foreshock.models.goodput.tiers).failed == 0
