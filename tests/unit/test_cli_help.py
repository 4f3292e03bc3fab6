"""The `foreshock` command line: every option and argument of every command says what it is for,
and a command imports only its own module."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from foreshock.cli import COMMANDS, app


def _commands() -> dict[str, typer.core.TyperCommand]:
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def test_every_option_of_every_command_has_help_text():
    commands = _commands()
    assert list(commands) == list(COMMANDS) and all(commands.values()) and len(commands) >= 10
    missing = [
        f"foreshock {name} {'/'.join(param.opts)}"
        for name, command in sorted(commands.items())
        for param in command.params
        if param.name != "help" and not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []


def test_a_collector_loads_none_of_the_batch_libraries():
    """A collector runs on every GPU node: the simulator's and the plots' libraries (pandas,
    SciPy, matplotlib, pyarrow) would take several times its memory."""
    probe = (
        "import sys, typer.main\n"
        "from foreshock.cli import app\n"
        "group = typer.main.get_command(app)\n"
        "assert group.get_command(typer.Context(group), 'collect') is not None\n"
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
