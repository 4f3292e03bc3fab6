"""Failure detection by heartbeat: a rank that stops beating is declared lost within seconds.

A node that loses power or hangs closes no socket, so the survivors' next collective waits for
its timeout (30 s for gloo by default, 10 minutes for NCCL) before anything happens. Each rank's
:class:`Heartbeat` thread instead bumps a counter in the job's key-value store every
``interval_s`` and watches everyone else's; a counter that has not moved for ``timeout_s`` (or a
store that no longer answers: it lived on a lost node) ends this worker with :data:`LOST_EXIT_CODE`,
so torchrun restarts the workers and the job re-rendezvous with a spare at once. Counters, not
time stamps, so the nodes' clocks need not agree.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

__all__ = ["Heartbeat", "LOST_EXIT_CODE", "exit_lost", "store_from_env"]

log = logging.getLogger(__name__)

LOST_EXIT_CODE = 70  # EX_SOFTWARE: the agent restarts the workers


def exit_lost(reason: str) -> None:
    """End this worker because a peer is lost (the default of :class:`Heartbeat`'s ``on_lost``)."""
    log.error("heartbeat: %s; leaving so the job can re-rendezvous", reason)
    sys.stderr.flush()
    os._exit(LOST_EXIT_CODE)


def store_from_env(prefix: str) -> dist.Store | None:
    """A client of the store torchrun gives its workers (``MASTER_ADDR``/``MASTER_PORT``), or None."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    return dist.PrefixStore(f"{prefix}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}", store)


class Heartbeat:
    """Beat and watch on a thread (see the module docstring); ``on_lost`` defaults to leaving."""

    def __init__(self, store: dist.Store, rank: int, world: int, *, interval_s: float = 0.5,
                 timeout_s: float = 3.0, on_lost: Callable[[str], None] = exit_lost):
        if not 0 < interval_s < timeout_s:
            raise ValueError("need 0 < interval_s < timeout_s")
        self.store, self.rank, self.world = store, rank, world
        self.interval_s, self.timeout_s, self.on_lost = interval_s, timeout_s, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="foreshock-heartbeat", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop beating, and tell the others that this rank ended rather than died."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - the store may already be gone at the end of a job
            log.debug("heartbeat: could not record the end of rank %d", self.rank)

    def _run(self) -> None:
        keys = [f"hb/{r}" for r in range(self.world) if r != self.rank]
        seen: dict[str, tuple[bytes, float]] = {}
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                self.store.add(f"hb/{self.rank}", 1)
                beats = self.store.multi_get(keys) if self.store.check(keys) else None
            except Exception as exc:  # noqa: BLE001 - a store that stops answering is a lost node too
                self.on_lost(f"the job's store stopped answering ({exc})")
                return
            for key, value in zip(keys, beats or [], strict=False):
                if seen.get(key, (None, 0.0))[0] != value:
                    seen[key] = (value, now)
            stale = [k for k, (_, at) in seen.items()
                     if now - at > self.timeout_s and not self.store.check([f"done/{k.split('/')[1]}"])]
            if stale:
                self.on_lost(f"rank {stale[0].split('/')[1]} missed its heartbeats for {self.timeout_s:g} s")
                return
            self._stop.wait(self.interval_s)
