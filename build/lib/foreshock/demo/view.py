"""The live view of the replay (rich): nodes by risk, recent alerts, the mitigator's actions."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from rich.console import Group
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from foreshock.demo.replay import ReplayState

__all__ = ["LiveView"]

_ROWS = 12


def _clock(ts: int) -> str:
    return datetime.fromtimestamp(ts / 1000, UTC).strftime("%m-%d %H:%M")


class LiveView:
    """Renders a :class:`ReplayState`; :meth:`render` is called after every scoring period."""

    def __init__(self, start_ms: int, end_ms: int, threshold: float):
        self.start_ms, self.end_ms, self.threshold = start_ms, end_ms, threshold
        self.wall0 = time.monotonic()
        self.sim0: int | None = None

    def header(self, state: ReplayState) -> Text:
        if self.sim0 is None:
            self.sim0 = state.now_ms
        done = max(0.0, min(1.0, (state.now_ms - self.start_ms) / (self.end_ms - self.start_ms)))
        elapsed = time.monotonic() - self.wall0
        speed = (state.now_ms - self.sim0) / 1000 / elapsed if elapsed > 0 else 0.0
        phase = (
            "warming up the feature windows" if state.warming_up else f"replaying the last day: {done:4.0%}"
        )
        return Text.assemble(
            ("Foreshock demo  ", "bold"),
            (f"sim time {_clock(state.now_ms)} UTC  ", "cyan"),
            f"{phase}  ",
            (f"x{speed:,.0f} real time  ", "magenta"),
            f"{state.records:,} records  {len(state.failures)} failures so far",
        )

    def nodes(self, state: ReplayState) -> Table:
        table = Table(title="Nodes by risk", expand=True)
        for col in ("node", "P(fail 1h)", "state", "top feature"):
            table.add_column(col, no_wrap=True, overflow="ellipsis")
        engine = state.engine
        ranked = sorted(state.latest.values(), key=lambda s: -s.probability)[:_ROWS]
        for s in ranked:
            style = "bold red" if s.alert else ("yellow" if s.probability >= self.threshold / 2 else "")
            top = s.top_features[0].name if s.top_features else ""
            mode = engine.state(s.node).value if engine is not None else ""
            table.add_row(s.node, f"{s.probability:.3f}", mode, top[:38], style=style)
        return table

    def alerts(self, state: ReplayState) -> Table:
        table = Table(title="Alerts and failures", expand=True)
        for col in ("time", "node", "event"):
            table.add_column(col, no_wrap=True, overflow="ellipsis")
        events: list[tuple[int, str, str, str]] = []
        seen: set[str] = set()
        for s in state.scores[-2000:]:
            if s.alert and (s.node, s.ts // 3_600_000) not in seen:
                seen.add((s.node, s.ts // 3_600_000))
                events.append((s.ts, s.node, f"alert p={s.probability:.2f}", "red"))
        events += [(f.ts, f.node, f"FAILED: {f.cause}", "bold white on red") for f in state.failures]
        for ts, node, what, style in sorted(events)[-_ROWS:]:
            table.add_row(_clock(ts), node, what, style=style)
        return table

    def actions(self, state: ReplayState) -> Table:
        table = Table(title="Mitigator actions (dry run)", expand=True)
        for col in ("time", "action", "node", "why"):  # the reason takes what the others leave
            table.add_column(col, no_wrap=True, overflow="ellipsis", ratio=1 if col == "why" else None)
        for ts, o in state.outcomes[-_ROWS:]:
            table.add_row(_clock(ts), o.action.kind, o.action.node, o.action.reason[:60])
        return table

    def render(self, state: ReplayState) -> Layout:
        layout = Layout()
        layout.split_column(Layout(Panel(self.header(state)), size=3), Layout(name="body"))
        layout["body"].split_row(
            Layout(self.nodes(state)), Layout(Group(self.alerts(state), self.actions(state)))
        )
        return layout
