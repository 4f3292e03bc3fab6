"""The demo's closing report: each failure of the replayed day, whether it was predicted, how far
ahead, what the mitigator did, and the training time that saved, as text, JSON, Markdown and a plot.

Definitions match the model's evaluation (``foreshock.models.alerting``): a failure is *predicted* when its
node had an alerting risk score in the horizon before it; its lead time runs from the first such
score. GPU-hours follow ``foreshock.models.reliability``: a crash of the job costs the work since its last
checkpoint plus the restart, on every GPU of the job; a migration costs a checkpoint plus the
migration; a checkpoint-only action saves the lost work but not the restart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from foreshock.demo.replay import ReplayState
from foreshock.models.alerting import episode_starts
from foreshock.models.evaluate import clear_ms_of
from foreshock.models.reliability import expected_crash_loss_gpu_seconds, mitigation_cost_gpu_seconds

__all__ = ["FailureRow", "DemoReport", "build_report", "write_report", "write_scores", "plot_replay"]

_MIN = 60_000


@dataclass(frozen=True)
class FailureRow:
    node: str
    ts: int
    cause: str
    detectable: bool
    predicted: bool
    lead_minutes: float | None
    action: str  # what the mitigator did for this node before the failure ("" = nothing)
    in_job: bool
    lost_gpu_hours: float  # what the failure costs the job with no prediction
    saved_gpu_hours: float


@dataclass(frozen=True)
class DemoReport:
    start_ms: int
    end_ms: int
    nodes: int
    gpus_per_node: int
    profile: str
    model_version: str
    threshold: float
    horizon_minutes: int
    train_seconds: float
    total_seconds: float
    failures: list[FailureRow]
    alert_episodes: int
    false_alarm_episodes: int
    actions: dict[str, int]
    false_alarm_cost_gpu_hours: float
    budget_per_1000_node_days: float
    history: str  # what the model was trained on
    reference: dict[str, Any] | None  # the full evaluation's figures for this profile

    @property
    def predicted(self) -> list[FailureRow]:
        return [f for f in self.failures if f.predicted]

    @property
    def node_days(self) -> float:
        return self.nodes * (self.end_ms - self.start_ms) / 86_400_000

    @property
    def recall(self) -> float | None:
        return len(self.predicted) / len(self.failures) if self.failures else None

    @property
    def median_lead_detectable(self) -> float | None:
        leads = [f.lead_minutes for f in self.predicted if f.detectable and f.lead_minutes is not None]
        return float(np.median(leads)) if leads else None

    @property
    def saved_gpu_hours(self) -> float:
        return sum(f.saved_gpu_hours for f in self.failures) - self.false_alarm_cost_gpu_hours

    @property
    def lost_gpu_hours(self) -> float:
        return sum(f.lost_gpu_hours for f in self.failures)

    def lines(self) -> list[str]:
        """The short report, one line per fact."""
        day = datetime.fromtimestamp(self.start_ms / 1000, UTC).strftime("%Y-%m-%d")
        leads = [f.lead_minutes for f in self.predicted if f.lead_minutes is not None]
        detectable = [f for f in self.failures if f.detectable]
        lead_text = (
            f"median lead {np.median(leads):.0f} min (range {min(leads):.0f}-{max(leads):.0f})"
            if leads
            else "no lead time"
        )
        acts = ", ".join(f"{n} {k}" for k, n in sorted(self.actions.items())) or "none"
        share = self.saved_gpu_hours / self.lost_gpu_hours * 100 if self.lost_gpu_hours else 0.0
        allowed = self.budget_per_1000_node_days * self.node_days / 1000
        return [
            f"Replayed day {day}: {self.nodes} nodes x {self.gpus_per_node} GPUs ({self.profile} profile), "
            f"model foreshock-risk v{self.model_version} (threshold {self.threshold:.3f}, "
            f"horizon {self.horizon_minutes} min), trained on another cluster's history ({self.history})",
            f"Failures: {len(self.failures)} ({len(detectable)} announced by foreshocks)",
            f"Predicted: {len(self.predicted)} of {len(self.failures)} "
            f"({sum(f.predicted for f in detectable)} of {len(detectable)} with foreshocks), {lead_text}",
            f"Alerts: {self.alert_episodes} episodes, {self.false_alarm_episodes} false alarms in "
            f"{self.node_days:.0f} node-days (budget {self.budget_per_1000_node_days:g} per 1,000 node-days: "
            f"{allowed:.2f} in the day)",
            self.reference_line(),
            f"Actions (dry run): {acts}",
            f"Training time saved: {self.saved_gpu_hours:.1f} GPU-hours of {self.lost_gpu_hours:.1f} lost to "
            f"failures ({share:.0f} %), after {self.false_alarm_cost_gpu_hours:.1f} GPU-hours "
            "spent on false alarms",
            f"Time: training {self.train_seconds:.0f} s, whole demo {self.total_seconds:.0f} s",
        ]

    def reference_line(self) -> str:
        """The full evaluation's figures for this profile beside the day's (docs/results.md)."""
        ref = self.reference
        if ref is None:
            return f"Full evaluation (docs/results.md): none for the {self.profile} profile"
        budget = ref["budget_false_alarms_per_1000_node_days"]
        return (
            f"Full evaluation (docs/results.md, {ref['data']}): recall {ref['recall']:.2f} "
            f"({ref['recall_detectable']:.2f} with foreshocks), {ref['false_alarms_per_1000_node_days']:.2f} "
            f"false alarms per 1,000 node-days against a budget of {budget:g}, "
            f"median lead {ref['median_lead_minutes_detectable']:.1f} min (foreshocks)"
        )


def _episodes(
    scores: list[Any], horizon_ms: int, clear_ms: int, period_ms: int, failures: dict[str, list[int]]
) -> tuple[int, int]:
    """Alert episodes (a node's alerting scores until ``clear_ms`` passes without one, as in
    ``foreshock.models.alerting``) and those with no alerting score followed by a failure within the
    horizon."""
    alerting: dict[str, list[int]] = {}
    for s in scores:
        if s.alert:
            alerting.setdefault(s.node, []).append(s.ts)
    episodes = false = 0
    for node, times in alerting.items():
        ts = np.array(sorted(times), dtype=np.int64)
        ids = np.cumsum(episode_starts(np.zeros(ts.size), ts, clear_ms, period_ms))
        true = [any(0 < f - t <= horizon_ms for f in failures.get(node, [])) for t in ts.tolist()]
        episodes += int(ids[-1])
        false += int(ids[-1]) - len(set(ids[np.array(true)].tolist()))
    return episodes, false


def build_report(
    state: ReplayState,
    *,
    start_ms: int,
    end_ms: int,
    nodes: int,
    gpus_per_node: int,
    profile: str,
    model: Any,
    score_every_ms: int,
    checkpoint_s: float,
    migration_s: float,
    restart_s: float,
    train_seconds: float,
    total_seconds: float,
    budget_per_1000_node_days: float,
    history: str,
    reference: dict[str, Any] | None,
) -> DemoReport:
    """Join the replay's scores and actions with the failures of ``[start_ms, end_ms)``."""
    horizon_ms = model.horizon_minutes * _MIN
    job = state.job
    assert job is not None, "a replay always sets its job"
    gpus = job.job.gpus
    acted = [(ts, o.action) for ts, o in state.outcomes if o.status in ("succeeded", "skipped", "duplicate")]
    by_node: dict[str, list[int]] = {}
    rows = []
    for f in sorted(state.failures, key=lambda f: f.ts):
        by_node.setdefault(f.node, []).append(f.ts)
        alerts = [
            s.ts for s in state.scores if s.node == f.node and s.alert and f.ts - horizon_ms <= s.ts < f.ts
        ]
        kinds = sorted({a.kind for ts, a in acted if a.node == f.node and f.ts - horizon_ms <= ts < f.ts})
        in_job = f.node in job.job.nodes
        since_s = (f.ts - job.last_checkpoint_ms(f.ts)) / 1000
        lost = expected_crash_loss_gpu_seconds(1.0, since_s, restart_s, gpus) / 3600 if in_job else 0.0
        if in_job and "migrate" in kinds:
            saved = lost - mitigation_cost_gpu_seconds(checkpoint_s, migration_s, gpus) / 3600
        elif in_job and "checkpoint" in kinds:
            saved = (since_s - checkpoint_s) * gpus / 3600
        else:
            saved = 0.0
        rows.append(
            FailureRow(
                f.node,
                f.ts,
                f.cause or "unknown",
                bool(f.detectable),
                bool(alerts),
                (f.ts - min(alerts)) / _MIN if alerts else None,
                "+".join(kinds),
                in_job,
                lost,
                saved,
            )
        )
    wasted = [
        a
        for ts, a in acted
        if a.kind == "migrate" and not any(0 <= f - ts <= horizon_ms for f in by_node.get(a.node, []))
    ]
    episodes, false = _episodes(state.scores, horizon_ms, clear_ms_of(model), score_every_ms, by_node)
    actions: dict[str, int] = {}
    for _, a in acted:
        actions[a.kind] = actions.get(a.kind, 0) + 1
    return DemoReport(
        start_ms,
        end_ms,
        nodes,
        gpus_per_node,
        profile,
        str(model.version),
        model.threshold,
        model.horizon_minutes,
        train_seconds,
        total_seconds,
        rows,
        episodes,
        false,
        actions,
        len(wasted) * mitigation_cost_gpu_seconds(checkpoint_s, migration_s, gpus) / 3600,
        budget_per_1000_node_days,
        history,
        reference,
    )


def reference_figures(profile: str) -> dict[str, Any] | None:
    """The full evaluation's figures for ``profile`` (the shipped ``model-evaluation`` operating
    point, measured as docs/results.md says), or None when it was not evaluated."""
    from foreshock.shipped import operating_point

    pools = json.loads(operating_point("model-evaluation").read_text())["pools"]
    return pools.get(profile)


def plot_replay(state: ReplayState, report: DemoReport, path: Path) -> Path:
    """Risk of every node over the day (heat map) and of the nodes that failed (lines)."""
    nodes = sorted({s.node for s in state.scores})
    times = sorted({s.ts for s in state.scores})
    grid = np.full((len(nodes), len(times)), np.nan)
    row, col = {n: i for i, n in enumerate(nodes)}, {t: j for j, t in enumerate(times)}
    for s in state.scores:
        grid[row[s.node], col[s.ts]] = s.probability
    hours = lambda ts: (np.asarray(ts, dtype=float) - report.start_ms) / 3_600_000  # noqa: E731
    fig = Figure(figsize=(11, 8))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    t = hours(times) if times else np.array([0.0, 24.0])
    image = top.pcolormesh(
        t,
        np.arange(len(nodes)),
        grid,
        cmap="magma_r",
        vmin=0,
        vmax=max(0.05, np.nanmax(grid)) if len(nodes) else 1,
        shading="nearest",
    )
    fig.colorbar(image, ax=top, label="P(fail within horizon)")
    for f in report.failures:
        if f.node in row:
            top.plot(
                hours(f.ts),
                row[f.node],
                marker="X",
                ms=9,
                color="#27ae60" if f.predicted else "#2c7fb8",
                mec="white",
            )
    top.set_ylabel("node")
    top.set_title("Risk of every node over the replayed day (X: failure; green = predicted, blue = missed)")
    announced = [f for f in report.failures if f.detectable]
    for k, f in enumerate(announced):
        since = max([g.ts for g in report.failures if g.node == f.node and g.ts < f.ts], default=0)
        mine = sorted(
            (s.ts, s.probability) for s in state.scores if s.node == f.node and since < s.ts <= f.ts
        )
        if mine:
            color = f"C{k % 10}"
            label = f"{f.node} ({f.cause}){', predicted' if f.predicted else ''}"
            bottom.plot(hours([m[0] for m in mine]), [m[1] for m in mine], color=color, lw=1.2, label=label)
            bottom.plot(hours(f.ts), mine[-1][1], "X", color=color, ms=9)
    acted = [(ts, o.action) for ts, o in state.outcomes if o.action.kind in ("migrate", "checkpoint")]
    for ts, a in acted:
        bottom.axvline(hours(ts), color="#27ae60" if a.kind == "migrate" else "#e6a23c", lw=0.8, ls=":")
    bottom.axhline(report.threshold, color="black", ls="--", lw=1, label="alert threshold")
    bottom.set_xlabel("hours into the replayed day")
    bottom.set_ylabel("P(fail within horizon)")
    bottom.set_title("Nodes whose failure (X) was announced by foreshocks; dotted: migrations / checkpoints")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_report(report: DemoReport, out: Path, plot: Path) -> Path:
    """``report.md`` (the lines, the failure table, the plot), ``report.json`` (the same facts) and
    ``scores.parquet`` (every risk score of the replayed day, for a second look)."""
    table = [
        "| failure (UTC) | node | cause | foreshock | predicted | lead (min) | action |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in report.failures:
        when = datetime.fromtimestamp(f.ts / 1000, UTC).strftime("%H:%M")
        lead = f"{f.lead_minutes:.0f}" if f.lead_minutes is not None else "-"
        table.append(
            f"| {when} | {f.node} | {f.cause} | {'yes' if f.detectable else 'no'} | "
            f"{'yes' if f.predicted else 'no'} | {lead} | {f.action or '-'} |"
        )
    text = [
        "# Foreshock demo report",
        "",
        *(f"- {line}" for line in report.lines()),
        "",
        "## Failures",
        "",
        *table,
        "",
        f"![risk over the replayed day]({plot.name})",
        "",
    ]
    (out / "report.md").write_text("\n".join(text))
    facts: dict[str, Any] = asdict(report)
    facts.update(
        node_days=report.node_days,
        recall=report.recall,
        median_lead_minutes_detectable=report.median_lead_detectable,
        predicted=len(report.predicted),
        saved_gpu_hours=report.saved_gpu_hours,
        lost_gpu_hours=report.lost_gpu_hours,
        lines=report.lines(),
    )
    (out / "report.json").write_text(json.dumps(facts, indent=1))
    return out / "report.md"


def write_scores(state: ReplayState, path: Path) -> Path:
    """Every risk score of the replayed day: node, ts, probability, alert, top feature."""
    pd.DataFrame(
        {
            "node": [s.node for s in state.scores],
            "ts": np.array([s.ts for s in state.scores], dtype=np.int64),
            "probability": [s.probability for s in state.scores],
            "alert": [s.alert for s in state.scores],
            "top_feature": [s.top_features[0].name if s.top_features else None for s in state.scores],
        }
    ).to_parquet(path, index=False)
    return path
