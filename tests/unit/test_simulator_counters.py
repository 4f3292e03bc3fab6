"""Kept-row columns (counters, gauges, keys) equal the plain "whole chunk, then keep the scraped rows"
computation, value for value, on the sparse and the dense path, with resets and lost scrapes."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.ingest.simulator.counters import Increments, KeptRows, cumsum_steps, cumulative, stateful_gauge


def naive_counter(carry, steps, events, resets):
    """Step by step: a reset zeroes the node before that step's increments; returns (values, carry after)."""
    value = carry.copy()
    out = np.empty((steps, *carry.shape), dtype=np.int64)
    for s in range(steps):
        for rs, node in resets:
            if rs == s:
                value[node] = 0
        for es, node, unit, amount in events:
            if es == s:
                value[node, unit] += amount
        out[s] = value
    for rs, node in resets:
        if rs >= steps:
            value[node] = 0
    return out, value


def naive_gauge(carry, steps, sets):
    value = carry.copy()
    out = np.empty((steps, *carry.shape), dtype=np.int64)
    ordered = sorted(sets, key=lambda x: x[0])
    for s in range(steps):
        for ss, node, unit, v in ordered:
            if ss == s:
                value[node, slice(None) if unit is None else unit] = v
        out[s] = value
    for ss, node, unit, v in sets:
        if ss >= steps:
            value[node, slice(None) if unit is None else unit] = v
    return out, value


def random_case(rng, events_per_unit):
    steps, nodes, units = int(rng.integers(1, 10)), int(rng.integers(1, 30)), int(rng.integers(1, 5))
    reported = None if rng.random() < 0.25 else rng.random((steps, nodes)) < 0.8
    mask = np.ones((steps, nodes), dtype=bool) if reported is None else reported
    carry = rng.integers(0, 50, (nodes, units)) * int(rng.random() < 0.7)
    k = int(events_per_unit * nodes * units) + int(rng.integers(0, 3))
    events = list(
        zip(
            rng.integers(0, steps, k).tolist(),
            rng.integers(0, nodes, k).tolist(),
            rng.integers(0, units, k).tolist(),
            rng.integers(1, 9, k).tolist(),
            strict=True,
        )
    )
    resets = sorted({(int(rng.integers(0, steps + 1)), int(rng.integers(0, nodes))) for _ in range(3)})
    return steps, nodes, units, reported, mask, carry, events, resets


@pytest.mark.parametrize("events_per_unit", [0.0, 0.05, 2.0])  # none, sparse, dense
def test_counters_equal_the_whole_chunk_then_kept_rows(events_per_unit):
    rng = np.random.default_rng(int(events_per_unit * 100))
    for _ in range(150):
        steps, nodes, units, reported, mask, carry, events, resets = random_case(rng, events_per_unit)
        inc = Increments()
        for s, node, unit, amount in events:
            inc.add(np.array([s]), node, unit, amount)
        expect, expect_carry = naive_counter(carry, steps, events, resets)
        got_carry = carry.copy()
        got = cumulative(got_carry, KeptRows(reported, steps, nodes, units), inc, resets)
        np.testing.assert_array_equal(got, expect[mask].reshape(-1))
        np.testing.assert_array_equal(got_carry, expect_carry)


def test_stateful_gauge_holds_the_last_value_in_time_order():
    rng = np.random.default_rng(3)
    for _ in range(200):
        steps, nodes, units, reported, mask, carry, _, _ = random_case(rng, 0.0)
        sets = [
            (
                int(rng.integers(0, steps + 2)),
                int(rng.integers(0, nodes)),
                None if rng.random() < 0.4 else int(rng.integers(0, units)),
                int(rng.integers(1, 99)),
            )
            for _ in range(int(rng.integers(0, 6)))
        ]
        expect, expect_carry = naive_gauge(carry, steps, sets)
        got_carry = carry.copy()
        got = stateful_gauge(got_carry, KeptRows(reported, steps, nodes, units), sets)
        np.testing.assert_array_equal(got, expect[mask].reshape(-1))
        np.testing.assert_array_equal(got_carry, expect_carry)


def test_kept_rows_select_and_repeat_like_a_mask():
    rng = np.random.default_rng(5)
    for _ in range(100):
        steps, nodes, units, reported, mask, *_ = random_case(rng, 0.0)
        rows = KeptRows(reported, steps, nodes, units)
        full = rng.standard_normal((steps, nodes, units)).astype(np.float32)
        selected = rows.select(full, np.float64)
        assert selected.dtype == np.float64 and selected.size == rows.size
        np.testing.assert_array_equal(selected, full[mask].reshape(-1).astype(np.float64))
        per_unit = rng.integers(0, 1000, (nodes, units))
        np.testing.assert_array_equal(
            rows.per_unit(per_unit), np.broadcast_to(per_unit, (steps, nodes, units))[mask].reshape(-1)
        )
        ts = np.arange(steps, dtype=np.int64) * 30_000
        np.testing.assert_array_equal(
            rows.per_step(ts), np.broadcast_to(ts[:, None, None], (steps, nodes, units))[mask].reshape(-1)
        )


@pytest.mark.parametrize("shape", [(7, 3), (40, 200)])  # numpy's own cumsum, then the row-by-row one
def test_cumsum_steps_is_numpy_cumsum_bit_for_bit(shape):
    values = np.random.default_rng(1).random(shape) * 1e6
    expect = np.cumsum(values, axis=0)
    np.testing.assert_array_equal(cumsum_steps(values.copy()), expect)
    assert cumsum_steps(values.copy()).tobytes() == expect.tobytes()
