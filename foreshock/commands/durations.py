"""The one duration type of the CLI: ``10s``, ``30m``, ``2h``, ``7d`` (and ``250ms``).

Every duration flag is a :class:`Duration` (:func:`duration_option`): typer parses the text once,
a bad value is a usage error that names the flag, and the program reads one unit,
milliseconds (``.ms``), or seconds where a config holds seconds (``.seconds``). Flags that may
mean "never" (``inf``, ``never``) are declared with ``never=True``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

__all__ = ["Duration", "duration_option", "duration_parser"]

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_NEVER = ("inf", "never")


@dataclass(frozen=True, order=True)
class Duration:
    """A span of time in whole milliseconds (``math.inf`` for "never")."""

    ms: float

    @classmethod
    def parse(cls, text: str | Duration, *, default_unit: str = "s", never: bool = False) -> Duration:
        """``"30s"`` -> 30,000 ms; a bare number takes ``default_unit``.

        >>> Duration.parse("90m").ms
        5400000
        """
        if isinstance(text, Duration):
            return text
        if never and text.strip() in _NEVER:
            return cls(math.inf)
        match = _PATTERN.match(text)
        if not match:
            also = " or 'never'" if never else ""
            raise ValueError(f"not a duration: {text!r} (use e.g. 10s, 30m, 2h, 7d{also})")
        value, unit = match.groups()
        return cls(round(float(value) * _UNITS_MS[unit or default_unit]))

    @property
    def seconds(self) -> float:
        return self.ms / 1000

    @property
    def minutes(self) -> float:
        return self.ms / 60_000

    def __str__(self) -> str:
        if math.isinf(self.ms):
            return "never"
        for unit in ("d", "h", "m", "s"):
            if self.ms and self.ms % _UNITS_MS[unit] == 0:
                return f"{int(self.ms // _UNITS_MS[unit])}{unit}"
        return f"{self.ms:g}ms"


def duration_parser(never: bool = False, unit: str = "s") -> Callable[[str | Duration], Duration]:
    """The ``parser=`` of a duration option (for ``Annotated`` declarations)."""
    return lambda text: Duration.parse(text, default_unit=unit, never=never)


def duration_option(default: str | None, *param_decls: str, help: str, never: bool = False, unit: str = "s",
                    **kwargs: Any) -> Any:
    """A ``typer.Option`` whose value is a :class:`Duration` (``never``: also accepts inf/never; ``unit``:
    that of a bare number)."""
    return typer.Option(default, *param_decls, parser=duration_parser(never, unit), metavar="DURATION",
                        help=help, **kwargs)
