"""Shared pytest wiring: every module in tests/fixtures/ is a plugin (one per service)."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)
