"""InfiniBand collector: port state, rate and error counters from ``/sys/class/infiniband``.

For every ``<dev>/ports/<port>`` it reads ``state`` (``4: ACTIVE`` -> ``ACTIVE``), ``phys_state``
(``5: LinkUp`` -> ``LinkUp``), ``rate`` (``400 Gb/sec (4X NDR)`` -> 400.0), ``link_layer``
(InfiniBand -> kind ``ib``, Ethernet -> ``eth``) and every file in ``counters/`` and
``hw_counters/``. Counters the contract names (``LINK_COUNTERS``) fill their fields; the others go
to ``extra`` (``hw_counters`` prefixed ``hw_``). From the second poll on, ``deltas`` holds each
counter's increase over the interval; a counter that went down was reset (``perfquery -R``, a
driver reload), so its delta is its new value rather than a negative number.

The sysfs root is a parameter: tests point it at a tree rebuilt from a real node's dump, and
``foreshock parse ib`` reads such a dump directly (``relative/path: value`` lines, or
``grep -r . /sys/class/infiniband`` output).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from foreshock.ingest.collectors.base import (
    MAX_LINE_CHARS,
    CollectorOptions,
    CollectorUnavailable,
    ParseReport,
    ParseResult,
    register_collector,
    register_parser,
)
from foreshock.ingest.contract import LINK_COUNTERS, LinkSample

__all__ = ["InfinibandCollector", "read_sysfs_tree", "samples_from_files", "counter_deltas", "SYSFS_ROOT"]

SYSFS_ROOT = Path("/sys/class/infiniband")
_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
_COUNTER_DIRS = {"counters": "", "hw_counters": "hw_"}
_PATH = re.compile(
    r"(?:/sys/class/infiniband/)?([^/\s:]+)/ports/(\d+)/(?:(counters|hw_counters)/)?([\w.\-]+)"
)
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec")
_NAMED = frozenset(LINK_COUNTERS)
_MAX_COUNT = 2**63


def read_sysfs_tree(root: Path) -> dict[str, str]:
    """``dev/ports/N/...`` relative path -> stripped file text, for the files this collector uses."""
    files: dict[str, str] = {}
    for dev in sorted(p for p in root.iterdir() if (p / "ports").is_dir()):
        for port in sorted((dev / "ports").iterdir()):
            base = f"{dev.name}/ports/{port.name}"
            for name in _PORT_FILES:
                _read_into(files, port / name, f"{base}/{name}")
            for sub in _COUNTER_DIRS:
                folder = port / sub
                if folder.is_dir():
                    for counter in sorted(folder.iterdir()):
                        _read_into(files, counter, f"{base}/{sub}/{counter.name}")
    return files


def _read_into(files: dict[str, str], path: Path, key: str) -> None:
    try:
        files[key] = path.read_text(errors="replace").strip()
    except OSError:  # absent, or a counter the HCA refuses to read (EINVAL): left out
        pass


def _strip_code(value: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    head, sep, tail = value.partition(":")
    return tail.strip() if sep and head.strip().isdigit() else value.strip()


def samples_from_files(files: Mapping[str, str], node: str, ts: int) -> list[LinkSample]:
    """One LinkSample per port found in ``files`` (relative sysfs path -> text)."""
    ports: dict[str, dict] = {}
    for path, value in files.items():
        m = _PATH.fullmatch(path)
        if m is None:
            continue
        dev, port, sub, name = m.groups()
        fields = ports.setdefault(f"{dev}/{port}", {})
        if sub is None:
            if name == "state":
                fields["state"] = _strip_code(value)
            elif name == "phys_state":
                fields["phys_state"] = _strip_code(value)
            elif name == "rate" and (r := _RATE.search(value)):
                fields["rate_gbps"] = float(r.group(1))
            elif name == "link_layer":
                fields["kind"] = "eth" if value.strip().lower() == "ethernet" else "ib"
            continue
        if not value.isdigit() or int(value) >= _MAX_COUNT:
            continue
        if sub == "counters" and name in _NAMED:
            fields[name] = int(value)
        else:
            fields.setdefault("extra", {})[_COUNTER_DIRS[sub] + name] = int(value)
    return [LinkSample(node=node, ts=ts, port=port, **fields) for port, fields in sorted(ports.items())]


def _counters(sample: LinkSample) -> dict[str, int]:
    out = {name: v for name in LINK_COUNTERS if (v := getattr(sample, name)) is not None}
    out.update(sample.extra or {})
    return out


def counter_deltas(previous: Mapping[str, int], current: Mapping[str, int]) -> dict[str, int]:
    """Per-counter increase; a counter lower than before was reset, so its increase is its value.

    >>> counter_deltas({"symbol_error": 5, "link_downed": 3}, {"symbol_error": 9, "link_downed": 1})
    {'symbol_error': 4, 'link_downed': 1}
    """
    return {k: (v - previous[k] if v >= previous[k] else v) for k, v in current.items() if k in previous}


class InfinibandCollector:
    """Read every port under ``root`` per ``collect``; deltas against the previous poll."""

    def __init__(self, root: Path, node: str, clock: Callable[[], int]):
        self.root = Path(root)
        self.node = node
        self.clock = clock
        self._previous: dict[str, dict[str, int]] = {}

    def collect(self) -> list[LinkSample]:
        ts = self.clock()
        out = []
        for sample in samples_from_files(read_sysfs_tree(self.root), self.node, ts):
            counters = _counters(sample)
            before = self._previous.get(sample.port)
            self._previous[sample.port] = counters
            if before is not None:
                sample = LinkSample(**{**_as_dict(sample), "deltas": counter_deltas(before, counters)})
            out.append(sample)
        return out


def _as_dict(sample: LinkSample) -> dict:
    return {f: getattr(sample, f) for f in sample.__struct_fields__}


@register_collector("ib")
def _create(options: CollectorOptions) -> InfinibandCollector:
    root = options.path or SYSFS_ROOT
    if not root.is_dir():
        raise CollectorUnavailable(f"no InfiniBand devices: {root} does not exist on this machine.")
    return InfinibandCollector(root, options.node, options.clock)


@register_parser("ib")
def parse_flat_dump(lines: Iterable[bytes], options: CollectorOptions) -> ParseResult:
    """LinkSamples from a dump of ``path: value`` (or ``path:value``) lines of a sysfs tree."""
    report = ParseReport()
    files: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        report.read += 1
        text = raw[:MAX_LINE_CHARS].decode("utf-8", errors="replace").strip()
        if not text:
            continue
        path, sep, value = text.partition(":")
        if sep and _PATH.fullmatch(path.strip()):
            files[path.strip()] = value.strip()
            report.parsed += 1
        else:
            report.skipped.append(number)
    return ParseResult(samples_from_files(files, options.node, options.clock()), report)
