"""Xid flood folding: a failing GPU can log the same Xid line hundreds of thousands of times.

The first occurrence of an Xid (same node, bus id, code, process and message) goes out at once,
so a fatal Xid is never delayed. Repeats of it within ``window_ms`` of that first one are only
counted; when the window closes they leave as one event with ``count`` = number of repeats and
``first_ts``/``last_ts`` spanning them. The sum of ``count`` over everything emitted equals the
number of lines seen: nothing is lost, and a flood costs at most two bus records per window.

Windows close on event time (``offer``) or wall time (``expire(now_ms)``, called each poll), and
all at once on ``drain`` (shutdown). At most ``max_open`` windows are held; past that the oldest
closes early, so memory stays bounded whatever the kernel log does.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from foreshock.ingest.contract import XidEvent

__all__ = ["XidFolder"]

_Key = tuple[str, str | None, int | None, int, int | None, str | None, str]


@dataclass(slots=True)
class _Window:
    start_ts: int
    template: XidEvent
    repeats: int = 0
    first_ts: int = 0
    last_ts: int = 0

    def folded(self) -> XidEvent | None:
        if not self.repeats:
            return None
        return msgspec.structs.replace(self.template, ts=self.first_ts, count=self.repeats,
                                       first_ts=self.first_ts, last_ts=self.last_ts)


class XidFolder:
    """Fold repeats of identical Xid events within ``window_ms`` into one counted event."""

    def __init__(self, window_ms: int = 10_000, max_open: int = 10_000):
        if window_ms < 0 or max_open < 1:
            raise ValueError("window_ms must be >= 0 and max_open >= 1")
        self.window_ms = window_ms
        self.max_open = max_open
        self._open: dict[_Key, _Window] = {}  # insertion order = opening order

    def offer(self, event: XidEvent) -> list[XidEvent]:
        """Events to emit now because of ``event`` (itself if new, a closed window if expired)."""
        if event.count != 1:  # already folded upstream: pass through
            return [event]
        key = (event.node, event.pci_bus_id, event.gpu, event.xid, event.pid, event.process, event.message)
        window = self._open.get(key)
        out: list[XidEvent] = []
        if window is not None and event.ts - window.start_ts < self.window_ms:
            if not window.repeats:
                window.first_ts = event.ts
            window.repeats += 1
            window.last_ts = event.ts
            return out
        if window is not None:
            del self._open[key]
            folded = window.folded()
            if folded is not None:
                out.append(folded)
        if len(self._open) >= self.max_open:
            oldest = next(iter(self._open))
            folded = self._open.pop(oldest).folded()
            if folded is not None:
                out.append(folded)
        self._open[key] = _Window(start_ts=event.ts, template=event)
        out.append(event)
        return out

    def expire(self, now_ms: int) -> list[XidEvent]:
        """Close the windows that started ``window_ms`` or more before ``now_ms``."""
        out: list[XidEvent] = []
        for key in [k for k, w in self._open.items() if now_ms - w.start_ts >= self.window_ms]:
            folded = self._open.pop(key).folded()
            if folded is not None:
                out.append(folded)
        return out

    def drain(self) -> list[XidEvent]:
        """Close every window (shutdown): the held repeat counts leave as folded events."""
        out = [f for w in self._open.values() if (f := w.folded()) is not None]
        self._open.clear()
        return out
