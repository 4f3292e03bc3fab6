"""``foreshock`` — the command line. Each area registers its commands from foreshock/commands/,
and a command's module is imported only when that command runs (or the command list is shown)."""

from __future__ import annotations

import importlib
import signal
from types import FrameType
from typing import Any

import typer
import typer.core

COMMANDS = {
    "collect": "collect",
    "parse": "collect",
    "simulate": "simulate",
    "features": "features",
    "train": "train",
    "evaluate": "train",
    "calibrate": "calibrate",
    "serve": "serve",
    "goodput": "goodput",
    "mitigate": "mitigate",
    "drill": "mitigate",
    "demo": "demo",
}
"""Each command, in the order ``foreshock --help`` lists them, and its module under
foreshock/commands/ (which exposes ``register(app)``)."""


class _CommandsOnDemand(typer.core.TyperGroup):
    """The commands of :data:`COMMANDS`, each built from its module when asked for. A collector
    runs on every GPU node, where the libraries of the batch commands (pandas, SciPy, matplotlib
    and pyarrow, for the simulator and the goodput plots) would take several times the memory
    of the collector itself and seconds to start it."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        area = typer.Typer()
        importlib.import_module(f"foreshock.commands.{COMMANDS[cmd_name]}").register(area)
        return typer.main.get_group(area).get_command(ctx, cmd_name)


app = typer.Typer(
    name="foreshock",
    help="Predict GPU-node failures before they happen and move the training job out of the way.",
    cls=_CommandsOnDemand,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """A group of commands, even though none is registered on ``app`` itself."""


def main() -> None:
    """The ``foreshock`` executable. SIGTERM (a scheduler's time limit, ``kill``) ends a command
    as SIGINT does, through every ``finally``: a batch command stopped mid-way removes its
    temporary folders, which hold a fleet's month of training rows and scored folds (gigabytes).
    The commands that run until stopped (``serve``, ``collect``, ``mitigate``) set handlers of
    their own."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    app()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
