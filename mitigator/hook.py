"""The training-side hook: a few lines in a PyTorch loop make the job obey the mitigator.

Usage (after ``torch.distributed.init_process_group`` and building model + optimizer)::

    hook = TrainingHook("llm-70b", node, FileChannel(control_dir), ckpt_dir,
                        model=model, optimizer=optimizer, every_steps=500)
    start = hook.resume()               # once, before the loop: loads the newest complete snapshot
    for step in range(start, total):
        train_one_step()
        hook.step_end(step + 1)         # after optimizer.step(): step = steps completed
    hook.close()                        # waits for an in-flight snapshot

``step_end`` is called on every rank at every step (it is collective: one tiny all-reduce tells
every rank whether any of them saw a command, so all ranks snapshot at the same step). Snapshots
use ``torch.distributed.checkpoint.async_save`` on a separate gloo group, so training continues
while the snapshot is written; rank 0 marks a snapshot complete (``COMPLETE``) only once every rank
has written it, and :meth:`resume` only considers complete ones.

Commands: ``checkpoint`` snapshots now. ``leave`` snapshots now and waits until it is durable; then
the ranks on the leaving node stop their torchrun agent with SIGTERM — torchrun's documented
"agent died by a signal" path, which (unlike a clean exit) does *not* close the rendezvous — and the
other ranks exit with :data:`RESCALE_EXIT_CODE` so their agents re-rendezvous, with a spare in the
leaving node's place, and resume from that snapshot: no step is lost.

Launch with ``torchrun --nnodes=N:N --rdzv-backend=c10d …`` on the job's nodes and on the spares
(a spare's agent waits in the rendezvous' redundancy list), and set
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for the agents: with torch's default shared TCP store a
spare that joins in a later round waits forever for the store address (found in the drill).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from mitigator.channels import Command, CommandInbox, write_json_atomic
from mitigator.jobs import write_job_status
from mitigator.plan import JobView

__all__ = ["TrainingHook", "RESCALE_EXIT_CODE", "leave_torchrun", "latest_complete_snapshot"]

log = logging.getLogger(__name__)

RESCALE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — the agent restarts the workers and re-rendezvous
_SNAPSHOT = re.compile(r"^step-(\d{8,})$")


def latest_complete_snapshot(ckpt_dir: str | Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest snapshot with a ``COMPLETE`` marker, or None."""
    best = None
    for p in Path(ckpt_dir).glob("step-*"):
        m = _SNAPSHOT.match(p.name)
        if m and (p / "COMPLETE").exists() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), p)
    return best


def leave_torchrun() -> None:
    """Make this node leave an elastic job: SIGTERM to the parent torchrun agent, then wait to be stopped.

    Outside torchrun (no agent parent) the process just exits cleanly.
    """
    parent = psutil.Process(os.getppid())
    cmdline = " ".join(parent.cmdline())
    if "torch.distributed.run" not in cmdline and "torchrun" not in cmdline:
        sys.exit(0)
    os.kill(parent.pid, signal.SIGTERM)
    while True:  # the agent terminates this worker as part of its shutdown
        time.sleep(1)


class _TrainState(Stateful):
    """Model + optimizer as one DCP ``Stateful`` (DCP calls these at save and load)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )


class TrainingHook:
    """Listen for the mitigator's commands and keep resumable snapshots (see the module docstring).

    ``every_steps``: periodic snapshot interval (0: only on command). ``status_root``: where rank 0
    publishes the job's status for :class:`mitigator.jobs.FileJobs` (nodes, last durable snapshot).
    ``keep``: complete snapshots to keep. ``leave``: how this node leaves the job (default: stop the
    torchrun agent). ``ckpt_dir`` must be on storage every rank (and every spare) can read.
    """

    def __init__(
        self,
        job: str,
        node: str,
        inbox: CommandInbox,
        ckpt_dir: str | Path,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        every_steps: int = 0,
        status_root: str | Path | None = None,
        keep: int = 2,
        leave: Callable[[], None] = leave_torchrun,
        clock: Callable[[], float] = time.time,
    ):
        self.job, self.node, self.inbox = job, node, inbox
        self.ckpt_dir = Path(ckpt_dir)
        self.every_steps = every_steps
        self.status_root = status_root
        self.keep = keep
        self.leave = leave
        self.clock = clock
        self._state = {"train": _TrainState(model, optimizer)}
        self._pg = dist.new_group(backend="gloo")  # async saves must not share the training group
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self._nodes: tuple[str, ...] = (node,)
        self._inflight: tuple[int, Any, float, list[Command]] | None = None
        self._handled: set[str] = set()
        self._last_ckpt_ms = int(self.clock() * 1000)
        self._ckpt_s = 0.0
        self.last_snapshot_step: int | None = None

    # -- start ---------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest complete snapshot (if any); return the number of steps it had completed."""
        nodes: list[Any] = [None] * self._world
        dist.all_gather_object(nodes, self.node)
        self._nodes = tuple(dict.fromkeys(nodes))
        found = [latest_complete_snapshot(self.ckpt_dir) if self._rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        step = 0
        if found[0] is not None:
            step, path = found[0]
            dcp.load(self._state, checkpoint_id=str(path))
            self.last_snapshot_step = step
        self._publish_status()
        return step

    # -- every step ----------------------------------------------------------------------------
    def step_end(self, step: int) -> None:
        """Call on every rank after each optimizer step with the number of steps completed."""
        mine = [c for c in self.inbox.poll(self.job) if c.action_id not in self._handled]
        saved = self._inflight is not None and self._inflight[1].done()
        flags = torch.tensor([int(bool(mine)), int(saved)], dtype=torch.int32)
        dist.all_reduce(flags)  # one tiny collective: any commands? every rank's save written?
        if flags[1].item() == self._world:
            self._finish_if_done()
        commands: list[Command] = []
        if flags[0].item():
            gathered: list[Any] = [None] * self._world
            dist.all_gather_object(gathered, mine)
            by_id = {c.action_id: c for batch in gathered for c in batch if c.action_id not in self._handled}
            commands = sorted(by_id.values(), key=lambda c: c.issued_ms)
            self._handled.update(by_id)
        periodic = self.every_steps > 0 and step % self.every_steps == 0
        if commands or periodic:
            self._start_save(step, commands)
        leaving = {c.node for c in commands if c.kind == "leave"}
        if leaving:
            self._finish_if_done()
            self._exit_for_rescale(self.node in leaving)

    def close(self) -> None:
        """Wait for an in-flight snapshot (call before the process exits)."""
        self._finish_if_done()

    # -- internals -----------------------------------------------------------------------------
    def _start_save(self, step: int, commands: list[Command]) -> None:
        self._finish_if_done()  # one snapshot in flight at a time
        path = self.ckpt_dir / f"step-{step:08d}"
        response = dcp.async_save(self._state, checkpoint_id=str(path), process_group=self._pg)
        future = getattr(response, "upload_completion", response)
        self._inflight = (step, future, self.clock(), commands)

    def _finish_if_done(self) -> None:
        """Wait for the in-flight snapshot and mark it complete (collective: all ranks call it together)."""
        if self._inflight is None:
            return
        step, future, started, commands = self._inflight
        future.result()
        self._inflight = None
        dist.barrier(group=self._pg)  # every rank's part is written
        now = self.clock()
        if self._rank == 0:
            write_json_atomic(
                self.ckpt_dir / f"step-{step:08d}" / "COMPLETE",
                {"step": step, "ts_ms": int(now * 1000), "world": self._world},
            )
            self._prune(step)
        self.last_snapshot_step = step
        self._last_ckpt_ms = int(now * 1000)
        self._ckpt_s = now - started
        if self._rank == 0:
            self._publish_status()
            for c in commands:
                self.inbox.ack(c, f"snapshot durable at step {step} ({self._ckpt_s:.2f}s)")

    def _exit_for_rescale(self, i_leave: bool) -> None:
        if i_leave:
            log.warning("node %s leaves job %s after a durable snapshot", self.node, self.job)
            self.leave()
            return
        time.sleep(0.2)  # let the leaving agent take its signal before ours re-rendezvous
        log.warning("a node left job %s; re-rendezvous to continue from the snapshot", self.job)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RESCALE_EXIT_CODE)  # not sys.exit: tearing down groups with a departed peer can hang

    def _prune(self, newest: int) -> None:
        """Keep the newest ``keep`` complete snapshots; drop older ones and any older unfinished one."""
        found = sorted(
            (int(m.group(1)), p) for p in self.ckpt_dir.glob("step-*") if (m := _SNAPSHOT.match(p.name))
        )
        kept = [s for s, p in found if (p / "COMPLETE").exists()][-self.keep :] if self.keep > 0 else [newest]
        for step, path in found:
            if step < newest and step not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def _publish_status(self) -> None:
        if self.status_root is None or self._rank != 0:
            return
        gpus_per_node = max(1, self._world // max(1, len(self._nodes)))
        write_job_status(
            self.status_root,
            JobView(self.job, self._nodes, gpus_per_node, self._last_ckpt_ms, round(self._ckpt_s, 3)),
        )
