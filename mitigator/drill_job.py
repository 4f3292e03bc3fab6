"""The fire drill's training job: a tiny model under torchrun elastic, using :class:`TrainingHook`.

Run by ``foreshock drill`` (one torchrun agent per simulated node)::

    python -m torch.distributed.run --nnodes=2:2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 -m mitigator.drill_job --drill-node A --control-dir C --ckpt-dir K \\
        --progress P

Every rank appends one JSON line per event to ``--progress`` (``resume`` with the step it resumed
from, then ``step`` after each optimizer step), which is what the drill measures steps lost from.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mitigator.channels import FileChannel
from mitigator.hook import TrainingHook

__all__ = ["main"]


def _log(path: str, **fields) -> None:
    line = json.dumps({**fields, "ts_ms": time.time_ns() // 1_000_000, "pid": os.getpid()}) + "\n"
    with open(path, "a") as f:  # one short O_APPEND write per line: lines from ranks do not interleave
        f.write(line)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job", default="drill")
    p.add_argument("--drill-node", dest="node", required=True, help="this agent's node name")
    p.add_argument("--control-dir", required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--progress", required=True)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--every", type=int, default=50, help="periodic snapshot every N steps (0: never)")
    p.add_argument("--step-seconds", type=float, default=0.05, help="simulated compute per step")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hook = TrainingHook(
        args.job,
        args.node,
        FileChannel(args.control_dir),
        args.ckpt_dir,
        model=model,
        optimizer=optimizer,
        every_steps=args.every,
        status_root=args.control_dir,
    )
    start = hook.resume()
    _log(args.progress, event="resume", step=start, node=args.node, rank=rank, world=world)
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_seconds)
        _log(
            args.progress,
            event="step",
            step=step + 1,
            node=args.node,
            rank=rank,
            world=world,
            loss=round(loss.item(), 5),
        )
        hook.step_end(step + 1)
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
