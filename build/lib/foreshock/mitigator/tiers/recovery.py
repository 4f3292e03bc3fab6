"""After a failure: agree on the newest step every rank can restore from memory, then fetch it.

Every rank lists what its node holds (its own snapshots and the replicas it keeps for its ward)
and the lists are gathered. The step chosen is the newest one held, somewhere, for *every* rank's
shard: the all-reduce of MIN over each rank's best step, done over the gathered lists because
torchrun may hand out ranks in a new order after a re-rendezvous (a spare can take any rank, and
a survivor may hold its old shard under a new rank). Each rank then loads its shard locally when
its node holds it (``memory``), or receives it from the rank that does (``peer``). A rank that
finds a CRC mismatch makes the whole job fall back to the durable tier; so does a shard that no
node holds, such as one whose node and buddy were lost together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from foreshock.mitigator.tiers.memory import Slot, SlotHeader, SlotPair, chunk_crcs
from foreshock.mitigator.tiers.transport import CorruptStream, Transport, recv_snapshot, send_snapshot

__all__ = ["Holding", "Source", "RecoveryPlan", "inventory", "plan_recovery", "fetch"]

Tier = Literal["own", "replica"]
Source = Literal["memory", "peer", "durable"]


@dataclass(frozen=True, slots=True)
class Holding:
    """One complete snapshot a node holds: ``shard``'s state at ``step``, in which slot."""

    shard: int
    step: int
    tier: Tier
    slot: int


@dataclass(frozen=True, slots=True)
class Transfer:
    """Where rank ``shard`` gets its state from: ``holder``'s ``tier`` slot ``slot``."""

    shard: int
    holder: int
    tier: Tier
    slot: int


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """The agreed step (None: memory cannot restore every rank) and each rank's source."""

    step: int | None
    sources: tuple[Transfer, ...] = ()


def inventory(own: SlotPair, replicas: SlotPair, world: int) -> list[Holding]:
    """The complete snapshots of a ``world``-rank job that this rank's node holds."""
    out = []
    for tier, pair in (("own", own), ("replica", replicas)):
        for i, slot in enumerate(pair.slots):
            h = slot.header
            if h is not None and h.world == world:
                out.append(Holding(h.shard, h.step, tier, i))
    return out


def plan_recovery(held: list[list[Holding]]) -> RecoveryPlan:
    """The plan every rank computes alike from the gathered inventories (``held[rank]``)."""
    world = len(held)
    steps = [{h.step for hs in held for h in hs if h.shard == shard} for shard in range(world)]
    common = set.intersection(*steps) if steps else set()
    if not common:
        return RecoveryPlan(None)
    step = max(common)
    sources = []
    for shard in range(world):
        candidates = [(rank, h) for rank, hs in enumerate(held) for h in hs
                      if h.shard == shard and h.step == step]
        # the rank itself first (no transfer), then the lowest rank, own slots before replicas
        rank, h = min(candidates, key=lambda c: (c[0] != shard, c[0], c[1].tier != "own"))
        sources.append(Transfer(shard, rank, h.tier, h.slot))
    return RecoveryPlan(step, tuple(sources))


def _pair(tier: Tier, own: SlotPair, replicas: SlotPair) -> SlotPair:
    return own if tier == "own" else replicas


def fetch(plan: RecoveryPlan, rank: int, transport: Transport, own: SlotPair,
          replicas: SlotPair) -> tuple[Slot, SlotHeader, Source]:
    """Execute this rank's part of ``plan``: serve the shards it holds, get its own, check the CRCs.

    Returns the slot holding this rank's state (committed as its own snapshot when received) and
    where it came from. Raises :class:`CorruptStream` on a CRC mismatch.
    """
    assert plan.step is not None
    serving = [t for t in plan.sources if t.holder == rank and t.shard != rank]
    sent_from = {(t.tier, t.slot) for t in serving}
    pending = []
    for t in serving:
        slot = _pair(t.tier, own, replicas).slots[t.slot]
        header = slot.header
        if header is None or header.step != plan.step:
            raise CorruptStream(f"slot {t.tier}/{t.slot} changed under the recovery plan")
        pending += send_snapshot(transport, t.shard, header, slot.buffer(header.nbytes))
    mine = plan.sources[rank]
    if mine.holder == rank:
        slot = _pair(mine.tier, own, replicas).slots[mine.slot]
        header = slot.header
        if header is None or header.step != plan.step or header.shard != rank:
            raise CorruptStream(f"slot {mine.tier}/{mine.slot} changed under the recovery plan")
        if header.crcs and tuple(chunk_crcs(slot.buffer(header.nbytes), header.nbytes)) != header.crcs:
            raise CorruptStream(f"local {mine.tier} snapshot of rank {rank} at step {plan.step} "
                                "fails its CRC32C")
        source: Source = "memory" if mine.tier == "own" else "peer"
    else:
        free = [own.slots[i] for i in range(2) if ("own", i) not in sent_from]
        if not free:
            raise CorruptStream("both own slots are being served: no room to receive this rank's state")
        target = own.target() if own.target() in free else free[0]
        target.invalidate()
        try:
            header = recv_snapshot(transport, mine.holder, target)
        finally:
            for p in pending:
                p.wait()
            pending = []
        if header.shard != rank or header.step != plan.step:
            raise CorruptStream(f"rank {mine.holder} sent rank {header.shard}'s step {header.step}, "
                                f"not rank {rank}'s step {plan.step}")
        target.commit(header)
        slot, source = target, "peer"
    for p in pending:
        p.wait()
    return slot, header, source
