"""Vectorised building blocks for one time chunk: cumulative counters and stateful gauges.

A chunk is laid out as ``(steps, nodes, units)`` (units = GPUs or ports). Anything that happens
between two samples is attached to a *step*: the first sample at or after it. Output columns hold
only the kept rows (:class:`KeptRows`: nodes that were scraped), and are built in that layout
where they can be. A counter carries its value from chunk to chunk; increments are sparse (a few
per chunk), so a counter costs one copy of its carried value per kept row plus work proportional
to the (step, unit) columns that moved. Every column equals "compute the full chunk, then keep the
scraped rows" value for value: the shortcuts change the cost, never a bit of the output.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Increments", "cumulative", "cumsum_steps", "stateful_gauge", "Background", "KeptRows"]


class Increments:
    """Sparse increments of one counter in one chunk: (step, node, unit, amount) quadruples.

    ``node``, ``unit`` and ``amount`` are arrays like ``step`` or one value for all of them.
    """

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray | int, np.ndarray | int, np.ndarray | int]] = []

    def add(
        self, step: np.ndarray, node: np.ndarray | int, unit: np.ndarray | int, amount: np.ndarray | int
    ) -> None:
        step = np.asarray(step, dtype=np.int64)
        if step.size:
            self._parts.append((step, node, unit, amount))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        if not self._parts:
            return None

        def column(i: int) -> np.ndarray:
            return np.concatenate(
                [np.full(p[0].shape, p[i], np.int64) if np.ndim(p[i]) == 0 else p[i] for p in self._parts],
                dtype=np.int64,
            )

        return column(0), column(1), column(2), column(3)


class KeptRows:
    """The rows of a flattened ``(steps, nodes, units)`` chunk that are kept: the units of nodes
    ``reported`` (``(steps, nodes)`` bool; ``None``: all) at that step, in (step, node, unit) order.

    Columns are built straight in this layout where they can be (a value per unit repeated over
    the steps, plus sparse changes), and selected from a full chunk array otherwise. A node's
    units are adjacent, so both work on whole ``units``-wide rows (one opaque item each): the mask
    is a byte per (step, node), not per value, and kept rows are copied in runs.
    """

    def __init__(self, reported: np.ndarray | None, steps: int, nodes: int, units: int):
        self.steps, self.nodes, self.units = steps, nodes, units
        self.mask = None if reported is None else reported.reshape(-1)
        kept = steps * nodes if self.mask is None else int(np.count_nonzero(self.mask))
        self.size = kept * units
        self._node_of_row: np.ndarray | None = None
        self._position: np.ndarray | None = None

    def _row(self, itemsize: int) -> np.dtype:
        return np.dtype((np.void, self.units * itemsize))

    def select(self, values: np.ndarray, dtype: type) -> np.ndarray:
        """``values`` (a full chunk array) as one contiguous column of ``dtype``, kept rows only."""
        flat = values.reshape(-1)  # a view, or a copy of a broadcast
        if self.mask is not None:
            flat = flat.view(self._row(flat.itemsize))[self.mask].view(flat.dtype)
        return np.ascontiguousarray(flat, dtype=dtype)

    def per_unit(self, values: np.ndarray) -> np.ndarray:
        """A new column holding ``values[node, unit]`` (``(nodes, units)``) at every kept step."""
        if values.shape != (self.nodes, self.units):
            values = np.broadcast_to(values, (self.nodes, self.units))
        values = np.ascontiguousarray(values).reshape(-1)
        if self.mask is None:
            out = np.empty((self.steps, values.size), dtype=values.dtype)
            out[:] = values
            return out.reshape(-1)
        if self._node_of_row is None:
            self._node_of_row = np.flatnonzero(self.mask) % self.nodes
        return values.view(self._row(values.itemsize)).take(self._node_of_row).view(values.dtype)

    def per_step(self, values: np.ndarray) -> np.ndarray:
        """A new column holding ``values[step]`` (``(steps,)``) on every kept unit of that step."""
        if self.mask is None:
            return np.repeat(values, self.nodes * self.units)
        kept = np.count_nonzero(self.mask.reshape(self.steps, self.nodes), axis=1)
        return np.repeat(values, kept * self.units)

    def position(self) -> np.ndarray:
        """``(steps, nodes)``: where each (step, node)'s first unit sits in a column; -1 if not kept."""
        if self._position is None:
            if self.mask is None:
                pos = np.arange(self.steps * self.nodes, dtype=np.int64)
            else:
                pos = np.cumsum(self.mask, dtype=np.int64)
                pos -= 1
                pos[~self.mask] = -1
            pos[pos >= 0] *= self.units
            self._position = pos.reshape(self.steps, self.nodes)
        return self._position


def cumulative(
    carry: np.ndarray, rows: KeptRows, inc: Increments, resets: list[tuple[int, int]] = ()
) -> np.ndarray:
    """Counter values as a kept-rows column (:class:`KeptRows`): the carried value plus ``inc``.

    ``resets`` are (step, node) pairs where the node's counter restarts from zero (a reboot or
    driver reload after repair); a step at or after ``rows.steps`` resets the carry only. ``carry``
    is updated in place to the value after the chunk (kept or not: a node runs on unseen).
    """
    steps, units = rows.steps, rows.units
    arrays = inc.arrays()
    full = cols = col_node = col_unit = delta = None
    if arrays is not None:
        step, node, unit, amount = arrays
        cols, which = np.unique(node * units + unit, return_inverse=True)
    if cols is not None and cols.size * 4 > carry.size:  # many units moved: one dense block
        full = np.zeros((steps, carry.size), dtype=np.int64)
        np.add.at(full, (step, cols[which]), amount)
        cumsum_steps(full)
        full += carry.reshape(1, -1)
        out = rows.select(full, np.int64)
        full = full.reshape(steps, *carry.shape)
        last = full[-1].copy()
    else:  # a few units moved: the carried value, plus the moved (step, unit) columns
        # most counters of most units never moved: zeroed pages cost nothing until read
        out = rows.per_unit(carry) if carry.any() else np.zeros(rows.size, dtype=np.int64)
        last = carry.copy()
        if cols is not None:  # (columns, steps): integer sums along the contiguous axis are fast
            delta = np.zeros((cols.size, steps), dtype=np.int64)
            np.add.at(delta, (which, step), amount)
            np.cumsum(delta, axis=1, out=delta)
            col_node, col_unit = np.divmod(cols, units)
            where = rows.position().T[col_node]
            kept = where >= 0
            out[(where + col_unit[:, None])[kept]] += delta[kept]
            last.reshape(-1)[cols] += delta[:, -1]
    restarts: dict[int, list[int]] = {}
    for step, node in sorted(resets):
        if step < steps:
            restarts.setdefault(node, []).append(step)
    for node, at in restarts.items():  # the node's own (steps, units) values, then its kept rows
        if full is not None:
            values = full[:, node].copy()
        else:
            values = np.empty((steps, units), dtype=np.int64)
            values[:] = carry[node]
            if delta is not None:
                mine = col_node == node
                values[:, col_unit[mine]] += delta[mine].T
        for step in at:
            values[step:] -= values[step - 1].copy() if step > 0 else carry[node]
        where = rows.position()[:, node]
        kept = where >= 0
        out[(where[kept, None] + np.arange(units)).reshape(-1)] = values[kept].reshape(-1)
        last[node] = values[-1]
    carry[:] = last
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
    rows = list(values)
    for previous, row in zip(rows[:-1], rows[1:], strict=True):
        np.add(row, previous, out=row)
    return values


def stateful_gauge(
    carry: np.ndarray, rows: KeptRows, sets: list[tuple[int, int, int | None, int]]
) -> np.ndarray:
    """A gauge that holds its last value (e.g. the last Xid), as a kept-rows column: ``sets`` are
    (step, node, unit|None, value).

    A unit of ``None`` sets every unit of the node. Sets apply in time order; ``carry`` is updated.
    """
    out = rows.per_unit(carry) if carry.any() else np.zeros(rows.size, dtype=np.int64)
    units = np.arange(rows.units)
    in_chunk = sorted((s for s in sets if s[0] < rows.steps), key=lambda s: s[0])
    for step, node, unit, value in in_chunk:
        where = rows.position()[step:, node]
        where = where[where >= 0]
        out[(where[:, None] + (units if unit is None else unit)).reshape(-1)] = value
    # the value after the chunk: the last set in time order, then sets after the last sample
    for _, node, unit, value in in_chunk + [s for s in sets if s[0] >= rows.steps]:
        carry[node, slice(None) if unit is None else unit] = value
    return out


class Background:
    """Background events of one counter: each unit fires at ``rate`` ((nodes, units), per step, the
    same all run) in bursts of mean size ``burst_mean``. The run's total rate and unit CDF are
    computed once, not once per chunk."""

    def __init__(self, rate: np.ndarray, burst_mean: float = 1.0):
        self.per_step = float(rate.sum())
        self.cdf = np.cumsum(rate.ravel())
        self.units = rate.shape[1]
        self.burst_mean = burst_mean

    def scatter(self, rng: np.random.Generator, steps: int, inc: Increments) -> None:
        """Add one chunk's events to ``inc``: one Poisson draw for the whole chunk, then each event
        picks its unit in proportion to the rates and its step uniformly (cost grows with the
        number of events, not of samples)."""
        total = self.per_step * steps
        n = int(rng.poisson(total)) if total > 0 else 0
        if n == 0:
            return
        cdf, units = self.cdf, self.units
        flat = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cdf.size - 1)
        amount = rng.geometric(1.0 / self.burst_mean, n) if self.burst_mean > 1 else 1
        inc.add(rng.integers(0, steps, n), flat // units, flat % units, amount)
