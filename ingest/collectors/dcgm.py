"""dcgm-exporter scraper: its Prometheus ``/metrics`` text onto :class:`GpuSample` records.

The exposition format is parsed by ``prometheus_client``'s own parser. Each ``DCGM_FI_DEV_<NAME>``
series whose lower-cased ``<name>`` is a contract field fills that field (``DCGM_FI_DEV_GPU_TEMP``
-> ``gpu_temp``; a few renamed fields are aliased); the labels ``gpu``, ``UUID``, ``pci_bus_id``,
``modelName`` and ``Hostname`` give the GPU index, uuid, canonical bus id, model and (when no node
name is imposed) the node. Every other series is kept in ``extra`` under its lower-cased name
without the ``DCGM_FI_DEV_`` prefix (``DCGM_FI_PROF_DRAM_ACTIVE`` -> ``prof_dram_active``), with
any distinguishing labels (a MIG instance, an Xid code) appended as ``name[label=value]``; labels
that only attribute a GPU to a pod or describe the driver do not split series. Non-finite values
and series without a ``gpu`` label are left out.
"""

from __future__ import annotations

import http.client
import logging
import math
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from foreshock.ingest.collectors.base import (
    MAX_LINE_CHARS,
    CollectorOptions,
    ParseReport,
    ParseResult,
    register_collector,
    register_parser,
)
from foreshock.ingest.collectors.pci import normalize_pci_bus_id
from foreshock.ingest.contract import GPU_FIELDS, GpuSample

__all__ = ["DcgmExporterCollector", "parse_exposition", "http_get", "DEFAULT_URL"]

log = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:9400/metrics"
_PREFIX = "DCGM_FI_DEV_"
_ALIASES = {
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons",
}
_IDENTITY_LABELS = frozenset({"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container",
                              "namespace", "pod", "err_code", "err_msg", "window_size_in_ms"})
_FIELD_KIND: dict[str, type] = {
    f.name: (int if "int" in str(f.type) else float)
    for f in msgspec.structs.fields(GpuSample) if f.name in GPU_FIELDS
}


def _field_for(name: str) -> str | None:
    alias = _ALIASES.get(name)
    if alias is not None:
        return alias
    if name.startswith(_PREFIX):
        field = name[len(_PREFIX):].lower()
        if field in _FIELD_KIND:
            return field
    return None


def _extra_key(name: str, labels: dict[str, str]) -> str:
    base = name[len(_PREFIX):].lower() if name.startswith(_PREFIX) else name.removeprefix("DCGM_FI_").lower()
    split = sorted((k, v) for k, v in labels.items()
                   if k not in _IDENTITY_LABELS and not k.startswith("DCGM_FI_"))
    return base + ("[" + ",".join(f"{k}={v}" for k, v in split) + "]" if split else "")


class _Builder:
    """Accumulates one scrape's samples per GPU, then builds the records."""

    def __init__(self, node: str | None, ts: int):
        self.node = node
        self.ts = ts
        self.gpus: dict[int, dict[str, Any]] = {}
        self.extras: dict[int, dict[str, float]] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> bool:
        gpu_label = labels.get("gpu", "")
        if not gpu_label.isdigit() or int(gpu_label) > 1024:
            return False
        gpu = int(gpu_label)
        fields = self.gpus.setdefault(gpu, {"gpu": gpu})
        for label, key in (("UUID", "uuid"), ("modelName", "model_name")):
            if labels.get(label):
                fields.setdefault(key, labels[label])
        if labels.get("pci_bus_id") and "pci_bus_id" not in fields:
            fields["pci_bus_id"] = normalize_pci_bus_id(labels["pci_bus_id"]) or labels["pci_bus_id"]
        if self.node is None and labels.get("Hostname"):
            self.node = labels["Hostname"]
        if not math.isfinite(value):
            return True  # a series the exporter has no value for: left out, line was still valid
        field = _field_for(name)
        has_split = any(k not in _IDENTITY_LABELS and not k.startswith("DCGM_FI_") for k in labels)
        if field is not None and not has_split:
            fields[field] = int(value) if _FIELD_KIND[field] is int else float(value)
        else:
            self.extras.setdefault(gpu, {})[_extra_key(name, labels)] = float(value)
        return True

    def records(self, fallback_node: str) -> list[GpuSample]:
        node = self.node or fallback_node
        return [GpuSample(node=node, ts=self.ts, extra=self.extras.get(gpu) or None, **fields)
                for gpu, fields in sorted(self.gpus.items())]


def _samples_per_line(lines: list[tuple[int, str]]) -> Iterable[tuple[int, Any]]:
    """(line number, sample or None) for every sample line; whole text first, line by line on error."""
    if all(len(text) <= MAX_LINE_CHARS for _, text in lines):
        try:
            samples = [s for fam in text_string_to_metric_families("\n".join(t for _, t in lines) + "\n")
                       for s in fam.samples]
        except Exception:  # noqa: BLE001 - the parser raises several types on bad input
            samples = None
        if samples is not None and len(samples) == len(lines):
            yield from zip((n for n, _ in lines), samples, strict=True)
            return
    for number, text in lines:
        sample = None
        if len(text) <= MAX_LINE_CHARS:
            try:
                found = [s for fam in text_string_to_metric_families(text + "\n") for s in fam.samples]
                sample = found[0] if len(found) == 1 else None
            except Exception:  # noqa: BLE001
                sample = None
        yield number, sample


def parse_exposition(data: bytes | str, *, node: str | None, ts: int,
                     fallback_node: str = "unknown") -> ParseResult:
    """GpuSamples of one scrape and a line report. ``node=None`` takes the ``Hostname`` label."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    report = ParseReport()
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines.pop()  # the empty tail after the final newline is not a line
    report.read = len(lines)
    sample_lines: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            sample_lines.append((number, stripped))
    builder = _Builder(node, ts)
    for number, sample in _samples_per_line(sample_lines):
        if sample is not None and isinstance(sample.value, (int, float)) \
                and builder.add(sample.name, sample.labels, float(sample.value)):
            report.parsed += 1
        else:
            report.skipped.append(number)
    return ParseResult(builder.records(fallback_node), report)


def http_get(url: str, timeout_s: float) -> bytes:
    """Production fetch: one HTTP GET with a timeout (stdlib, no extra dependency)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - operator-given URL
        return response.read()


class DcgmExporterCollector:
    """Scrape dcgm-exporter once per ``collect``; an unreachable endpoint yields no records and a warning."""

    def __init__(self, url: str, node: str, clock: Callable[[], int],
                 fetch: Callable[[str, float], bytes] = http_get, timeout_s: float = 5.0):
        self.url = url
        self.node = node
        self.clock = clock
        self.fetch = fetch
        self.timeout_s = timeout_s
        self.failures = 0
        self.parse_errors = 0

    def collect(self) -> list[GpuSample]:
        ts = self.clock()
        try:
            body = self.fetch(self.url, self.timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            self.failures += 1
            log.warning("dcgm-exporter scrape of %s failed: %s", self.url, exc)
            return []
        result = parse_exposition(body, node=self.node, ts=ts)
        self.parse_errors += len(result.report.skipped)
        return result.records


@register_collector("dcgm")
def _create(options: CollectorOptions) -> DcgmExporterCollector:
    return DcgmExporterCollector(options.url or DEFAULT_URL, options.node, options.clock,
                                 options.fetch or http_get)


@register_parser("dcgm")
def _parse_file(lines: Iterable[bytes], options: CollectorOptions) -> ParseResult:
    return parse_exposition(b"".join(lines), node=options.node or None, ts=options.clock())
