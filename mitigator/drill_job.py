"""The fire drill's training job: one model shard per rank under torchrun, with :class:`TrainingHook`.

Run by ``foreshock drill`` (one torchrun agent per simulated node)::

    python -m torch.distributed.run --nnodes=2:2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 -m foreshock.mitigator.drill_job \\
        --drill-node A --control-dir C --ckpt-dir K \\
        --memory-dir M --progress P --state-mb 256

Each rank owns a different parameter shard (as with ZeRO or FSDP, so a lost rank's state exists
nowhere else but in its tiers) of ``--state-mb`` MiB together with its SGD momentum, draws its
batch from the global RNG and a dataloader position (both restored by the hook), and joins the
other ranks in a global gradient-norm all-reduce every step, as clipping does. The job is
deterministic: a recovered run must reproduce an uninterrupted one bit for bit.

Every rank appends one JSON line per event to ``--progress``: ``start`` (the process began),
``ready`` (process group and hook built), ``resume`` (state restored: step, source, CRC32C of
the parameters), ``step`` (after each optimizer step, with the parameters' CRC32C and the stall
of a snapshot taken at that step), ``failed`` (a collective raised: the failure was detected).
"""

from __future__ import annotations

import time

_STARTED_MS = time.time_ns() // 1_000_000  # before torch is imported: worker start-up is measured from here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402

import crc32c  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from foreshock.mitigator.channels import FileChannel  # noqa: E402
from foreshock.mitigator.hook import TrainingHook, exit_on_failure  # noqa: E402

__all__ = ["main", "Shard", "Position", "train_step"]

ROW = 4096  # parameters per batch row: the batch is one row broadcast over the shard


def _log(path: str, **fields) -> None:
    line = json.dumps({"ts_ms": time.time_ns() // 1_000_000, "pid": os.getpid(), **fields}) + "\n"
    with open(path, "a") as f:  # one short O_APPEND write per line: lines from ranks do not interleave
        f.write(line)


class Shard(torch.nn.Module):
    """A rank's own stage of the model: ``state_mb`` MiB with its momentum, so half of it is parameters.

    Named by rank (``stages.1.weight`` …) as a pipeline stage's layers are, so that DCP, which
    takes equal names on different ranks for copies of one tensor, keeps every rank's stage.
    """

    def __init__(self, state_mb: int, rank: int):
        super().__init__()
        n = max(ROW, (state_mb << 20) // 8 // ROW * ROW)
        gen = torch.Generator().manual_seed(1000 + rank)
        stage = torch.nn.Module()
        stage.weight = torch.nn.Parameter(torch.randn(n // ROW, ROW, generator=gen))
        self.stages = torch.nn.ModuleDict({str(rank): stage})

    @property
    def weight(self) -> torch.nn.Parameter:
        return next(iter(self.stages.values())).weight

    def crc(self) -> int:
        return crc32c.crc32c(self.weight.detach().numpy())


class Position:
    """The dataloader's position: how many batches it has handed out (restored by the hook)."""

    def __init__(self):
        self.batches = 0

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = int(state["batches"])


def train_step(shard: Shard, optimizer: torch.optim.Optimizer, loader: Position) -> float:
    """One deterministic step: a batch from the RNG and the loader, a clipped gradient, an update."""
    batch = torch.randn(ROW) * (1.0 + loader.batches % 7)
    loader.batches += 1
    loss = (shard.weight - batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    sq = shard.weight.grad.pow(2).sum().reshape(1)
    dist.all_reduce(sq)  # the global gradient norm couples the ranks, as clipping does
    shard.weight.grad.mul_(torch.clamp(1.0 / (sq.sqrt() + 1e-12), max=1.0))
    optimizer.step()
    return loss.item()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job", default="drill")
    p.add_argument("--drill-node", dest="node", required=True, help="this agent's node name")
    p.add_argument("--control-dir", required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--memory-dir", required=True, help="this node's memory tier (node-local tmpfs)")
    p.add_argument("--progress", required=True)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--state-mb", type=int, default=64, help="parameters + momentum per rank, MiB")
    p.add_argument("--memory-every", type=int, default=1, help="memory snapshot every N steps")
    p.add_argument("--durable-every", type=int, default=50, help="durable snapshot every N steps (0: never)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra simulated compute per step")
    args = p.parse_args(argv)

    _log(args.progress, event="start", node=args.node, ts_ms=_STARTED_MS)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    shard = Shard(args.state_mb, rank)
    optimizer = torch.optim.SGD(shard.parameters(), lr=0.05, momentum=0.9)
    loader = Position()
    hook = TrainingHook(args.job, args.node, FileChannel(args.control_dir), args.ckpt_dir, model=shard,
                        optimizer=optimizer, dataloader=loader, memory_every=args.memory_every,
                        durable_every=args.durable_every, memory_dir=args.memory_dir,
                        status_root=args.control_dir,
                        on_peer_lost=lambda why: _log(args.progress, event="failed", node=args.node,
                                                      rank=rank, error=f"heartbeat: {why}"))
    _log(args.progress, event="ready", node=args.node, rank=rank)
    try:
        start = hook.resume()
        _log(args.progress, event="resume", step=start, node=args.node, rank=rank, world=world,
             crc=shard.crc(), **{k: v for k, v in hook.restored.items() if k != "step"})
        rounds_logged = 0
        for step in range(start, args.steps):
            loss = train_step(shard, optimizer, loader)
            time.sleep(args.step_seconds)
            # logged before step_end: a leave command ends the process inside it
            _log(args.progress, event="step", step=step + 1, node=args.node, rank=rank, world=world,
                 loss=round(loss, 6), crc=shard.crc())
            snapshots, saves = len(hook.stall_s), len(hook.durable.completed)
            hook.step_end(step + 1)
            extra = {}
            if len(hook.stall_s) > snapshots:
                extra["stall_ms"] = round(hook.stall_s[-1] * 1000, 3)
            if hook.replicator and len(hook.replicator.rounds) > rounds_logged:
                r = hook.replicator.rounds[-1]  # the thread appends while we read: log the newest
                rounds_logged = len(hook.replicator.rounds)
                extra["round"] = {"step": r.step, "bytes": r.sent_bytes, "seconds": round(r.seconds, 4)}
            if len(hook.durable.completed) > saves:
                done, seconds = hook.durable.completed[-1]
                extra["durable_done"] = {"step": done, "seconds": round(seconds, 4)}
            if hook.durable.in_flight_step == step + 1:
                extra["durable_started"] = True
            if extra:
                _log(args.progress, event="tiers", step=step + 1, node=args.node, rank=rank,
                     state_bytes=hook.state_bytes, **extra)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        _log(args.progress, event="failed", node=args.node, rank=rank, error=error)
        exit_on_failure(exc)
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
