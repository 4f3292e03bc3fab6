"""Moving a snapshot between ranks: a small transport interface and the chunked, checksummed stream.

The stream is a header (step, size, shard, layout length), the pickled layout, then the buffer in
chunks of :data:`~foreshock.mitigator.tiers.memory.CHUNK_BYTES`, each preceded by its step, index and CRC32C.
The receiver checks every chunk against its CRC and step; a stream that fails a check is read to
its end (so the next stream stays in step) and then rejected as a whole.

:class:`ProcessGroupTransport` sends over a dedicated ``torch.distributed`` process group. Tested
here: gloo over TCP on loopback (CPU tensors). The same class carries CUDA tensors over an NCCL
group, and an RDMA transport only has to implement :class:`Transport`'s two methods; neither
NCCL nor RDMA is exercised by the test suite (no GPU or InfiniBand is available there).
"""

from __future__ import annotations

from typing import Protocol

import crc32c
import torch
import torch.distributed as dist

from foreshock.mitigator.tiers.layout import Layout
from foreshock.mitigator.tiers.memory import Slot, SlotHeader, chunk_crcs, chunks

__all__ = ["Transport", "ProcessGroupTransport", "CorruptStream", "send_snapshot", "recv_snapshot"]


class CorruptStream(Exception):
    """A received snapshot failed its CRC or step check."""


class Pending(Protocol):
    def wait(self) -> object: ...


class Transport(Protocol):
    """Point-to-point tensor transfer between ranks of one job."""

    def send(self, tensor: torch.Tensor, dst: int) -> Pending:
        """Start sending ``tensor`` to rank ``dst``; the returned handle's ``wait`` blocks until sent."""
        ...

    def recv(self, tensor: torch.Tensor, src: int) -> Pending:
        """Start receiving from rank ``src`` into ``tensor``; ``wait`` blocks until it has arrived."""
        ...


class ProcessGroupTransport:
    """:class:`Transport` over a process group of its own (global ranks)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def send(self, tensor: torch.Tensor, dst: int) -> Pending:
        return dist.isend(tensor, dst, group=self.group)

    def recv(self, tensor: torch.Tensor, src: int) -> Pending:
        return dist.irecv(tensor, src, group=self.group)


def send_snapshot(t: Transport, dst: int, header: SlotHeader, buf: torch.Tensor) -> list[Pending]:
    """Post the whole stream of ``header``'s snapshot in ``buf`` to ``dst``; wait on the handles."""
    crcs = header.crcs or tuple(chunk_crcs(buf, header.nbytes))
    layout = torch.frombuffer(bytearray(header.layout.to_bytes()), dtype=torch.uint8)
    head = torch.tensor([header.step, header.nbytes, header.shard, layout.numel(), header.world])
    pending = [t.send(head, dst), t.send(layout, dst)]
    for i, (a, b) in enumerate(chunks(header.nbytes)):
        pending.append(t.send(torch.tensor([header.step, i, crcs[i]]), dst))
        pending.append(t.send(buf[a:b], dst))
    return pending


def recv_snapshot(t: Transport, src: int, slot: Slot) -> SlotHeader:
    """Receive a stream from ``src`` into ``slot`` and check it; the caller commits the header.

    Raises :class:`CorruptStream` after reading the whole stream if any chunk failed its check.
    Every chunk's receive is posted at once, so a chunk's CRC is computed while the next ones land.
    """
    head = torch.zeros(5, dtype=torch.int64)
    t.recv(head, src).wait()
    step, nbytes, shard, layout_len, world = (int(x) for x in head)
    raw = torch.empty(layout_len, dtype=torch.uint8)
    t.recv(raw, src).wait()
    layout = Layout.from_bytes(raw.numpy().tobytes())
    buf = slot.buffer(nbytes, touch=False)  # every byte is about to be written
    data = buf.numpy()
    spans = chunks(nbytes)
    frames = torch.zeros(len(spans), 3, dtype=torch.int64)
    posted = [(t.recv(frames[i], src), t.recv(buf[a:b], src)) for i, (a, b) in enumerate(spans)]
    crcs, bad = [], []
    for i, ((a, b), (frame_done, chunk_done)) in enumerate(zip(spans, posted, strict=True)):
        frame_done.wait()
        chunk_done.wait()
        got = crc32c.crc32c(data[a:b], gil_release_mode=1)
        if int(frames[i, 0]) != step or int(frames[i, 1]) != i or int(frames[i, 2]) != got:
            bad.append(i)
        crcs.append(got)
    if bad:
        raise CorruptStream(f"snapshot of rank {shard} at step {step} from rank {src}: "
                            f"{len(bad)} of {len(crcs)} chunks failed their CRC32C or step check "
                            f"(first {bad[0]})")
    return SlotHeader(shard=shard, world=world, step=step, layout=layout, crcs=tuple(crcs))
