"""Progress bars with a time estimate for the long commands, drawn with rich on stderr.

The engines below the CLI take a plain callback, ``progress(label, done, total)``; this module
turns it into one bar per label, so ``simulate``, ``features``, ``train``, ``evaluate`` and
``calibrate`` show each stage (the samples written, the feature passes, loading the table,
fitting, scoring) with its own estimate of the time left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["progress_bars"]

Report = Callable[[str, int, int], None]


@contextmanager
def progress_bars() -> Iterator[Report]:
    """A ``progress(label, done, total)`` callback that draws a bar per label while the block runs."""
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks: dict[str, int] = {}

        def report(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield report
