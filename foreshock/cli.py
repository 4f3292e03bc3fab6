"""``foreshock`` — the command line. Each area registers its commands from foreshock/commands/."""

from __future__ import annotations

import importlib

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


if __name__ == "__main__":
    app()
