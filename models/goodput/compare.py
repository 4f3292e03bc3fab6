"""Strategies compared on the same failure trace, and sweeps over cluster size and recall.

Strategies (``STRATEGIES``):

* ``fixed``: checkpoint every ``fixed_interval_s`` of compute (default 30 min), no prediction.
* ``young_daly``: Daly's optimal interval for the trace's observed MTBF, no prediction.
* ``foreshock``: warnings at the predictor's operating point trigger a proactive checkpoint and
  a migration to a spare; the periodic interval is Daly's for the failures left unpredicted
  (so with recall 0 and no false alarms it *is* ``young_daly``).
* ``oracle``: every failure is warned just in time (checkpoint + migration + 60 s ahead), no
  false alarms, no periodic checkpoints: the ceiling any predictor can reach.

With a tiered job's parameters (``tiered``: a ``JobParams`` with ``tiers``, e.g. projected from a
drill by ``foreshock.models.goodput.projection``) two more (``TIERED_STRATEGIES``):

* ``tiered``: memory, peer and durable tiers, no prediction; each tier's interval is Daly's for
  its stall and the failures it protects against (``foreshock.models.goodput.tiers.tier_intervals``);
* ``tiered+foreshock``: the same tiers, and each warning snapshots the flagged node's memory and
  moves it to a spare; the memory interval is Daly's for the failures left unpredicted.

A pair-loss probability the tiered parameters leave open is estimated from the trace itself
(``foreshock.models.goodput.tiers.pair_loss_probability``) over the window in which one copy only exists.

With a burn-in rule (:class:`~foreshock.models.reliability.BurnIn`), :func:`compare` replays every
strategy a second time, named ``STRATEGY+burn-in``, on the failures that reach the job when
repaired nodes go through the burn-in (:mod:`foreshock.models.goodput.burnin`).

All strategies see the same failures; the foreshock warnings come from one random draw per
failure, so raising recall only adds warnings (common random numbers). A burn-in replay keeps
each remaining failure's own draws.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foreshock.models.goodput.burnin import BurnInReplay, apply_burn_in
from foreshock.models.goodput.simulate import JobParams, SimResult, simulate
from foreshock.models.goodput.tiers import (
    draw_pair_losses,
    pair_loss_probability,
    pair_loss_window_s,
    tier_intervals,
)
from foreshock.models.goodput.traces import FailureTrace
from foreshock.models.reliability import (
    SECONDS_PER_DAY,
    BurnIn,
    daly_interval_seconds,
    mitigation_success_probability,
)

__all__ = ["STRATEGIES", "TIERED_STRATEGIES", "BURN_IN_SUFFIX", "JSON_KEYS", "OperatingPoint",
           "draw_warnings", "resolve_tiers", "run_strategies", "compare", "sweep"]

STRATEGIES = ("fixed", "young_daly", "foreshock", "oracle")
BURN_IN_SUFFIX = "+burn-in"
TIERED_STRATEGIES = ("tiered", "tiered+foreshock")
ORACLE_MARGIN_S = 60.0
MIN_SAMPLE = 5  # evaluated failures (or lead times) below which a metrics breakdown is not trusted
JSON_KEYS = (
    "gpus", "strategy", "ettr", "lost_gpu_hours_per_day", "interruptions_per_day", "lost_time_reduction",
)


@dataclass(frozen=True)
class OperatingPoint:
    """A predictor's operating point: recall, lead time and false-alarm rate.

    ``lead_time_s`` is a median (lead times then follow an exponential law with that median)
    or a sample of observed lead times. ``recall_by_cause`` overrides ``recall`` for failures
    whose trace cause matches a key.
    """

    recall: float = 0.6
    lead_time_s: float | tuple[float, ...] = 1800.0
    false_alarms_per_1000_node_days: float = 1.0
    recall_by_cause: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any] | str | Path,
                     predictor: str = "model") -> OperatingPoint:
        """The operating point of ``predictor`` in a ``metrics.json`` written by ``foreshock evaluate``.

        Uses ``recall_at_budget`` and ``false_alarms_per_1000_node_days``; the observed
        ``lead_minutes`` when there are at least ``MIN_SAMPLE`` of them, else
        ``median_lead_minutes``; and ``recall_by_cause`` entries (``{"caught", "failures",
        "recall"}`` or a bare number) for causes with at least ``MIN_SAMPLE`` evaluated failures
        (fewer would swing recall between 0 and 1 on one failure).
        """
        if not isinstance(metrics, Mapping):
            metrics = json.loads(Path(metrics).read_text())
        entry = metrics.get(predictor)
        if not isinstance(entry, Mapping) or entry.get("recall_at_budget") is None:
            raise ValueError(f"metrics have no operating point for predictor {predictor!r}")
        leads = [float(x) * 60.0 for x in entry.get("lead_minutes") or []]
        by_cause: dict[str, float] = {}
        for cause, value in (entry.get("recall_by_cause") or {}).items():
            if isinstance(value, Mapping):
                if value.get("recall") is not None and int(value.get("failures", 0)) >= MIN_SAMPLE:
                    by_cause[str(cause)] = float(value["recall"])
            elif value is not None:
                by_cause[str(cause)] = float(value)
        median = entry.get("median_lead_minutes")
        return cls(recall=float(entry["recall_at_budget"]),
                   lead_time_s=tuple(leads) if len(leads) >= MIN_SAMPLE else float(median or 0.0) * 60.0,
                   false_alarms_per_1000_node_days=float(entry["false_alarms_per_1000_node_days"]),
                   recall_by_cause=by_cause)

    def recall_for(self, causes: np.ndarray) -> np.ndarray:
        return np.array([self.recall_by_cause.get(str(c), self.recall) for c in causes], dtype=float)

    def lead_quantile(self, u: np.ndarray) -> np.ndarray:
        """Lead times at uniform draws ``u`` (inverse CDF, so one draw serves every operating point)."""
        if np.ndim(self.lead_time_s) == 0:
            return -float(self.lead_time_s) * np.log2(np.clip(u, 1e-300, 1.0))
        return np.quantile(np.asarray(self.lead_time_s, dtype=float), u)


def draw_warnings(trace: FailureTrace, op: OperatingPoint, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(warning time per failure, NaN if unpredicted; false-alarm times) for one replay."""
    rng = np.random.default_rng([seed, 1])
    hit, lead_u = rng.random(len(trace)), rng.random(len(trace))
    predicted = hit < op.recall_for(trace.cause)
    warn = np.where(predicted, np.maximum(0.0, trace.fail_s - op.lead_quantile(lead_u)), np.nan)
    per_second = op.false_alarms_per_1000_node_days * trace.nodes / 1000.0 / SECONDS_PER_DAY
    false_alarms = rng.uniform(0.0, trace.duration_s, rng.poisson(per_second * trace.duration_s))
    return warn, false_alarms


def _residual_share(trace: FailureTrace, params: JobParams, op: OperatingPoint | None) -> float:
    """Expected share of failures left unwarned (warned too late to save and migrate counts as left)."""
    if op is None or not len(trace):
        return 1.0
    in_time = mitigation_success_probability(op.lead_time_s, params.save_s + params.migration_s)
    return 1.0 - float(np.mean(op.recall_for(trace.cause))) * in_time


def _foreshock_interval(trace: FailureTrace, params: JobParams, op: OperatingPoint) -> float:
    """Daly's interval for the failures the predictor leaves (its expected residual rate)."""
    if not len(trace):
        return math.inf
    residual = _residual_share(trace, params, op)
    return math.inf if residual <= 0 else daly_interval_seconds(params.checkpoint_s, trace.mtbf_s / residual)


def resolve_tiers(trace: FailureTrace, tiered: JobParams,
                  op: OperatingPoint | None = None) -> tuple[JobParams, float, int]:
    """(tiered parameters with the pair-loss probability fixed, memory interval, durable every K).

    The intervals are each tier's Daly interval for the failures ``op`` leaves unwarned (all of
    them without ``op``). An open pair-loss probability is estimated on ``trace`` over the window
    that memory interval implies.
    """
    tiers = tiered.tiers
    if tiers is None:
        raise ValueError("tiered strategies need JobParams with tiers")
    residual = _residual_share(trace, tiered, op)
    unwarned_mtbf = trace.mtbf_s / residual if residual > 0 else math.inf
    if tiers.pair_loss_probability is None:
        memory, _ = tier_intervals(replace(tiers, pair_loss_probability=0.0), unwarned_mtbf)
        window = pair_loss_window_s(tiers, trace.duration_s if math.isinf(memory) else memory)
        tiers = replace(tiers, pair_loss_probability=pair_loss_probability(trace, window))
    interval, every = tier_intervals(tiers, unwarned_mtbf)
    return replace(tiered, tiers=tiers), trace.duration_s if math.isinf(interval) else interval, every


def _run_tiered(trace: FailureTrace, full: FailureTrace, kept: np.ndarray, tiered: JobParams,
                op: OperatingPoint | None, seed: int) -> SimResult:
    """A tiered strategy on ``trace``: the failures ``kept`` of ``full`` (each keeps its own draws)."""
    params, interval, every = resolve_tiers(trace, tiered, op)
    assert params.tiers is not None
    lost_both = draw_pair_losses(full, params.tiers.q, seed)[kept]
    if op is None:
        return simulate(trace, interval, params, durable_every=every, pair_lost=lost_both)
    warn, false_alarms = draw_warnings(full, op, seed)
    return simulate(trace, interval, params, warn_s=warn[kept], false_alarm_s=false_alarms,
                    durable_every=every, pair_lost=lost_both)


def run_strategies(trace: FailureTrace, params: JobParams, op: OperatingPoint, *,
                   fixed_interval_s: float = 1800.0, strategies: Sequence[str] | None = None,
                   seed: int = 0, tiered: JobParams | None = None,
                   burn_in: BurnInReplay | None = None) -> dict[str, SimResult]:
    """Replay ``trace`` once per strategy (see the module docstring).

    ``strategies`` defaults to ``STRATEGIES``, plus ``TIERED_STRATEGIES`` when ``tiered`` is given.
    With ``burn_in`` (:func:`~foreshock.models.goodput.burnin.apply_burn_in` of ``trace``) the job
    sees only the failures that reach it.
    """
    if strategies is None:
        strategies = STRATEGIES + (TIERED_STRATEGIES if tiered is not None else ())
    job, kept = (trace, np.ones(len(trace), bool)) if burn_in is None else (burn_in.trace, burn_in.kept)
    results: dict[str, SimResult] = {}
    for name in strategies:
        if name == "fixed":
            results[name] = simulate(job, fixed_interval_s, params)
        elif name == "young_daly":
            results[name] = simulate(job, daly_interval_seconds(params.checkpoint_s, job.mtbf_s), params)
        elif name == "foreshock":
            warn, false_alarms = draw_warnings(trace, op, seed)
            results[name] = simulate(job, _foreshock_interval(job, params, op), params,
                                     warn_s=warn[kept], false_alarm_s=false_alarms)
        elif name == "oracle":
            lead = params.checkpoint_s + params.migration_s + ORACLE_MARGIN_S
            results[name] = simulate(job, math.inf, params, warn_s=np.maximum(0.0, job.fail_s - lead))
        elif name in TIERED_STRATEGIES:
            if tiered is None:
                raise ValueError(f"strategy {name!r} needs the tiered job's parameters (tiered=...)")
            results[name] = _run_tiered(job, trace, kept, tiered, op if name == "tiered+foreshock" else None,
                                        seed)
        else:
            known = ", ".join(STRATEGIES + TIERED_STRATEGIES)
            raise ValueError(f"unknown strategy {name!r}; known: {known}")
    return results


def _reduction(r: SimResult, baseline: SimResult | None) -> float:
    """1 − lost(strategy) / lost(baseline); 0 when the baseline loses nothing, NaN without one."""
    if baseline is None:
        return math.nan
    base_lost = 1.0 - baseline.ettr
    return (1.0 - (1.0 - r.ettr) / base_lost) if base_lost > 0 else 0.0


def _rows(results: Mapping[str, SimResult], baseline: SimResult) -> list[dict[str, Any]]:
    """Table rows; ``lost_time_reduction`` = 1 − lost(strategy) / lost(baseline), and
    ``lost_time_reduction_vs_young_daly`` the same against ``young_daly`` when it ran."""
    rows = []
    for name, r in results.items():
        days, tiered = r.duration_s / SECONDS_PER_DAY, r.durable_every > 0
        rows.append({"gpus": r.gpus, "strategy": name, "ettr": r.ettr,
                     "lost_gpu_hours_per_day": r.lost_gpu_hours_per_day,
                     "interruptions_per_day": r.interruptions_per_day,
                     "lost_time_reduction": _reduction(r, baseline),
                     "interval_min": r.interval_s / 60.0,
                     "migrations_per_day": r.migrations / days,
                     "planned_restarts_per_day": r.planned_restarts / days,
                     "lost_time_reduction_vs_young_daly": _reduction(r, results.get("young_daly")),
                     "durable_interval_min": (r.durable_every * r.interval_s / 60.0) if tiered else math.nan,
                     "pair_loss_probability": r.pair_loss_probability if tiered else math.nan,
                     "pair_losses": r.pair_losses})
    return rows


def compare(traces: Iterable[FailureTrace], params: JobParams, op: OperatingPoint, *,
            fixed_interval_s: float = 1800.0, seed: int = 0,
            tiered_for: Callable[[FailureTrace], JobParams] | None = None,
            burn_in: BurnIn | None = None) -> pd.DataFrame:
    """One row per (trace, strategy); ``lost_time_reduction`` is relative to ``fixed`` on that trace.

    ``tiered_for(trace)`` gives the tiered job's parameters for that trace (its costs depend on
    the cluster size); with it the ``TIERED_STRATEGIES`` rows follow the others. With ``burn_in``
    every strategy's row is followed by the rows of the same strategies under the burn-in
    (``STRATEGY+burn-in``), still against ``fixed`` without it.

    Columns: the JSON keys of ``foreshock goodput --json`` (``gpus``, ``strategy``, ``ettr``,
    ``lost_gpu_hours_per_day``, ``interruptions_per_day``, ``lost_time_reduction``) then
    ``interval_min``, ``migrations_per_day``, ``planned_restarts_per_day``,
    ``lost_time_reduction_vs_young_daly``, and for tiered rows ``durable_interval_min``,
    ``pair_loss_probability``, ``pair_losses`` (NaN, NaN, 0 otherwise); then ``held_by_burn_in``
    (failures that landed in a burn-in instead of the job), ``burn_ins`` and
    ``burn_in_node_days`` (capacity held out), 0 without a burn-in.
    """
    rows: list[dict[str, Any]] = []
    for trace in traces:
        tiered = tiered_for(trace) if tiered_for is not None else None
        results = run_strategies(trace, params, op, fixed_interval_s=fixed_interval_s, seed=seed,
                                 tiered=tiered)
        held = dict.fromkeys(results, (0, 0, 0.0))
        if burn_in is not None:
            replay = apply_burn_in(trace, burn_in)
            burned = run_strategies(trace, params, op, fixed_interval_s=fixed_interval_s, seed=seed,
                                    tiered=tiered, burn_in=replay)
            for name, result in burned.items():
                results[name + BURN_IN_SUFFIX] = result
                held[name + BURN_IN_SUFFIX] = (replay.held, replay.burn_ins, replay.node_s / SECONDS_PER_DAY)
        for row in _rows(results, results["fixed"]):
            row["held_by_burn_in"], row["burn_ins"], row["burn_in_node_days"] = held[row["strategy"]]
            rows.append(row)
    return pd.DataFrame(rows)


def sweep(trace_for_gpus: Callable[[int], FailureTrace], gpus: Sequence[int], recalls: Sequence[float],
          params: JobParams | None = None, op: OperatingPoint | None = None, *,
          seed: int = 0) -> pd.DataFrame:
    """ETTR against cluster size and recall, for notebooks and the ``--plot`` figure.

    ``trace_for_gpus(g)`` returns the trace of a ``g``-GPU job (e.g.
    ``lambda g: from_profile(profile, gpus=g, days=365)``). Returns one row per (gpus, recall)
    for the ``foreshock`` strategy at that recall (other operating-point values from ``op``),
    plus the ``fixed``, ``young_daly`` and ``oracle`` rows per size with ``recall`` NaN;
    columns as :func:`compare` plus ``recall``.
    """
    params, op = params or JobParams(), op or OperatingPoint()
    rows: list[dict[str, Any]] = []
    for g in gpus:
        trace = trace_for_gpus(g)
        fixed = run_strategies(trace, params, op, strategies=("fixed", "young_daly", "oracle"), seed=seed)
        rows += [dict(row, recall=math.nan) for row in _rows(fixed, fixed["fixed"])]
        for recall in recalls:
            point = replace(op, recall=float(recall), recall_by_cause={})
            result = run_strategies(trace, params, point, strategies=("foreshock",), seed=seed)
            rows += [dict(row, recall=float(recall)) for row in _rows(result, fixed["fixed"])]
    return pd.DataFrame(rows)
