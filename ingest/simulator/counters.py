"""Vectorised building blocks for one time chunk: cumulative counters and stateful gauges.

A chunk is laid out as ``(steps, nodes, units)`` (units = GPUs or ports). Anything that happens
between two samples is attached to a *step*: the first sample at or after it. A counter carries
its value from chunk to chunk; increments are sparse (a few per chunk), so a counter costs one
broadcast of its carried value plus work proportional to the (step, unit) columns that moved.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Increments", "cumulative", "cumsum_steps", "stateful_gauge", "poisson_scatter", "KeptRows"]


class Increments:
    """Sparse increments of one counter in one chunk: (step, node, unit, amount) quadruples."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(
        self, step: np.ndarray, node: np.ndarray | int, unit: np.ndarray | int, amount: np.ndarray | int
    ) -> None:
        step = np.asarray(step, dtype=np.int64)
        if step.size == 0:
            return
        shape = step.shape
        self._parts.append(
            (
                step,
                np.broadcast_to(np.asarray(node, dtype=np.int64), shape),
                np.broadcast_to(np.asarray(unit, dtype=np.int64), shape),
                np.broadcast_to(np.asarray(amount, dtype=np.int64), shape),
            )
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        if not self._parts:
            return None
        return tuple(np.concatenate([p[i] for p in self._parts]) for i in range(4))  # type: ignore[return-value]


def cumulative(
    carry: np.ndarray, steps: int, inc: Increments, resets: list[tuple[int, int]] = ()
) -> np.ndarray:
    """Counter values ``(steps, nodes, units)`` from the carried value plus ``inc``.

    ``resets`` are (step, node) pairs where the node's counter restarts from zero (a reboot or
    driver reload after repair); a step equal to ``steps`` resets the carry only. ``carry`` is
    updated in place to the value after the chunk.
    """
    nodes, units = carry.shape
    if carry.any():
        out = np.empty((steps, nodes * units), dtype=np.int64)
        out[:] = carry.reshape(1, -1)
    else:  # most counters of most units never moved: zeroed pages cost nothing until read
        out = np.zeros((steps, nodes * units), dtype=np.int64)
    arrays = inc.arrays()
    if arrays is not None:
        step, node, unit, amount = arrays
        col = node * units + unit
        cols, which = np.unique(col, return_inverse=True)
        delta = np.zeros((steps, cols.size), dtype=np.int64)
        np.add.at(delta, (step, which), amount)
        cumsum_steps(delta)
        out[:, cols] += delta
    out = out.reshape(steps, nodes, units)
    for step, node in sorted(resets):
        base = out[step - 1, node].copy() if step > 0 else carry[node].copy()
        if step < steps:
            out[step:, node] -= base
    carry[:] = out[-1]
    for step, node in resets:
        if step >= steps:
            carry[node] = 0
    return out


def cumsum_steps(values: np.ndarray) -> np.ndarray:
    """``np.cumsum(values, axis=0, out=values)``: the same additions in the same order, so the same bits.

    numpy accumulates along a non-last axis element by element down the strided column; on a wide
    ``(steps, ...)`` block adding row ``k - 1`` into row ``k`` is many times faster, one call per step.
    """
    if values[0].size < 64:  # a few columns: one numpy call beats a Python loop over the steps
        return np.cumsum(values, axis=0, out=values)
    for k in range(1, values.shape[0]):
        np.add(values[k], values[k - 1], out=values[k])
    return values


def stateful_gauge(carry: np.ndarray, steps: int, sets: list[tuple[int, int, int | None, int]]) -> np.ndarray:
    """A gauge that holds its last value (e.g. the last Xid): ``sets`` are (step, node, unit|None, value).

    A unit of ``None`` sets every unit of the node. Sets apply in time order; ``carry`` is updated.
    """
    out = np.zeros((steps, *carry.shape), dtype=np.int64)
    if carry.any():
        out[:] = carry
    for step, node, unit, value in sorted(sets, key=lambda s: s[0]):
        where = slice(None) if unit is None else unit
        out[step:, node, where] = value
    if steps:
        carry[:] = out[-1]
        for step, node, unit, value in sets:  # sets after the last sample only move the carry
            if step >= steps:
                carry[node, slice(None) if unit is None else unit] = value
    return out


class KeptRows:
    """The rows of a flattened ``(steps, nodes, units)`` chunk that are kept: those of nodes
    ``reported`` (``(steps, nodes)`` bool; ``None``: all) at that step.

    A node's units are adjacent, so selection works on whole ``units``-wide rows (one opaque item
    each): the mask is a byte per (step, node), not per value, and kept rows are copied in runs.
    That is several times faster than a per-value mask or ``np.take``, and selects the same values.
    """

    def __init__(self, reported: np.ndarray | None, units: int):
        self.mask = None if reported is None else reported.reshape(-1)
        self.units = units

    def select(self, values: np.ndarray, dtype: type) -> np.ndarray:
        """``values`` as one contiguous column of ``dtype``, kept rows only (select, then convert)."""
        flat = values.reshape(-1)  # a view, or a copy of a broadcast
        if self.mask is not None:
            row = np.dtype((np.void, self.units * flat.itemsize))
            flat = flat.view(row)[self.mask].view(flat.dtype)
        return np.ascontiguousarray(flat, dtype=dtype)


def poisson_scatter(
    rng: np.random.Generator, rate: np.ndarray, steps: int, inc: Increments, burst_mean: float = 1.0
) -> None:
    """Background events: each unit fires at ``rate`` (nodes, units) per step, in bursts of mean size.

    One Poisson draw for the whole chunk, then each event picks its unit in proportion to the
    rates and its step uniformly: cost grows with the number of events, not of samples.
    """
    total = float(rate.sum()) * steps
    n = int(rng.poisson(total)) if total > 0 else 0
    if n == 0:
        return
    cdf = np.cumsum(rate.ravel())
    flat = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cdf.size - 1)
    units = rate.shape[1]
    amount = rng.geometric(1.0 / burst_mean, n) if burst_mean > 1 else np.ones(n, dtype=np.int64)
    inc.add(rng.integers(0, steps, n), flat // units, flat % units, amount)
