"""Kernel-log collector: follows ``/dev/kmsg``, ``journalctl -k -f -o json`` or a file, emits Xid events.

Each ``collect`` reads what the source has appended since the last call without blocking, turns
the lines into records (:mod:`foreshock.ingest.collectors.kernel_log`), folds Xid floods
(:mod:`foreshock.ingest.collectors.fold`) and returns the records to publish. ``drain`` hands over the
folded counts still held back (call it on shutdown).

Sources, all non-blocking and bounded per poll:

- :class:`DevKmsgSource` reads ``/dev/kmsg`` records (``prio,seq,usec,flags;message``); their
  timestamps are microseconds since boot, turned into wall time with the boot instant.
- :class:`JournalSource` runs ``journalctl -k -f -o json`` and reads ``MESSAGE`` and
  ``__REALTIME_TIMESTAMP`` (a non-UTF-8 ``MESSAGE`` arrives as a byte array and is decoded too).
- :class:`FileSource` replays a captured log from its start and then follows what is appended.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from foreshock.ingest.collectors.base import (
    MAX_LINE_CHARS,
    CollectorOptions,
    CollectorUnavailable,
    ParseReport,
    ParseResult,
    register_collector,
    register_parser,
)
from foreshock.ingest.collectors.fold import XidFolder
from foreshock.ingest.collectors.kernel_log import KernelLineParser
from foreshock.ingest.collectors.pci import normalize_pci_bus_id
from foreshock.ingest.collectors.xid_policy import load_xid_policy
from foreshock.ingest.contract import XidEvent

__all__ = ["LineSource", "DevKmsgSource", "JournalSource", "FileSource", "KernelLogCollector",
           "gpu_indexes_from_proc", "parse_kernel_log"]

Line = tuple[str, int | None]  # text, epoch ms when the source knows it
_MAX_BYTES_PER_POLL = 8 << 20


class LineSource(Protocol):
    def read_lines(self) -> list[Line]:
        """Lines appended since the previous call; never blocks."""
        ...

    def close(self) -> None: ...


def _decode(raw: bytes) -> str:
    return raw[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace")


class _LineSplitter:
    """Bytes in, complete lines out; a line longer than the cap is cut, never buffered whole."""

    def __init__(self, cap: int = MAX_LINE_CHARS * 4):
        self._buf = bytearray()
        self._cap = cap
        self._discarding = False

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        lines = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._cap:
                    if not self._discarding:
                        lines.append(bytes(self._buf[: self._cap]))
                    self._discarding = True
                    self._buf.clear()
                return lines
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if not self._discarding:
                lines.append(line)
            self._discarding = False

    def rest(self) -> list[bytes]:
        out = [bytes(self._buf)] if self._buf and not self._discarding else []
        self._buf.clear()
        return out


class FileSource:
    """A captured log file: read from the start, then follow appended lines (like ``tail -f``).

    A file truncated in place is read again from its start; a file replaced by rotation is not
    followed to its successor (point ``--path`` at /dev/kmsg or use ``--journal`` for live logs).
    """

    def __init__(self, path: Path):
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - held open across polls
        except OSError as exc:
            raise CollectorUnavailable(f"cannot open kernel log file {path}: {exc.strerror}.") from None
        self._lines = _LineSplitter()

    def read_lines(self) -> list[Line]:
        if os.fstat(self._file.fileno()).st_size < self._file.tell():  # truncated (copytruncate rotation)
            self._file.seek(0)
        chunk = self._file.read(_MAX_BYTES_PER_POLL)
        return [(_decode(raw), None) for raw in self._lines.feed(chunk or b"")]

    def close(self) -> None:
        self._file.close()


class DevKmsgSource:
    """``/dev/kmsg``: one record per read; ``from_start`` replays the kernel ring buffer first."""

    def __init__(self, path: Path = Path("/dev/kmsg"), *, from_start: bool = False,
                 clock: Callable[[], int] | None = None):
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise CollectorUnavailable(
                f"cannot read the kernel log at {path} ({exc.strerror}); run as root or use --journal."
            ) from None
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)
        now = clock() if clock else time.time_ns() // 1_000_000
        self._boot_ms = now - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000

    def read_lines(self) -> list[Line]:
        out: list[Line] = []
        budget = _MAX_BYTES_PER_POLL
        while budget > 0:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them; go on
                    continue
                raise
            if not record:
                break
            budget -= len(record)
            out.append(self._record(record))
        return out

    def _record(self, record: bytes) -> Line:
        header, _, body = record.partition(b";")
        fields = header.split(b",")
        ts = None
        if len(fields) >= 3 and fields[2].isdigit():
            ts = self._boot_ms + int(fields[2]) // 1000
        return _decode(body.split(b"\n", 1)[0]), ts

    def close(self) -> None:
        os.close(self._fd)


class _JournalEntry(msgspec.Struct):
    MESSAGE: str | list[int] | None = None
    realtime_us: str | None = msgspec.field(default=None, name="__REALTIME_TIMESTAMP")


_journal_decoder = msgspec.json.Decoder(_JournalEntry)


def journal_line(raw: bytes) -> Line | None:
    """One ``journalctl -o json`` line as (message, epoch ms); ``None`` when it is not an entry."""
    try:
        entry = _journal_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    message = entry.MESSAGE
    if isinstance(message, list):
        message = _decode(bytes(b & 0xFF for b in message[: MAX_LINE_CHARS * 4]))
    ts = entry.realtime_us
    return (message or "", int(ts) // 1000 if ts and ts.isdigit() else None)


class JournalSource:
    """Follow ``journalctl -k -f -o json`` (kernel messages from the systemd journal)."""

    def __init__(self, *, from_start: bool = False, argv: Iterable[str] | None = None):
        cmd = list(argv or ["journalctl", "-k", "-f", "-o", "json", "-n", "all" if from_start else "0"])
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise CollectorUnavailable(
                f"cannot run {cmd[0]} ({exc.strerror}); use --path /dev/kmsg."
            ) from None
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._lines = _LineSplitter()

    def read_lines(self) -> list[Line]:
        assert self._proc.stdout is not None
        try:
            chunk = os.read(self._proc.stdout.fileno(), _MAX_BYTES_PER_POLL)
        except BlockingIOError:
            return []
        return [line for raw in self._lines.feed(chunk) if (line := journal_line(raw)) is not None]

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def gpu_indexes_from_proc(root: Path = Path("/proc/driver/nvidia/gpus")) -> dict[str, int]:
    """Canonical PCI bus id -> GPU minor number, from the driver's ``<bus id>/information`` files."""
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for entry in root.iterdir():
        bus = normalize_pci_bus_id(entry.name)
        try:
            text = (entry / "information").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit() and bus:
                out[bus] = int(value)
    return out


class KernelLogCollector:
    """Poll a :class:`LineSource`, parse its lines and fold Xid floods."""

    def __init__(self, source: LineSource, parser: KernelLineParser, folder: XidFolder,
                 clock: Callable[[], int]):
        self.source = source
        self.parser = parser
        self.folder = folder
        self.clock = clock
        self.parse_errors = 0  # Xid lines it could not read (malformed, or over MAX_LINE_CHARS)

    def collect(self) -> list[Any]:
        out: list[Any] = []
        for text, ts in self.source.read_lines():
            record = self.parser.parse(text, ts)
            if record is None:
                if "NVRM: Xid" in text or len(text) > MAX_LINE_CHARS:
                    self.parse_errors += 1
                continue
            if isinstance(record, XidEvent):
                out.extend(self.folder.offer(record))
            else:
                out.append(record)
        out.extend(self.folder.expire(self.clock()))
        return out

    def drain(self) -> list[Any]:
        """What the source still has, then every held-back fold; closes the source."""
        out = self.collect()
        out.extend(self.folder.drain())
        self.source.close()
        return out


def _parser(options: CollectorOptions, bus_to_gpu: Mapping[str, int]) -> KernelLineParser:
    return KernelLineParser(options.node, load_xid_policy(options.xid_policy_override), bus_to_gpu,
                            options.clock)


@register_collector("kmsg")
def _create(options: CollectorOptions) -> KernelLogCollector:
    if options.journal:
        source: LineSource = JournalSource()
    elif options.path is None or options.path.is_char_device():
        source = DevKmsgSource(options.path or Path("/dev/kmsg"), clock=options.clock)
    else:
        source = FileSource(options.path)
    parser = _parser(options, gpu_indexes_from_proc(options.nvidia_proc_root))
    return KernelLogCollector(source, parser, XidFolder(options.fold_window_ms), options.clock)


@register_parser("kmsg")
def parse_kernel_log(lines: Iterable[bytes], options: CollectorOptions) -> ParseResult:
    """Records of a captured kernel log (Xid floods folded as the collector would) and a report.

    The capture comes from another machine, so no local bus-id map applies: ``gpu`` stays unset.
    """
    parser = _parser(options, {})
    folder = XidFolder(options.fold_window_ms)
    report = ParseReport()
    records: list[Any] = []
    for number, raw in enumerate(lines, start=1):
        report.read += 1
        text = _decode(raw.rstrip(b"\r\n"))
        if not text.strip():
            continue
        record = parser.parse(text)
        if record is None:
            report.skipped.append(number)
            continue
        report.parsed += 1
        records.extend(folder.offer(record) if isinstance(record, XidEvent) else [record])
    records.extend(folder.drain())
    return ParseResult(records, report)
