"""Parsing of the byte sizes the CLI takes (``512KiB``, ``64MiB``, ``1GiB``, ``4096``)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864 bytes; a bare number is bytes; KB/MB/GB are decimal, KiB/MiB/GiB binary.

    >>> parse_size("64MiB"), parse_size("1.5KB"), parse_size("4096")
    (67108864, 1500, 4096)
    """
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 512KiB, 64MiB, 1GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def option_bytes(text: str, flag: str) -> int:
    """Bytes of a size flag; a bad or zero value is a usage error naming the flag (exit 2)."""
    import typer

    try:
        size = parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    if size <= 0:
        raise typer.BadParameter(f"{text!r} is not a positive size", param_hint=flag)
    return size
