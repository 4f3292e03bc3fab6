"""Every option and argument of every `foreshock` command says what it is for."""

from __future__ import annotations

import typer.main

from foreshock.cli import app


def test_every_option_of_every_command_has_help_text():
    group = typer.main.get_command(app)
    assert len(group.commands) >= 10
    missing = [
        f"foreshock {name} {'/'.join(param.opts)}"
        for name, command in sorted(group.commands.items())
        for param in command.params
        if param.name != "help" and not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []
