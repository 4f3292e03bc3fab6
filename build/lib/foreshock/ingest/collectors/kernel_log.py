"""Kernel-log lines to contract records: NVIDIA Xid lines, "fallen off the bus", mlx5 link-down.

Recognised (verbatim shapes from real logs, see tests/data/collectors/SOURCES.md):

- ``NVRM: Xid (PCI:0000:38:00): 13, pid=2519562, name=python3, Graphics Exception: ...``
  (also ``pid='<unknown>', name=<unknown>``, no pid at all, or ``(0000:03:00)`` without ``PCI:``)
  -> :class:`XidEvent` with code, canonical bus id, GPU index (from the bus-id map), pid,
  process name, the rest of the line as message, and the policy's severity and action.
- ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` -> XidEvent 79 (what that code means).
- ``mlx5_core 0000:08:00.7 ens9f0v5: Link down`` (and ``Link is Down``) ->
  :class:`LinkSample` with ``state="DOWN"`` for that interface.

Anything else yields ``None``. The hot path is one substring test per line and, only for the
few lines that pass it, one compiled pattern; lines longer than ``MAX_LINE_CHARS`` are skipped
unread, so arbitrary input costs bounded time per line and never raises.

Timestamps come from the source (kmsg, journal) or from the line's own prefix: ISO 8601
(``2024-11-15T12:02:03,470068+00:00``, as ``dmesg --time-format iso`` writes) or ctime
(``[Fri Aug 30 11:43:09 2024]``, ``dmesg -T``, read as UTC). Seconds-since-boot prefixes carry
no date, so such lines take the collector's clock.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Mapping

from foreshock.ingest.collectors.base import MAX_LINE_CHARS
from foreshock.ingest.collectors.pci import normalize_pci_bus_id
from foreshock.ingest.collectors.xid_policy import XidPolicy
from foreshock.ingest.contract import LinkSample, XidEvent

__all__ = ["KernelLineParser", "line_timestamp_ms"]

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?)\): (\d{1,6})\b"
)
_PID_NAME = re.compile(r", pid=(?:'<unknown>'|(\d{1,10}))(?:, name=(<unknown>|[^,]*))?")
_FALLEN = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?):"
    r" GPU has fallen off the bus"
)
_LINK_DOWN = re.compile(
    r"\b(mlx5_core|mlx5_ib|infiniband) ([\w:.\-]+?)(?: ([\w.\-]+))?: Link (?:is )?[Dd]own\b"
)
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_CTIME = re.compile(r"\[(?:\w{3} )?(\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\]")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                         "Nov", "Dec"), start=1)}
_MAX_TS = 2**53
_MAX_XID = 100_000
_FALLEN_XID = 79


def line_timestamp_ms(prefix: str) -> int | None:
    """Epoch ms from a log line's prefix (ISO 8601 or dmesg -T ctime form), else ``None``.

    >>> line_timestamp_ms("2024-11-15T12:02:03,470068+00:00 ")
    1731672123470
    >>> line_timestamp_ms("[Fri Aug 30 11:43:09 2024] ")
    1725018189000
    """
    m = _ISO.search(prefix)
    if m is not None:
        year, month, day, hh, mm, ss, frac, tz = m.groups()
        if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31 and int(hh) < 24 and int(mm) < 60
                and int(ss) < 61):
            return None
        seconds = calendar.timegm((int(year), int(month), int(day), int(hh), int(mm), int(ss)))
        if tz and tz != "Z":
            sign = -1 if tz[0] == "+" else 1
            digits = tz[1:].replace(":", "")
            seconds += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        ms = seconds * 1000 + (int(frac[:3].ljust(3, "0")) if frac else 0)
        return ms if 0 <= ms <= _MAX_TS else None
    m = _CTIME.search(prefix)
    if m is not None:
        month_name, day, hh, mm, ss, year = m.groups()
        month = _MONTHS.get(month_name)
        if month is None or not (1 <= int(day) <= 31 and int(hh) < 24 and int(mm) < 60 and int(ss) < 61):
            return None
        ms = calendar.timegm((int(year), month, int(day), int(hh), int(mm), int(ss))) * 1000
        return ms if 0 <= ms <= _MAX_TS else None
    return None


class KernelLineParser:
    """Turn one kernel-log line into an XidEvent, a LinkSample or ``None``.

    ``bus_to_gpu`` maps canonical PCI bus ids to GPU indexes (missing ids leave ``gpu`` unset);
    ``clock`` stamps lines whose source and prefix carry no wall time.
    """

    def __init__(self, node: str, policy: XidPolicy, bus_to_gpu: Mapping[str, int],
                 clock: Callable[[], int]):
        self.node = node
        self.policy = policy
        self.bus_to_gpu = {normalize_pci_bus_id(k) or k: v for k, v in bus_to_gpu.items()}
        self.clock = clock

    def parse(self, line: str, ts: int | None = None) -> XidEvent | LinkSample | None:
        """The record this line stands for; ``ts`` is the source's timestamp when it has one."""
        if len(line) > MAX_LINE_CHARS:
            return None
        at = line.find("NVRM: ")
        if at >= 0:
            return self._nvrm(line, at, ts)
        if "own" in line and "Link" in line:
            return self._link_down(line, ts)
        return None

    def _stamp(self, line: str, at: int, ts: int | None) -> int:
        if ts is None:
            ts = line_timestamp_ms(line[:at]) if at > 0 else None
        return ts if ts is not None else self.clock()

    def _nvrm(self, line: str, at: int, ts: int | None) -> XidEvent | None:
        m = _XID.match(line, at)
        if m is not None:
            xid = int(m.group(2))
            if xid > _MAX_XID:
                return None
            rest = line[m.end():]
            pid = process = None
            pm = _PID_NAME.match(rest)
            if pm is not None:
                pid = int(pm.group(1)) if pm.group(1) else None
                name = pm.group(2)
                process = name if name and name != "<unknown>" else None
                rest = rest[pm.end():]
            return self._event(line, at, ts, xid, m.group(1), pid, process, rest.lstrip(", ").rstrip())
        m = _FALLEN.match(line, at)
        if m is not None:
            return self._event(line, at, ts, _FALLEN_XID, m.group(1), None, None,
                               "GPU has fallen off the bus.")
        return None

    def _event(self, line: str, at: int, ts: int | None, xid: int, bus: str, pid: int | None,
               process: str | None, message: str) -> XidEvent:
        bus_id = normalize_pci_bus_id(bus)
        rule = self.policy.lookup(xid)
        return XidEvent(node=self.node, ts=self._stamp(line, at, ts), xid=xid,
                        gpu=self.bus_to_gpu.get(bus_id) if bus_id else None, pci_bus_id=bus_id,
                        pid=pid, process=process, message=message,
                        severity=rule.severity, action=rule.action)

    def _link_down(self, line: str, ts: int | None) -> LinkSample | None:
        m = _LINK_DOWN.search(line)
        if m is None:
            return None
        driver, device, ifname = m.groups()
        port = ifname or device
        kind = "ib" if driver != "mlx5_core" or port.startswith("ib") else "eth"
        return LinkSample(node=self.node, ts=self._stamp(line, m.start(), ts), port=port, kind=kind,
                          state="DOWN")
