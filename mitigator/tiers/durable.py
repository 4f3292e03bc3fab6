"""The durable tier: snapshots on shared storage with ``torch.distributed.checkpoint.async_save``.

A snapshot folder ``step-NNNNNNNN`` counts as complete only once it holds a ``COMPLETE`` marker,
and rank 0 writes that marker only after *every* rank's asynchronous write has finished (each
rank's DCP write is fsynced; a barrier on the tier's own gloo group then joins them). Marking the
newest snapshot before the slowest rank's write is durable is a bug public checkpointers have
shipped; a folder without the marker is never loaded and is removed by the next prune.

Pruning runs before a write, so ``keep`` complete snapshots plus the one being written is the
most the folder ever holds. A write that fails (a read-only or full file system, an unreachable
mount) never stops training: every rank learns of it through one all-reduce, the partial folder
is removed, :attr:`DurableTier.failures` counts it and :attr:`DurableTier.last_error` says why. A
save that would not fit in the free space the file system reports is not started.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from foreshock.mitigator.channels import write_json_atomic

__all__ = ["DurableTier", "durable_view", "latest_complete_snapshot"]

log = logging.getLogger(__name__)

_SNAPSHOT = re.compile(r"^step-(\d{8,})$")
# What a storage failure raises: DCP's own error (a BaseException, which `except Exception` misses)
# and the OS's. Anything else is a bug and propagates.
STORAGE_ERRORS = (CheckpointException, OSError)
HEADROOM = 1.1  # free space needed, as a multiple of the state's bytes (DCP adds metadata)


def latest_complete_snapshot(ckpt_dir: str | Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest snapshot with a ``COMPLETE`` marker, or None."""
    best = None
    for p in Path(ckpt_dir).glob("step-*"):
        m = _SNAPSHOT.match(p.name)
        if m and (p / "COMPLETE").exists() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), p)
    return best


def durable_view(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """``state`` as DCP should see it: model and optimizer by their global names, the rest per rank.

    DCP takes entries of the same name on different ranks for copies of one tensor and keeps
    one; each rank's RNG and dataloader position are its own, so they go under its rank.
    """
    return {k: v for k, v in state.items() if k != "local"} | {f"rank-{rank}": state["local"]}


def _reason(exc: BaseException) -> str:
    """What went wrong, in a line: DCP wraps each rank's own error in a traceback."""
    causes = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and causes:
        errors = {r: e[0] if isinstance(e, tuple) else e for r, e in causes.items()}  # (error, frames)
        return "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in errors.items())
    return f"{type(exc).__name__}: {exc}"


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class DurableTier:
    """One asynchronous DCP save in flight at a time; completion is collective (see module docstring)."""

    def __init__(self, ckpt_dir: str | Path, rank: int, world: int, *, keep: int = 2):
        self.dir, self.rank, self.world, self.keep = Path(ckpt_dir), rank, world, keep
        self._pg = dist.new_group(backend="gloo")  # async saves must not share the training group
        self._inflight: tuple[int, Any, float] | None = None
        self.last_seconds = 0.0
        self.completed: list[tuple[int, float]] = []  # (step, seconds from start to complete)
        self.failures = 0
        self.last_error: str | None = None

    @property
    def in_flight_step(self) -> int | None:
        return None if self._inflight is None else self._inflight[0]

    def written(self) -> bool:
        """This rank's part of the save in flight is on storage (false when nothing is in flight)."""
        return self._inflight is not None and self._inflight[1].done()

    def start(self, step: int, state: dict[str, Any]) -> bool:
        """Begin an asynchronous save of ``state`` (finishes the previous one first: collective).

        False when it was not started: some rank's file system lacks the room (counted as a failure).
        """
        self.finish()
        if self.rank == 0:
            self._prune(keep=max(self.keep - 1, 0))
        room = torch.tensor([int(self._has_room(state))])
        dist.all_reduce(room, op=dist.ReduceOp.MIN, group=self._pg)  # also: nobody writes while rank 0 prunes
        if not room.item():
            self._failed(step, "not enough free space for the snapshot")
            return False
        response = dcp.async_save(durable_view(state, self.rank), checkpoint_id=str(self.path(step)),
                                  process_group=self._pg)
        future = getattr(response, "upload_completion", response)
        self._inflight = (step, future, time.perf_counter())
        return True

    def finish(self) -> int | None:
        """Wait for the save in flight and mark it complete (collective); return its step.

        None when nothing was in flight or the write failed on any rank (see the module docstring).
        """
        if self._inflight is None:
            return None
        step, future, started = self._inflight
        self._inflight = None
        error = None
        try:
            future.result()
        except STORAGE_ERRORS as exc:
            error = _reason(exc)
        ok = torch.tensor([int(error is None)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._pg)  # every rank's part is written
        if not ok.item():
            self._failed(step, error or "another rank's write failed")
            return None
        if self.rank == 0:
            error = self._mark_complete(step)
        marked = torch.tensor([int(error is None)])
        dist.all_reduce(marked, op=dist.ReduceOp.MIN, group=self._pg)  # every rank sees the same outcome
        if not marked.item():
            self._failed(step, error or "rank 0 could not mark the snapshot complete")
            return None
        self.last_seconds = time.perf_counter() - started
        self.completed.append((step, self.last_seconds))
        return step

    def _mark_complete(self, step: int) -> str | None:
        """Write the ``COMPLETE`` marker (rank 0); why it could not be, or None. The storage can fill or
        turn read-only between the data and the marker: that must not stop training either."""
        try:
            write_json_atomic(self.path(step) / "COMPLETE",
                              {"step": step, "ts_ms": int(time.time() * 1000), "world": self.world})
        except OSError as exc:
            return f"COMPLETE marker not written: {type(exc).__name__}: {exc}"
        return None

    def load(self, state: dict[str, Any]) -> int | None:
        """Load the newest complete snapshot into ``state`` in place (collective); its step or None."""
        found = [latest_complete_snapshot(self.dir) if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        if found[0] is None:
            return None
        step, path = found[0]
        dcp.load(durable_view(state, self.rank), checkpoint_id=str(path))
        return step

    def _has_room(self, state: dict[str, Any]) -> bool:
        needed = HEADROOM * _tensor_bytes(state)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            return shutil.disk_usage(self.dir).free >= needed
        except OSError:
            return True  # unknown here; the write itself will tell

    def _failed(self, step: int, reason: str) -> None:
        self.failures += 1
        self.last_error = reason[:500]
        log.warning("durable snapshot of step %d failed, training goes on: %s", step, self.last_error)
        if self.rank == 0:
            shutil.rmtree(self.path(step), ignore_errors=True)

    def path(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}"

    def _prune(self, keep: int) -> None:
        """Keep the newest ``keep`` complete snapshots; remove older ones and unfinished ones."""
        found = sorted((int(m.group(1)), p) for p in self.dir.glob("step-*")
                       if (m := _SNAPSHOT.match(p.name)))
        complete = [s for s, p in found if (p / "COMPLETE").exists()]
        kept = set(complete[-keep:]) if keep > 0 else set()
        for step, path in found:
            if step not in kept:
                shutil.rmtree(path, ignore_errors=True)
