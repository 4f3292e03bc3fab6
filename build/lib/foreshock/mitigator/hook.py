"""The training-side hook: a few lines in a PyTorch loop make the job obey the mitigator and survive.

Usage (after ``torch.distributed.init_process_group`` and building model + optimizer)::

    hook = TrainingHook("llm-70b", node, FileChannel(control_dir), ckpt_dir,
                        model=model, optimizer=optimizer, dataloader=loader,
                        memory_every=1, durable_every=500)
    start = hook.resume()               # once, before the loop: restores the newest state every rank has
    try:
        for step in range(start, total):
            train_one_step()
            hook.step_end(step + 1)     # after optimizer.step(): step = steps completed
    except Exception as exc:
        exit_on_failure(exc)            # a peer died: leave now, torchrun re-rendezvous
    hook.close()

State is kept in three tiers (:mod:`foreshock.mitigator.tiers`):

* **memory**: every ``memory_every`` steps the state is copied into double-buffered host memory on
  the node (tmpfs under ``memory_dir``), which outlives a worker restart. This copy is the only
  part that stalls training (with CUDA it runs on a side stream and the next optimizer step waits
  for it, so it overlaps the forward and backward passes).
* **peer**: a background thread copies each new memory snapshot to the host memory of a buddy
  rank on another node (rank + ranks-per-node) over a gloo group of its own.
* **durable**: every ``durable_every`` steps (``every_steps``, its older name) the state goes to
  ``ckpt_dir`` with ``torch.distributed.checkpoint.async_save``; complete once every rank's write is.

:meth:`resume` restores each rank from its own memory, its buddy's copy, or the durable tier,
whichever is newest for every rank at once (:mod:`foreshock.mitigator.tiers.recovery`).

``step_end`` is collective: one tiny all-reduce per step tells every rank whether any of them saw
a command and whether every rank's replicator is free, so all ranks act at the same step.

Commands: ``checkpoint`` snapshots now to every tier. ``leave`` snapshots to memory and waits until
the buddy holds the copy (no storage round trip); then the ranks on the leaving node stop their
torchrun agent with SIGTERM — torchrun's documented "agent died by a signal" path, which (unlike
a clean exit) does *not* close the rendezvous — and the other ranks exit with
:data:`RESCALE_EXIT_CODE` so their agents re-rendezvous, with a spare in the leaving node's place,
which fetches the leaving rank's state from the buddy's memory: no step is lost.

Launch with ``torchrun --nnodes=N:N --rdzv-backend=c10d …`` on the job's nodes and on the spares
(a spare's agent waits in the rendezvous' redundancy list), and set
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for the agents: with torch's default shared TCP store a
spare that joins in a later round waits forever for the store address (found in the drill).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import psutil
import torch
import torch.distributed as dist

from foreshock.mitigator.channels import FAILED_ACK, Command, CommandInbox
from foreshock.mitigator.jobs import write_job_status
from foreshock.mitigator.plan import JobView
from foreshock.mitigator.tiers.durable import DurableTier, latest_complete_snapshot
from foreshock.mitigator.tiers.heartbeat import Heartbeat, exit_lost, store_from_env
from foreshock.mitigator.tiers.layout import pack, plan_layout, unpack
from foreshock.mitigator.tiers.memory import Slot, SlotHeader, SlotPair
from foreshock.mitigator.tiers.peer import PeerReplicator
from foreshock.mitigator.tiers.recovery import Source, fetch, inventory, plan_recovery
from foreshock.mitigator.tiers.state import Stateful, TrainState
from foreshock.mitigator.tiers.transport import CorruptStream, ProcessGroupTransport

__all__ = ["TrainingHook", "RESCALE_EXIT_CODE", "FAILED_EXIT_CODE", "exit_on_failure", "leave_torchrun",
           "latest_complete_snapshot"]

log = logging.getLogger(__name__)

RESCALE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — the agent restarts the workers and re-rendezvous
FAILED_EXIT_CODE = 1
_TIERS: tuple[Source, ...] = ("memory", "peer", "durable")  # fastest first


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


def exit_on_failure(exc: BaseException) -> NoReturn:
    """End a worker whose collective failed at once, so torchrun restarts the group without delay.

    A normal exit after a peer died can hang for the collective timeout: the interpreter joins
    DCP's writer thread and tears down process groups whose last operations wait on the dead
    peer, and until the worker is gone its agent does not re-rendezvous. Call it from the
    training loop's ``except``; the memory tier on tmpfs is unaffected.
    """
    log.error("training step failed (%s: %s); leaving for the recovery", type(exc).__name__, exc,
              exc_info=exc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FAILED_EXIT_CODE)


def _default_memory_dir(job: str) -> Path:
    return Path("/dev/shm") / f"foreshock-{job}"


class TrainingHook:
    """Listen for the mitigator's commands and keep tiered, resumable state (see the module docstring).

    ``memory_every``: steps between memory snapshots (0: no memory or peer tier). ``durable_every``:
    steps between durable snapshots (0: only on command); ``every_steps`` is its older name, kept
    so no caller breaks. ``memory_dir``: node-local folder of the memory tier (default
    ``/dev/shm/foreshock-JOB``); ``ranks_per_node``: the buddy offset (default torchrun's
    ``LOCAL_WORLD_SIZE``). ``heartbeat_timeout_s``: under torchrun, a rank whose heartbeat stops
    for this long ends the workers so the job re-rendezvous at once (None: off); ``on_peer_lost``
    is called with the reason first (to log it where the job logs). ``status_root``:
    where rank 0 publishes the job's status for :class:`foreshock.mitigator.jobs.FileJobs`. ``keep``: complete
    durable snapshots to keep. ``leave``: how this node leaves the job (default: stop the torchrun
    agent). ``ckpt_dir`` must be on storage every rank (and every spare) can read.
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
        dataloader: Stateful | None = None,
        every_steps: int = 0,
        memory_every: int = 0,
        durable_every: int | None = None,
        memory_dir: str | Path | None = None,
        ranks_per_node: int | None = None,
        heartbeat_timeout_s: float | None = 10.0,
        on_peer_lost: Callable[[str], None] | None = None,
        status_root: str | Path | None = None,
        keep: int = 2,
        leave: Callable[[], None] = leave_torchrun,
        clock: Callable[[], float] = time.time,
    ):
        if durable_every is not None and every_steps and durable_every != every_steps:
            raise ValueError("every_steps is durable_every's older name: give one of them")
        if memory_every < 0 or (durable_every or every_steps) < 0:
            raise ValueError("snapshot intervals must be >= 0")
        self.job, self.node, self.inbox = job, node, inbox
        self.durable_every = durable_every if durable_every is not None else every_steps
        self.memory_every = memory_every
        self.status_root = status_root
        self.leave = leave
        self.clock = clock
        self.state = TrainState(model, optimizer, dataloader)
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        self.durable = DurableTier(ckpt_dir, self._rank, self._world, keep=keep)
        self._nodes: tuple[str, ...] = (node,)
        self._durable_commands: list[Command] = []
        self._handled: set[str] = set()
        self._last_ckpt_ms = int(self.clock() * 1000)
        self._ckpt_s = 0.0
        self._last_memory_step = 0
        self.last_snapshot_step: int | None = None
        self.state_bytes = 0  # size of the newest memory snapshot
        self.stall_s: list[float] = []  # every memory snapshot's stall, for the drill and benchmarks
        self.restored: dict[str, Any] = {}
        self.replicator: PeerReplicator | None = None
        self.heartbeat = self._start_heartbeat(heartbeat_timeout_s, on_peer_lost)
        if memory_every:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            root = Path(memory_dir or _default_memory_dir(job)) / f"local-{local}"
            self.own = SlotPair(root, "own", pin=True)
            self.replicas = SlotPair(root, "replica")
            rpn = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            self._transport = ProcessGroupTransport(dist.new_group(backend="gloo"))
            self.replicator = PeerReplicator(self._transport, self._rank, self._world, rpn, self.own,
                                             self.replicas)
            self._copy_stream: torch.cuda.Stream | None = None
            self._copy: tuple[Slot, SlotHeader, torch.cuda.Event] | None = None
            # a side-stream copy reads parameters and optimizer state until it ends: the next optimizer
            # step (and a forward pass that updates buffers, such as batch-norm statistics) waits for it
            optimizer.register_step_pre_hook(lambda *_: self._finish_copy())
            if any(True for _ in model.buffers()):
                model.register_forward_pre_hook(lambda *_: self._finish_copy())

    def _start_heartbeat(self, timeout_s: float | None,
                         on_peer_lost: Callable[[str], None] | None) -> Heartbeat | None:
        """Under torchrun (whose store the workers share), beat and watch the other ranks."""
        store = store_from_env("foreshock-heartbeat") if timeout_s else None
        if store is None:
            return None

        def lost(reason: str) -> None:
            if on_peer_lost is not None:
                on_peer_lost(reason)
            exit_lost(reason)

        return Heartbeat(store, self._rank, self._world, interval_s=min(1.0, timeout_s / 5),
                         timeout_s=timeout_s, on_lost=lost)

    # -- start ---------------------------------------------------------------------------------
    def resume(self) -> int:
        """Restore the newest state every rank can have; return the number of steps it had completed.

        ``restored`` then says how: ``source`` (this rank's tier: ``memory``, ``peer``, ``durable``
        or None for a fresh start), ``job_source`` (the slowest tier any rank used), ``seconds``.
        """
        started = time.perf_counter()
        nodes: list[Any] = [None] * self._world
        dist.all_gather_object(nodes, self.node)
        self._nodes = tuple(dict.fromkeys(nodes))
        durable = [latest_complete_snapshot(self.durable.dir) if self._rank == 0 else None]
        dist.broadcast_object_list(durable, src=0)
        durable_step = durable[0][0] if durable[0] else None
        found = self._restore_from_memory(durable_step) if self.replicator is not None else None
        if found is not None:
            step, source, job_source = found
        elif durable_step is not None:
            template = self.state.capture()
            step = self.durable.load(template)
            self.state.apply(template)
            source = job_source = "durable"
        else:
            step, source, job_source = 0, None, None
        if self.replicator is not None:
            self.own.drop_newer_than(step)  # snapshots of a timeline the job rolled back from
            self.replicas.drop_newer_than(step)
        self._last_memory_step = step
        if source is not None:
            self.last_snapshot_step = step
        self.restored = {"step": step, "source": source, "job_source": job_source,
                         "seconds": time.perf_counter() - started}
        self._publish_status()
        return step

    def _restore_from_memory(self, durable_step: int | None) -> tuple[int, Source, Source] | None:
        """(step, this rank's source, the job's) of the agreed memory step, loaded; None to use durable."""
        held: list[Any] = [None] * self._world
        dist.all_gather_object(held, inventory(self.own, self.replicas, self._world))
        plan = plan_recovery(held)
        if plan.step is None or (durable_step is not None and plan.step < durable_step):
            return None
        got = None
        try:
            got = fetch(plan, self._rank, self._transport, self.own, self.replicas)
        except CorruptStream as exc:
            log.error("memory restore rejected, falling back to the durable tier: %s", exc)
        ok = torch.tensor([int(got is not None)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not ok.item():
            return None
        slot, header, source = got
        self.state.apply_view(unpack(header.layout, slot.buffer(header.nbytes)))
        worst = torch.tensor([_TIERS.index(source)])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return plan.step, source, _TIERS[int(worst.item())]

    # -- every step ----------------------------------------------------------------------------
    def step_end(self, step: int) -> None:
        """Call on every rank after each optimizer step with the number of steps completed."""
        mine = [c for c in self.inbox.poll(self.job) if c.action_id not in self._handled]
        idle = self.replicator is None or self.replicator.idle
        flags = torch.tensor([int(bool(mine)), int(self.durable.written()), int(idle)], dtype=torch.int32)
        dist.all_reduce(flags)  # one tiny collective: commands? every save written? every replicator free?
        if flags[1].item() == self._world:
            self._finish_durable()
        commands: list[Command] = []
        if flags[0].item():
            gathered: list[Any] = [None] * self._world
            dist.all_gather_object(gathered, mine)
            by_id = {c.action_id: c for batch in gathered for c in batch if c.action_id not in self._handled}
            commands = sorted(by_id.values(), key=lambda c: c.issued_ms)
            self._handled.update(by_id)
        leaving = {c.node for c in commands if c.kind == "leave"}
        if self.replicator is not None:
            self.replicator.check()
            free = flags[2].item() == self._world
            due = step - self._last_memory_step >= self.memory_every
            if commands or (free and due):
                self._memory_snapshot(step, wait_for_round=not free)
            if leaving:
                self._replicated_everywhere(step)
                if self._rank == 0:
                    for c in commands:
                        if c.kind == "leave":
                            self.inbox.ack(c, f"state at step {step} in peer memory")
                self._finish_durable()
                self._exit_for_rescale(self.node in leaving)
                return
        periodic = self.durable_every > 0 and step % self.durable_every == 0
        if commands or periodic:
            self._finish_durable()
            self._durable_commands += commands
            if not self.durable.start(step, self.state.capture()):
                self._ack_durable(None)
        if leaving and self._finish_durable() is not None:  # never leave without the state saved
            self._exit_for_rescale(self.node in leaving)

    def close(self) -> None:
        """Wait for an in-flight snapshot and replication round (call before the process exits)."""
        self._finish_durable()
        if self.replicator is not None:
            self.replicator.wait()
            self.replicator.close()
        if self.heartbeat is not None:
            self.heartbeat.close()

    # -- internals -----------------------------------------------------------------------------
    def _memory_snapshot(self, step: int, *, wait_for_round: bool) -> None:
        """Copy the state into the older slot and hand it to the replicator (the stall is this copy)."""
        started = time.perf_counter()
        self._finish_copy()
        if wait_for_round:  # a command cannot wait for the next free step
            self.replicator.wait()
        layout, tensors = plan_layout(self.state.capture())
        slot = self.own.target()
        slot.invalidate()
        buf = slot.buffer(layout.nbytes)
        header = SlotHeader(self._rank, self._world, step, layout)
        self._last_memory_step, self.state_bytes = step, layout.nbytes
        if any(t.is_cuda for t in tensors):
            stream = self._copy_stream = self._copy_stream or torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                pack(layout, tensors, buf, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            self._copy = (slot, header, event)
            self.stall_s.append(time.perf_counter() - started)
            return
        pack(layout, tensors, buf)
        self._commit(slot, header)
        self.stall_s.append(time.perf_counter() - started)

    def _finish_copy(self) -> None:
        """Wait for a side-stream copy (before anything modifies what it reads), then commit it."""
        if self._copy is None:
            return
        slot, header, event = self._copy
        self._copy = None
        started = time.perf_counter()
        event.synchronize()
        self._commit(slot, header)
        self.stall_s[-1] += time.perf_counter() - started

    def _commit(self, slot: Slot, header: SlotHeader) -> None:
        slot.commit(header)
        self.replicator.submit(slot, header)

    def _replicated_everywhere(self, step: int) -> None:
        """Wait until every buddy holds the step-``step`` snapshot of its ward (collective)."""
        self._finish_copy()
        self.replicator.wait()
        dist.barrier(group=self._transport.group)  # receivers commit after their last chunk
        self.last_snapshot_step = step
        self._last_ckpt_ms = int(self.clock() * 1000)
        self._publish_status()

    def _finish_durable(self) -> int | None:
        """Complete the durable save in flight (collective); its step, or None (none, or it failed)."""
        if self.durable.in_flight_step is None:
            return None
        step = self.durable.finish()
        if step is not None:
            self.last_snapshot_step = max(step, self.last_snapshot_step or 0)
            self._last_ckpt_ms = int(self.clock() * 1000)
            self._ckpt_s = self.durable.last_seconds
            self._publish_status()
        self._ack_durable(step)
        return step

    def _ack_durable(self, step: int | None) -> None:
        """Tell the mitigator how the commands waiting on the durable save ended (rank 0)."""
        if self._rank == 0:
            for c in self._durable_commands:
                self.inbox.ack(c, f"snapshot durable at step {step} ({self._ckpt_s:.2f}s)" if step is not None
                               else f"{FAILED_ACK}: snapshot not saved ({self.durable.last_error})")
        self._durable_commands = []

    def _exit_for_rescale(self, i_leave: bool) -> None:
        if i_leave:
            log.warning("node %s leaves job %s; its state is safe", self.node, self.job)
            self.leave()
            return
        time.sleep(0.2)  # let the leaving agent take its signal before ours re-rendezvous
        log.warning("a node left job %s; re-rendezvous to continue from the snapshot", self.job)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RESCALE_EXIT_CODE)  # not sys.exit: tearing down groups with a departed peer can hang

    def _publish_status(self) -> None:
        if self.status_root is None or self._rank != 0:
            return
        gpus_per_node = max(1, self._world // max(1, len(self._nodes)))
        write_job_status(
            self.status_root,
            JobView(self.job, self._nodes, gpus_per_node, self._last_ckpt_ms, round(self._ckpt_s, 3)),
        )
