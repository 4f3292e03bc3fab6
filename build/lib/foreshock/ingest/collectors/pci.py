"""PCI bus ids in one canonical spelling, so kernel log, NVML and dcgm-exporter records join.

The kernel log writes ``0000:38:00`` (no function), NVML and dcgm-exporter ``00000000:38:00.0``
(32-bit domain). Foreshock writes ``0000:38:00.0``: 4-hex-digit domain when it fits, lower case,
function 0 when absent (a GPU is function 0).

>>> normalize_pci_bus_id("00000000:3B:00.0")
'0000:3b:00.0'
>>> normalize_pci_bus_id("PCI:0000:38:00")
'0000:38:00.0'
>>> normalize_pci_bus_id("nonsense") is None
True
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["normalize_pci_bus_id"]

_BUS_ID = re.compile(r"(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?")


@lru_cache(maxsize=4096)
def normalize_pci_bus_id(text: str) -> str | None:
    """Canonical ``dddd:bb:dd.f`` form of a PCI address, or ``None`` when ``text`` is not one."""
    match = _BUS_ID.fullmatch(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function or '0'}"
