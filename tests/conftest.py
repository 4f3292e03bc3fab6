"""Shared pytest wiring: every module in tests/fixtures/ is a plugin (one per service)."""

from pathlib import Path

_FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = sorted(f"tests.fixtures.{p.stem}" for p in _FIXTURES.glob("*.py") if p.stem != "__init__")
