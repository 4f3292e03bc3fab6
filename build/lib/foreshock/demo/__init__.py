"""``foreshock demo``: the whole system in one process, on embedded defaults.

1. simulate a small cluster (``foreshock.ingest.simulator``) into ``OUT/data``;
2. compute features on every day but the last, train the risk model on them and register it in
   the local MLflow store ``OUT/data/mlflow.db`` (``foreshock.models.train``); the last day stays unseen;
3. replay the last day through an in-memory bus, the predictor service and the mitigator in
   dry-run mode, in accelerated simulated time, with a live view (:mod:`foreshock.demo.replay`);
4. report: failures, how many were predicted and how far ahead, actions taken, training time
   saved; printed and written to ``OUT/report.md`` (+ ``report.json`` and a plot).

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
from foreshock.demo.report import DemoReport, build_report, plot_replay, write_report, write_scores

__all__ = ["DemoSettings", "run_demo"]

_DAY_MS = 86_400_000
BUDGET_AT_RATE_1 = 1.0  # false alarms per 1,000 node-days, as `foreshock train` defaults to


@dataclass(frozen=True)
class DemoSettings:
    """Every knob of the demo; the defaults make a run of a few minutes on 2 cores."""

    out: Path = Path("runs/demo")
    profile: Path = field(default_factory=lambda: shipped.profile("llama3"))
    nodes: int = 48
    days: float = 3.0
    seed: int = 7
    rate_multiplier: float = 150.0  # a small cluster fails rarely: scale the rate to see failures in a day
    interval_ms: int = 60_000
    horizon_minutes: int = 60
    # alert budget in false alarms per 1,000 node-days; None: 1 at the profile's own failure rate,
    # times rate_multiplier (the simulator's false-alarm transients scale with the failures)
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
            raise ValueError("the demo needs at least 2 days: one or more to train on, the last to replay")
        if not 0 < self.spares < self.nodes:
            raise ValueError("spares must be between 1 and nodes - 1")

    @property
    def alert_budget(self) -> float:
        """False alarms allowed per 1,000 node-days (sets the alert threshold on validation)."""
        if self.budget_per_1000_node_days is not None:
            return self.budget_per_1000_node_days
        return BUDGET_AT_RATE_1 * self.rate_multiplier


def _simulate(s: DemoSettings, data_dir: Path, say: Callable[[str], None]):
    from foreshock.ingest.simulator import Simulator, load_profile, write_dataset

    sim = Simulator(
        load_profile(s.profile),
        nodes=s.nodes,
        duration_ms=int(s.days * _DAY_MS),
        interval_ms=s.interval_ms,
        seed=s.seed,
        rate_multiplier=s.rate_multiplier,
    )
    write_dataset(sim, data_dir, overwrite=True)
    failures = sim.schedule.failures
    say(
        f"simulated {s.nodes} nodes x {sim.gpus} GPUs for {s.days:g} days: {len(failures)} failures "
        f"({sum(f.detectable for f in failures)} with foreshocks) -> {data_dir}"
    )
    return sim


def _train(s: DemoSettings, data_dir: Path, cut_ms: int, tracking_uri: str, say: Callable[[str], None]):
    """Features on ``[start, cut - horizon)`` (labels never reach into the replayed day), then train."""
    from foreshock.features import DEFAULT_FEATURE_SET
    from foreshock.features.batch import compute_features
    from foreshock.models.train import train_from_dataset

    for name in ("mlflow", "alembic"):  # the store's own chatter; errors still show
        logging.getLogger(name).setLevel(logging.WARNING)
    features = compute_features(
        data_dir,
        feature_set=DEFAULT_FEATURE_SET,
        cadence_ms=60_000,
        end_ms=cut_ms - s.horizon_minutes * 60_000,
    )
    with open(s.out / "train.log", "w") as log, redirect_stdout(log), redirect_stderr(log):
        model = train_from_dataset(
            data_dir,
            s.out / "train",
            horizon_minutes=s.horizon_minutes,
            tracking_uri=tracking_uri,
            features=features,
            feature_set=DEFAULT_FEATURE_SET,
            budget_per_1000_node_days=s.alert_budget,
            seed=s.seed,
            params=dict(s.lgb_params),
        )
    m = model.metrics.get("model", {})
    say(
        f"trained and registered foreshock-risk v{model.version} on {len(features):,} rows: test PR-AUC "
        f"{m.get('pr_auc') or 0:.3f}, recall at budget {m.get('recall_at_budget') or 0:.2f} "
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
    sim = _simulate(s, data_dir, say)
    cut_ms = sim.end_ms - _DAY_MS
    tracking_uri = sqlite_uri(data_dir)
    t0 = time.monotonic()
    model = _train(s, data_dir, cut_ms, tracking_uri, say)
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
