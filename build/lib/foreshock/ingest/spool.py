"""A bounded first-in-first-out queue of outgoing messages on local disk, kept across restarts.

The collector's outbox (:mod:`foreshock.ingest.outbox`) holds what the broker has not acknowledged in
memory first; when that is full it appends here, so an outage longer than memory can hold does
not cost data, and a collector stopped while the broker is away leaves its backlog here for the
next start to send first.

Layout: segment files ``<sequence>.spool`` in one directory, read in sequence order. An entry is a
header (payload length, CRC-32 of the payload, record count) and a payload of messages (topic,
key, value). Appends go to the newest segment, which is rolled at ``segment_bytes``; the oldest
segment is read whole when it becomes the head and deleted once its last entry has been taken.
Disk use is the sum of the segment files, taken entries of the head segment included until that
file goes, and :meth:`Spool.room` keeps it within ``max_bytes``. A torn tail (the
process killed mid-write) or a corrupt entry fails its CRC; the rest of that segment is skipped
with a warning, never sent.

Delivery from a spool is at-least-once: entries taken from the head segment but not yet
acknowledged when the process dies are read again on the next start.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Entry", "Message", "Spool"]

log = logging.getLogger(__name__)

Message = tuple[str, str, bytes]
"""One message to publish: (topic, key, value)."""

_HEADER = struct.Struct(">III")  # payload length, crc32(payload), records
_FIELD = struct.Struct(">HHI")  # topic length, key length, value length
_SUFFIX = ".spool"
_FIRST_SEQUENCE = 10**12  # room below it for segments put back in front at shutdown (prepend)


@dataclass(slots=True)
class Entry:
    """What one poll produced: its messages, how many contract records they hold, and their size."""

    messages: list[Message]
    records: int

    @property
    def size(self) -> int:
        return _HEADER.size + sum(_FIELD.size + len(t) + len(k) + len(v) for t, k, v in self.messages)


def _encode(entry: Entry) -> bytes:
    parts = []
    for topic, key, value in entry.messages:
        t, k = topic.encode(), key.encode()
        parts += [_FIELD.pack(len(t), len(k), len(value)), t, k, value]
    payload = b"".join(parts)
    return _HEADER.pack(len(payload), zlib.crc32(payload), entry.records) + payload


def _decode_segment(data: bytes, name: str) -> list[Entry]:
    out: list[Entry] = []
    pos = 0
    while pos < len(data):
        if pos + _HEADER.size > len(data):
            log.warning("spool %s: torn entry at byte %d; the rest of the segment is skipped", name, pos)
            break
        length, crc, records = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size: pos + _HEADER.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            log.warning("spool %s: torn or corrupt entry at byte %d; the rest of the segment is skipped",
                        name, pos)
            break
        messages, at = [], 0
        while at < length:
            tl, kl, vl = _FIELD.unpack_from(payload, at)
            at += _FIELD.size
            topic, key = payload[at:at + tl].decode(), payload[at + tl:at + tl + kl].decode()
            at += tl + kl
            messages.append((topic, key, payload[at:at + vl]))
            at += vl
        out.append(Entry(messages, records))
        pos += _HEADER.size + length
    return out


def _count(data: bytes) -> tuple[int, int]:
    """(entries, records) of a segment from its headers alone."""
    entries = records = pos = 0
    while pos + _HEADER.size <= len(data):
        length, _, n = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size + length
        if pos > len(data):
            break
        entries, records = entries + 1, records + n
    return entries, records


class Spool:
    """Bounded on-disk FIFO of :class:`Entry`; not thread-safe (the outbox holds its lock around it)."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int | None = None):
        if max_bytes <= 0:
            raise ValueError("a spool needs a positive size")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        # Disk is only freed a whole segment at a time, so a segment is a small share of the bound.
        self.segment_bytes = segment_bytes or max(4096, min(1 << 20, max_bytes // 16))
        self._segments: deque[int] = deque(sorted(
            int(p.name.removesuffix(_SUFFIX)) for p in self.directory.glob("*" + _SUFFIX)
            if p.name.removesuffix(_SUFFIX).isdigit()))
        self._sizes = {s: self._path(s).stat().st_size for s in self._segments}
        self.entries = self.records = 0
        for s in self._segments:
            e, r = _count(self._path(s).read_bytes())
            self.entries, self.records = self.entries + e, self.records + r
        self._head: deque[Entry] | None = None  # the oldest segment, read whole, being taken from
        self._writing: int | None = None  # appends go here; never the segment being read
        if self.entries:
            log.info("spool %s: %d entries (%d records) left by an earlier run are sent first",
                     self.directory, self.entries, self.records)

    def _path(self, sequence: int) -> Path:
        return self.directory / f"{sequence:020d}{_SUFFIX}"

    @property
    def bytes(self) -> int:
        """Disk the segments take now."""
        return sum(self._sizes.values())

    def room(self, entry: Entry) -> bool:
        return self.bytes + entry.size <= self.max_bytes

    def __len__(self) -> int:
        return self.entries

    def append(self, entry: Entry) -> None:
        """Add ``entry`` after every other; the caller has checked :meth:`room`."""
        data = _encode(entry)
        if self._writing is None or self._sizes[self._writing] + len(data) > self.segment_bytes:
            self._writing = (self._segments[-1] + 1) if self._segments else _FIRST_SEQUENCE
            self._segments.append(self._writing)
            self._sizes[self._writing] = 0
        with open(self._path(self._writing), "ab") as f:
            f.write(data)
        self._sizes[self._writing] += len(data)
        self.entries += 1
        self.records += entry.records

    def prepend(self, entries: list[Entry]) -> None:
        """Put ``entries`` in front of everything (a shutdown's unsent memory), past the bound if need be:
        they were accepted already and are older than what the spool holds."""
        if not entries:
            return
        self._release_head()
        sequence = (self._segments[0] - 1) if self._segments else _FIRST_SEQUENCE
        data = b"".join(_encode(e) for e in entries)
        path = self._path(sequence)
        path.with_suffix(".partial").write_bytes(data)
        path.with_suffix(".partial").rename(path)  # a half-written prepend is never read as a segment
        self._segments.appendleft(sequence)
        self._sizes[sequence] = len(data)
        self.entries += len(entries)
        self.records += sum(e.records for e in entries)

    def peek(self) -> Entry | None:
        """The oldest entry, without taking it."""
        while self.entries:
            if self._head is None:
                first = self._segments[0]
                if first == self._writing:
                    self._writing = None  # seal it: appends start a new segment from now on
                data = self._path(first).read_bytes()
                self._head = deque(_decode_segment(data, self._path(first).name))
                counted, records = _count(data)  # a torn entry was counted but is not there
                self.entries -= counted - len(self._head)
                self.records -= records - sum(e.records for e in self._head)
            if self._head:
                return self._head[0]
            self._drop_head_segment()
        return None

    def pop(self) -> Entry | None:
        """Take the oldest entry; its segment file goes once its last entry is taken."""
        entry = self.peek()
        if entry is None:
            return None
        assert self._head is not None
        self._head.popleft()
        self.entries -= 1
        self.records -= entry.records
        if not self._head:
            self._drop_head_segment()
        return entry

    def _drop_head_segment(self) -> None:
        first = self._segments.popleft()
        self._path(first).unlink(missing_ok=True)
        del self._sizes[first]
        self._head = None

    def _release_head(self) -> None:
        """Rewrite the head segment without its taken entries, so a prepend in front of it does not
        resend them."""
        if self._head is None:
            return
        first = self._segments[0]
        data = b"".join(_encode(e) for e in self._head)
        path = self._path(first)
        path.with_suffix(".partial").write_bytes(data)
        path.with_suffix(".partial").rename(path)
        self._sizes[first] = len(data)
        self._head = None
