"""The peer tier: every rank's newest memory snapshot, copied into the host memory of a buddy rank.

The buddy of rank ``r`` is ``r + ranks_per_node`` (mod world), the rank in the same position on
the next node, so the loss of one node never takes a snapshot and its replica together (this is
nvidia-resiliency-ext's clique replication with the jump set to the blast radius). Every rank
sends its snapshot to its buddy and receives its ward's (``r - ranks_per_node``) in one *round*.

Rounds run on a background thread so training goes on while bytes move. The hook starts a round
only when every rank's replicator is idle (its per-step all-reduce carries the flag), so rounds
pair up across ranks without any extra handshake, and the snapshot a round sends is never
overwritten while it is on the wire (a new snapshot waits for the round before it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

from foreshock.mitigator.tiers.memory import Slot, SlotHeader, SlotPair, chunk_crcs
from foreshock.mitigator.tiers.transport import CorruptStream, Transport, recv_snapshot, send_snapshot

__all__ = ["buddy_of", "ward_of", "RoundStats", "PeerReplicator"]

log = logging.getLogger(__name__)


def buddy_of(rank: int, world: int, ranks_per_node: int) -> int:
    """The rank that keeps ``rank``'s replica."""
    return (rank + ranks_per_node) % world


def ward_of(rank: int, world: int, ranks_per_node: int) -> int:
    """The rank whose replica ``rank`` keeps."""
    return (rank - ranks_per_node) % world


@dataclass(frozen=True, slots=True)
class RoundStats:
    step: int
    sent_bytes: int
    received_bytes: int
    seconds: float
    received_ok: bool


class PeerReplicator:
    """Runs replication rounds on a thread; see the module docstring."""

    def __init__(self, transport: Transport, rank: int, world: int, ranks_per_node: int,
                 own: SlotPair, replicas: SlotPair):
        self.transport, self.own, self.replicas = transport, own, replicas
        self.buddy = buddy_of(rank, world, ranks_per_node)
        self.ward = ward_of(rank, world, ranks_per_node)
        self.enabled = self.buddy != rank  # one node: nowhere else to keep a copy
        self._jobs: queue.Queue[tuple[Slot, SlotHeader] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self.rounds: list[RoundStats] = []
        self._thread = threading.Thread(target=self._run, name="foreshock-peer", daemon=True)
        if self.enabled:
            self._thread.start()

    @property
    def idle(self) -> bool:
        return self._idle.is_set()

    def submit(self, slot: Slot, header: SlotHeader) -> None:
        """Start a round that sends ``slot`` (committed with ``header``) to the buddy."""
        self.check()
        if not self.enabled:
            return
        self._idle.clear()
        self._jobs.put((slot, header))

    def wait(self) -> None:
        """Block until the round in flight has ended."""
        self._idle.wait()
        self.check()

    def check(self) -> None:
        """Raise the error that ended a round (a peer lost mid-round ends the worker: recovery follows)."""
        if self._error is not None:
            raise RuntimeError(f"peer replication failed: {self._error}") from self._error

    def close(self) -> None:
        if self.enabled and self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self.rounds.append(self._round(*job))
            except BaseException as exc:  # noqa: BLE001 - reported to the training thread by check()
                self._error = exc
                log.error("peer replication round failed: %s", exc)
            finally:
                self._idle.set()

    def _round(self, slot: Slot, header: SlotHeader) -> RoundStats:
        started = time.perf_counter()
        buf = slot.buffer(header.nbytes)
        if not header.crcs:
            crcs = chunk_crcs(buf, header.nbytes)
            self.own.add_crcs(slot, crcs)
            header = SlotHeader(header.shard, header.world, header.step, header.layout, tuple(crcs))
        pending = send_snapshot(self.transport, self.buddy, header, buf)
        target = self.replicas.target()
        target.invalidate()
        ok, received = True, 0
        try:
            got = recv_snapshot(self.transport, self.ward, target)
            target.commit(got)
            received = got.nbytes
        except CorruptStream as exc:
            ok = False
            log.error("replica rejected, the previous one is kept: %s", exc)
        for p in pending:
            p.wait()
        return RoundStats(header.step, header.nbytes, received, time.perf_counter() - started, ok)
