"""The state tiers piece by piece: layout, double-buffered slots, the checksummed stream, the plan.

Two real gloo processes (``torch.multiprocessing``) carry the stream tests; the whole path under
torchrun with nodes killed is tests/e2e/test_drill.py.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from foreshock.mitigator.tiers.layout import Layout, pack, plan_layout, unpack
from foreshock.mitigator.tiers.memory import CHUNK_BYTES, SlotHeader, SlotPair, chunk_crcs
from foreshock.mitigator.tiers.recovery import Holding, plan_recovery
from foreshock.mitigator.tiers.transport import (
    CorruptStream,
    ProcessGroupTransport,
    recv_snapshot,
    send_snapshot,
)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(300, 7, generator=g), "b": torch.arange(5, dtype=torch.int16)},
            "optim": {"state": {"step": torch.tensor(3.0)}, "param_groups": [{"lr": 0.1, "params": ["w"]}]},
            "local": {"rng": torch.get_rng_state(), "loader": {"batches": 17}}, "tag": ("a", 1)}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def test_layout_packs_every_tensor_and_keeps_the_rest_bit_for_bit():
    state = _state(0)
    layout, tensors = plan_layout(state)
    assert all(s.offset % 64 == 0 for s in layout.slots)
    buf = torch.zeros(layout.nbytes, dtype=torch.uint8)
    pack(layout, tensors, buf)
    again = unpack(Layout.from_bytes(layout.to_bytes()), buf)
    assert _equal(again, state)
    with pytest.raises(ValueError, match="smaller"):
        pack(layout, tensors, torch.zeros(layout.nbytes - 1, dtype=torch.uint8))


def _write(pair: SlotPair, step: int, state: dict) -> None:
    layout, tensors = plan_layout(state)
    slot = pair.target()
    slot.invalidate()
    pack(layout, tensors, slot.buffer(layout.nbytes))
    slot.commit(SlotHeader(0, 1, step, layout))


def test_slots_alternate_and_a_copy_cut_short_leaves_the_previous_snapshot(tmp_path):
    pair = SlotPair(tmp_path, "own")
    _write(pair, 1, _state(1))
    _write(pair, 2, _state(2))
    assert [h.step for _, h in pair.committed()] == [2, 1]
    slot = pair.target()  # the older one: a crash after invalidate() and a partial copy ...
    slot.invalidate()
    slot.buffer(16).fill_(0xAB)
    assert [h.step for _, h in pair.committed()] == [2]  # ... leaves step 2 whole
    reopened = SlotPair(tmp_path, "own")  # a restarted worker maps the same files
    got_slot, header = reopened.newest()
    assert _equal(unpack(header.layout, got_slot.buffer(header.nbytes)), _state(2))
    reopened.drop_newer_than(1)
    assert reopened.newest() is None


def test_the_plan_takes_the_newest_step_every_shard_has_and_local_copies_first():
    held = [
        [Holding(0, 10, "own", 0), Holding(0, 9, "own", 1), Holding(1, 9, "replica", 0)],  # survivor
        [],  # the spare that took rank 1
    ]
    plan = plan_recovery(held)
    assert plan.step == 9  # rank 1's state exists only at step 9, in rank 0's replica
    assert [(t.shard, t.holder, t.tier) for t in plan.sources] == [(0, 0, "own"), (1, 0, "replica")]
    assert plan_recovery([[Holding(0, 10, "own", 0)], []]).step is None  # a pair lost: durable


def test_the_plan_follows_shards_to_new_ranks():
    held = [[], [Holding(0, 5, "own", 1), Holding(1, 5, "replica", 0)]]  # the survivor became rank 1
    plan = plan_recovery(held)
    assert plan.step == 5 and [(t.holder, t.tier) for t in plan.sources] == [(1, "own"), (1, "replica")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream_worker(rank: int, port: int, root: str, corrupt: bool, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        t = ProcessGroupTransport(dist.new_group(backend="gloo"))
        if rank == 0:
            pair = SlotPair(root, "own")
            state = {"w": torch.randn(3 * CHUNK_BYTES // 4 + 11, generator=torch.Generator().manual_seed(3))}
            _write(pair, 7, state)
            slot, header = pair.newest()
            buf = slot.buffer(header.nbytes)
            if corrupt:  # flip bytes after the CRCs were taken: a memory error in the stored copy
                header = SlotHeader(header.shard, header.world, header.step, header.layout,
                                    tuple(chunk_crcs(buf, header.nbytes)))
                buf[CHUNK_BYTES + 5] ^= 0xFF
            for p in send_snapshot(t, 1, header, buf):
                p.wait()
        else:
            target = SlotPair(root, "replica").target()
            try:
                header = recv_snapshot(t, 0, target)
                out["step"] = header.step
                out["w"] = unpack(header.layout, target.buffer(header.nbytes))["w"].clone()
            except CorruptStream as exc:
                out["corrupt"] = str(exc)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("corrupt", [False, True])
def test_a_snapshot_crosses_a_real_gloo_group_and_a_flipped_byte_is_caught(tmp_path, corrupt):
    manager = mp.get_context("spawn").Manager()
    out = manager.dict()
    mp.start_processes(_stream_worker, args=(_free_port(), str(tmp_path), corrupt, out), nprocs=2,
                       start_method="spawn")
    expected = torch.randn(3 * CHUNK_BYTES // 4 + 11, generator=torch.Generator().manual_seed(3))
    if corrupt:
        assert "chunks failed their CRC32C" in out["corrupt"] and "step" not in out
    else:
        assert out["step"] == 7 and torch.equal(out["w"], expected)
