"""Commands of this area (registered by foreshock.cli)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
