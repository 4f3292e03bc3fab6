"""Node-local host memory that outlives a worker restart: double-buffered snapshot slots.

Under torchrun a failure anywhere restarts *every* worker, so state held in a worker's own heap
would die with the healthy ranks too. The memory tier therefore lives in files on a node-local
tmpfs (``/dev/shm`` by default: RAM, not disk), mapped into the worker as tensors; a restarted
worker maps them again and finds its snapshot intact, and only the loss of the node loses them.
nvidia-resiliency-ext's local checkpoints make the same choice.

A :class:`SlotPair` keeps two slots so that a failure in the middle of a copy always leaves the
previous snapshot whole: a slot's header is removed before its buffer is written and written back
(atomically) only after the copy is complete, so a slot with a header is a complete snapshot.

With CUDA the buffers are registered as pinned memory (``cudaHostRegister``), so a copy from the
GPU runs on a side stream at full PCIe speed; without CUDA (this project's CI) copies are plain.
The CUDA path is not exercised by the test suite: no GPU is available there.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import crc32c
import torch

from foreshock.mitigator.tiers.layout import Layout

__all__ = ["CHUNK_BYTES", "SlotHeader", "Slot", "SlotPair", "chunk_crcs", "chunks"]

CHUNK_BYTES = 8 << 20


def chunks(nbytes: int, size: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of a buffer of ``nbytes``."""
    return [(s, min(s + size, nbytes)) for s in range(0, nbytes, size)]


def chunk_crcs(buf: torch.Tensor, nbytes: int) -> list[int]:
    """CRC32C (Castagnoli, hardware-accelerated) of each chunk; releases the GIL while it runs."""
    data = buf.numpy()
    return [crc32c.crc32c(data[a:b], gil_release_mode=1) for a, b in chunks(nbytes)]


@dataclass(frozen=True, slots=True)
class SlotHeader:
    """What a slot holds: ``shard`` (the rank whose state it is) at ``step`` in a ``world``-rank job."""

    shard: int
    world: int
    step: int
    layout: Layout
    crcs: tuple[int, ...] = field(default=())

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes


class Slot:
    """One buffer file and its header file."""

    def __init__(self, path: Path, pin: bool):
        self.path, self.pin = path, pin
        self._header_path = path.with_suffix(".header")
        self._buf: torch.Tensor | None = None
        self._registered = False
        self._cached: tuple[tuple[int, int, int], SlotHeader | None] | None = None

    @property
    def header(self) -> SlotHeader | None:
        """The committed header, or None if the slot holds no complete snapshot.

        Read again only when the file changed (every commit renames a new file into place), since a
        header holds the whole layout and a model with thousands of tensors makes it large.
        """
        try:
            st = self._header_path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._cached is None or self._cached[0] != key:
                header = pickle.loads(self._header_path.read_bytes())
                self._cached = (key, header if isinstance(header, SlotHeader) else None)
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            return None
        return self._cached[1]

    def invalidate(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._header_path.unlink()

    def buffer(self, nbytes: int, *, touch: bool = True) -> torch.Tensor:
        """The slot's buffer, at least ``nbytes`` long (grown when it is smaller).

        ``touch`` faults every page of a new buffer in at once, so the first snapshot's copy (the
        part that stalls training) does not pay for it; a receive, which writes every byte off the
        training path, skips it.
        """
        if self._buf is None and self.path.exists():
            self._map(self.path.stat().st_size)
        if self._buf is None or self._buf.numel() < nbytes:
            self._unmap()
            with open(self.path, "wb") as f:
                f.truncate(nbytes)
            self._map(nbytes)
            if touch:
                self._buf.fill_(0)
        return self._buf

    def commit(self, header: SlotHeader) -> None:
        """Publish ``header``: from now on the slot counts as a complete snapshot."""
        tmp = self._header_path.with_name(f".{self._header_path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, self._header_path)

    def _map(self, nbytes: int) -> None:
        self._buf = torch.from_file(str(self.path), shared=True, size=nbytes, dtype=torch.uint8)
        if self.pin and torch.cuda.is_available():
            torch.cuda.cudart().cudaHostRegister(self._buf.data_ptr(), nbytes, 0)
            self._registered = True

    def _unmap(self) -> None:
        if self._buf is not None and self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._buf.data_ptr())
        self._buf, self._registered = None, False


class SlotPair:
    """Two slots in ``root/name``: write into the older one, so the newer one is never touched."""

    def __init__(self, root: str | Path, name: str, *, pin: bool = False):
        folder = Path(root) / name
        folder.mkdir(parents=True, exist_ok=True)
        self.slots = (Slot(folder / "slot-0.bin", pin), Slot(folder / "slot-1.bin", pin))

    def committed(self) -> list[tuple[Slot, SlotHeader]]:
        """Slots holding a complete snapshot, newest step first."""
        found = [(s, h) for s in self.slots if (h := s.header) is not None]
        return sorted(found, key=lambda sh: sh[1].step, reverse=True)

    def newest(self) -> tuple[Slot, SlotHeader] | None:
        found = self.committed()
        return found[0] if found else None

    def target(self) -> Slot:
        """The slot the next snapshot goes into: an empty one, else the one with the older step."""
        headers = [s.header for s in self.slots]
        if headers[0] is None or headers[1] is None:
            return self.slots[0] if headers[0] is None else self.slots[1]
        return self.slots[0] if headers[0].step <= headers[1].step else self.slots[1]

    def drop_newer_than(self, step: int) -> None:
        """Forget snapshots of a timeline the job has rolled back from."""
        for slot, header in self.committed():
            if header.step > step:
                slot.invalidate()

    def add_crcs(self, slot: Slot, crcs: list[int]) -> None:
        """Record the CRCs the replicator computed, so a local restore can verify the slot too."""
        header = slot.header
        if header is not None and not header.crcs:
            slot.commit(replace(header, crcs=tuple(crcs)))
