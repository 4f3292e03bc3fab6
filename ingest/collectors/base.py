"""What every collector and captured-file parser promises, and the registries that pick them by name.

A collector is anything with ``collect() -> list[record]``: one poll of its source, returning the
contract records observed since the previous poll (possibly none). It never raises for bad input
from the source; it raises :class:`CollectorUnavailable` (one sentence, no traceback needed) only
when the source cannot be opened at all. A collector that holds records back (the Xid flood
folder) also offers ``drain()``, called once on shutdown so that no count is lost.

A collector may also count what went wrong, as two integer attributes the collect command's
metrics read at scrape time (:mod:`foreshock.ingest.collectors.metrics`): ``failures``, reads of
the source that failed (an unreachable dcgm-exporter, a ``sinfo`` or node list that failed), and
``parse_errors``, input it read and could not turn into records (a malformed exposition line, an
Xid line it could not read). A poll during which ``failures`` did not grow is a successful read.

Collectors and parsers register under a name (``nvml``, ``dcgm``, ``kmsg``, ``ib``, ``slurm``,
``kubernetes``); the CLI picks them by that name and passes the outside world in through
:class:`CollectorOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from foreshock.ingest.stream import now_ms

__all__ = [
    "Collector",
    "Draining",
    "CollectorUnavailable",
    "CollectorOptions",
    "ParseReport",
    "ParseResult",
    "register_collector",
    "create_collector",
    "collector_names",
    "register_parser",
    "parser_for",
    "parser_names",
    "MAX_LINE_CHARS",
]

MAX_LINE_CHARS = 16_384
"""Longest line a parser looks at; kernel and exposition lines are far shorter, so longer ones are
malformed input, skipped without running any pattern over them (bounded time per line)."""


@runtime_checkable
class Collector(Protocol):
    """One source of telemetry. ``collect`` is called once per interval by the collect loop."""

    def collect(self) -> list[Any]:
        """Records observed since the previous call (contract types from foreshock.ingest.contract)."""
        ...


@runtime_checkable
class Draining(Protocol):
    """A collector that buffers records (flood folding) and must hand them over on shutdown."""

    def drain(self) -> list[Any]:
        """Every record still held back; called once, after the last ``collect``."""
        ...


class CollectorUnavailable(RuntimeError):
    """The source cannot be used on this machine; the message is one sentence for the operator."""


@dataclass(frozen=True)
class CollectorOptions:
    """The outside world a collector is built against (production defaults; tests inject their own).

    ``path``: sysfs root (ib), kernel-log device or replay file (kmsg), state file (slurm,
    kubernetes); ``url``: dcgm-exporter endpoint; ``clock``: epoch-ms wall clock; ``nvml``: the
    pynvml module (or a stand-in); ``fetch``: HTTP GET returning the body;
    ``xid_policy_override``: an operator CSV merged over the shipped Xid policy;
    ``fold_window_ms``: Xid repeats within this window are folded; ``journal``: follow
    ``journalctl -k`` instead of ``path``; ``nvidia_proc_root``: where the driver lists GPUs by PCI
    bus id (maps a kernel-log bus id to the GPU index).
    """

    node: str
    path: Path | None = None
    url: str | None = None
    journal: bool = False
    clock: Callable[[], int] = now_ms
    nvml: Any = None
    fetch: Callable[[str, float], bytes] | None = None
    xid_policy_override: Path | None = None
    fold_window_ms: int = 10_000
    nvidia_proc_root: Path = Path("/proc/driver/nvidia/gpus")


@dataclass
class ParseReport:
    """What a parser made of a captured file: lines read, parsed into records, and skipped.

    ``skipped`` holds the 1-based numbers of lines that yielded nothing (not telemetry, or
    malformed); blank lines and exposition comments count as read but neither parsed nor skipped.
    """

    read: int = 0
    parsed: int = 0
    skipped: list[int] = field(default_factory=list)

    def summary(self) -> str:
        """One line for stderr, with skipped line numbers compressed into ranges (``3-9,12``)."""
        return (f"read {self.read} lines, parsed {self.parsed}, skipped {len(self.skipped)}"
                + (f" (lines {_ranges(self.skipped)})" if self.skipped else ""))


def _ranges(numbers: list[int]) -> str:
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = n
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


@dataclass
class ParseResult:
    records: list[Any]
    report: ParseReport


T = TypeVar("T")
CollectorFactory = Callable[[CollectorOptions], Collector]
FileParser = Callable[[Iterable[bytes], CollectorOptions], ParseResult]

class Registry(Generic[T]):
    """Named implementations of one kind (collector factories, file parsers), added by decorator
    from the module that implements them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make the decorated object available under ``name``."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        """The object registered as ``name``; an unknown name is a ValueError naming the known ones."""
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)


COLLECTORS: Registry[CollectorFactory] = Registry("collector")
PARSERS: Registry[FileParser] = Registry("parser")
register_collector = COLLECTORS.register
register_parser = PARSERS.register
parser_for = PARSERS.get
collector_names = COLLECTORS.names
parser_names = PARSERS.names


def create_collector(name: str, options: CollectorOptions) -> Collector:
    """Build the collector registered as ``name``; may raise :class:`CollectorUnavailable`."""
    return COLLECTORS.get(name)(options)
