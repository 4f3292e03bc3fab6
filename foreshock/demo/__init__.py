"""``foreshock demo``: the whole system in one process, on embedded defaults.

1. simulate the small cluster the demo replays (``foreshock.ingest.simulator``) into ``OUT/data``,
   and a larger simulated history of the same profile (another seed, ``history_nodes`` nodes,
   one day fewer) into ``OUT/history``;
2. train the risk model on the history and register it in the local MLflow store
   ``OUT/data/mlflow.db`` (``foreshock.models.train``): the replayed cluster is one it never saw.
   The history is what makes the model worth showing: two days of 48 nodes hold too few failures
   to learn from and too few node-days to set a threshold that keeps its false-alarm budget;
3. replay the last day through an in-memory bus, the predictor service and the mitigator in
   dry-run mode, in accelerated simulated time, with a live view (:mod:`foreshock.demo.replay`);
4. report: failures, how many were predicted and how far ahead, false alarms against the budget,
   actions taken, training time saved, and the full evaluation's figures beside the day's
   (``foreshock.shipped.operating_point("model-evaluation")``, from docs/results.md); printed and
   written to ``OUT/report.md`` (+ ``report.json`` and a plot).

The alert budget is the full evaluation's operating point: 1 false alarm per 1,000 node-days at
rate x 60, scaled with the rate (the simulator's harmless transients come with its failures).

This is the composition root of the demo: it may import every package and picks every default.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

from foreshock import shipped
from foreshock.demo.replay import ReplayConfig, ReplayState, replay
from foreshock.demo.report import (
    DemoReport,
    build_report,
    plot_replay,
    reference_figures,
    write_report,
    write_scores,
)

__all__ = ["DemoSettings", "run_demo"]

_DAY_MS = 86_400_000
# false alarms per 1,000 node-days per unit of rate multiplier: the full evaluation's budget of 1
# at rate x 60 (docs/results.md), so the demo runs at the operating point it reports beside its own
BUDGET_PER_RATE = 1.0 / 60.0


@dataclass(frozen=True)
class DemoSettings:
    """Every knob of the demo; the defaults make a run of a few minutes on 2 cores."""

    out: Path = Path("runs/demo")
    profile: Path = field(default_factory=lambda: shipped.profile("llama3"))
    nodes: int = 48
    days: float = 3.0
    # nodes of the simulated history the model trains on (days - 1 days of them)
    history_nodes: int = 192
    seed: int = 7
    rate_multiplier: float = 150.0  # a small cluster fails rarely: scale the rate to see failures in a day
    interval_ms: int = 60_000
    horizon_minutes: int = 60
    # alert budget in false alarms per 1,000 node-days; None: the full evaluation's operating point,
    # BUDGET_PER_RATE x rate_multiplier (the simulator's false-alarm transients scale with the failures)
    budget_per_1000_node_days: float | None = None
    # LightGBM overrides for foreshock.models.train (empty: the model's own defaults, chosen on validation)
    lgb_params: tuple[tuple[str, float], ...] = ()
    score_every_ms: int = 300_000
    warmup_ms: int = 2 * 3_600_000
    spares: int = 4
    checkpoint_every_ms: int = 30 * 60_000
    checkpoint_s: float = 30.0
    migration_s: float = 120.0
    restart_s: float = 600.0

    def __post_init__(self) -> None:
        if self.days < 2:
            raise ValueError("the demo needs at least 2 days: the history to train on spans one day fewer, "
                             "and the last day is replayed")
        if not 0 < self.spares < self.nodes:
            raise ValueError("spares must be between 1 and nodes - 1")
        if self.history_nodes < 8:
            raise ValueError("the history needs at least 8 nodes to train on")

    @property
    def alert_budget(self) -> float:
        """False alarms allowed per 1,000 node-days (sets the alert threshold in training)."""
        if self.budget_per_1000_node_days is not None:
            return self.budget_per_1000_node_days
        return BUDGET_PER_RATE * self.rate_multiplier


def _simulate(s: DemoSettings, out: Path, nodes: int, days: float, seed: int, say: Callable[[str], None],
              what: str):
    from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

    sim = Simulator(
        load_profile(s.profile),
        nodes=nodes,
        duration_ms=int(days * _DAY_MS),
        interval_ms=s.interval_ms,
        seed=seed,
        rate_multiplier=s.rate_multiplier,
    )
    write_dataset(sim, out, overwrite=True)
    failures = sim.schedule.failures
    say(
        f"simulated {what}: {nodes} nodes x {sim.gpus} GPUs for {days:g} days, {len(failures)} failures "
        f"({sum(f.detectable for f in failures)} with foreshocks) -> {out}"
    )
    return sim


def _train(s: DemoSettings, history: Path, tracking_uri: str, say: Callable[[str], None]):
    """Train on the whole simulated history and register the model."""
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.models.train import train_from_dataset

    for name in ("mlflow", "alembic"):  # the store's own chatter; errors still show
        logging.getLogger(name).setLevel(logging.WARNING)
    with open(s.out / "train.log", "w") as log, redirect_stdout(log), redirect_stderr(log):
        model = train_from_dataset(
            history,
            s.out / "train",
            horizon_minutes=s.horizon_minutes,
            tracking_uri=tracking_uri,
            feature_set=DEFAULT_FEATURE_SET,
            budget_per_1000_node_days=s.alert_budget,
            seed=s.seed,
            params=dict(s.lgb_params),
        )
    m = model.metrics.get("model", {})
    say(
        f"trained and registered foreshock-risk v{model.version} on the history: test PR-AUC "
        f"{m.get('pr_auc') or 0:.3f}, recall at budget {m.get('recall_at_budget') or 0:.2f}, "
        f"threshold {model.threshold:.3f} for {s.alert_budget:g} false alarms per 1,000 node-days "
        f"(report: {s.out / 'train' / 'report.md'}, log: {s.out / 'train.log'})"
    )
    return model


def run_demo(s: DemoSettings, *, live: bool = True, say: Callable[[str], None] = print) -> DemoReport:
    """Run the four steps; returns the report (also written to ``s.out``)."""
    from foreshock.models.registry import sqlite_uri

    started = time.monotonic()
    s.out.mkdir(parents=True, exist_ok=True)
    data_dir = s.out / "data"
    (data_dir / "mlflow.db").unlink(missing_ok=True)  # a fresh registry: the demo's model is the champion
    shutil.rmtree(data_dir / "mlartifacts", ignore_errors=True)
    sim = _simulate(s, data_dir, s.nodes, s.days, s.seed, say, "the cluster to replay")
    history = _simulate(s, s.out / "history", s.history_nodes, s.days - 1, s.seed + 1, say,
                        "the history to train on")
    cut_ms = sim.end_ms - _DAY_MS
    tracking_uri = sqlite_uri(data_dir)
    t0 = time.monotonic()
    model = _train(s, s.out / "history", tracking_uri, say)
    train_seconds = time.monotonic() - t0
    cfg = ReplayConfig(
        data_dir=data_dir,
        tracking_uri=tracking_uri,
        start_ms=cut_ms,
        end_ms=sim.end_ms,
        warmup_ms=s.warmup_ms,
        nodes=s.nodes,
        gpus_per_node=sim.gpus,
        spares=s.spares,
        checkpoint_every_ms=s.checkpoint_every_ms,
        checkpoint_s=s.checkpoint_s,
        restart_s=s.restart_s,
        migration_s=s.migration_s,
        score_every_ms=s.score_every_ms,
        audit_path=s.out / "audit.sqlite",
        watch_at=model.threshold,
    )
    say(f"replaying the last day through the predictor and the mitigator (dry run); audit: {cfg.audit_path}")
    state = _replay(cfg, model.threshold, live, say)
    report = build_report(
        state,
        start_ms=cut_ms,
        end_ms=sim.end_ms,
        nodes=s.nodes,
        gpus_per_node=sim.gpus,
        profile=sim.profile.name,
        model=model,
        score_every_ms=s.score_every_ms,
        checkpoint_s=s.checkpoint_s,
        migration_s=s.migration_s,
        restart_s=s.restart_s,
        train_seconds=train_seconds,
        total_seconds=time.monotonic() - started,
        budget_per_1000_node_days=s.alert_budget,
        history=f"{s.history_nodes} nodes x {s.days - 1:g} days, seed {s.seed + 1}, "
        f"{len(history.schedule.failures)} failures",
        reference=reference_figures(sim.profile.name),
    )
    plot = plot_replay(state, report, s.out / "replay.png")
    path = write_report(report, s.out, plot)
    write_scores(state, s.out / "scores.parquet")
    for line in report.lines():
        say(line)
    say(f"report: {path}  plot: {plot}")
    return report


def _replay(cfg: ReplayConfig, threshold: float, live: bool, say: Callable[[str], None]) -> ReplayState:
    if not live:
        marks = iter(range(cfg.start_ms, cfg.end_ms + 1, 6 * 3_600_000))
        mark = [next(marks)]

        def progress(state: ReplayState) -> None:
            if state.now_ms >= mark[0]:
                say(
                    f"  {(state.now_ms - cfg.start_ms) / 3_600_000:4.0f} h replayed: {len(state.failures)} "
                    f"failures, {sum(s.alert for s in state.scores)} alerting scores, "
                    f"{len(state.outcomes)} actions"
                )
                mark[0] = next(marks, cfg.end_ms + 1)

        return replay(cfg, progress)
    from rich.live import Live

    from foreshock.demo.view import LiveView

    view = LiveView(cfg.start_ms, cfg.end_ms, threshold)
    with Live(refresh_per_second=4, screen=False, transient=False) as live_view:
        return replay(cfg, lambda state: live_view.update(view.render(state)))
