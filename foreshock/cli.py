"""``foreshock`` — the command line. Each area registers its commands from foreshock/commands/."""

from __future__ import annotations

import importlib
import signal
from types import FrameType

import typer

app = typer.Typer(
    name="foreshock",
    help="Predict GPU-node failures before they happen and move the training job out of the way.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (
    "collect", "simulate", "features", "train", "calibrate", "serve", "goodput", "mitigate", "demo"
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"foreshock.commands.{_name}").register(app)


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
