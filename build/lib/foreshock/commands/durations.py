"""Parsing of the human durations the CLI takes (``10s``, ``30m``, ``60m``, ``2h``, ``7d``)."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str, default_unit: str = "s") -> timedelta:
    """``"30s"`` -> 30 seconds; a bare number takes ``default_unit``.

    >>> parse_duration("90m")
    datetime.timedelta(seconds=5400)
    """
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 10s, 30m, 2h, 7d)")
    value, unit = match.groups()
    return timedelta(seconds=float(value) * _UNITS[unit or default_unit])


def option_seconds(text: str, flag: str) -> float:
    """Seconds of a duration flag; a bad value is a usage error naming the flag (exit 2)."""
    import typer

    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


def option_ms(text: str, flag: str) -> int:
    """Milliseconds of a duration flag (see :func:`option_seconds`)."""
    return int(option_seconds(text, flag) * 1000)
