"""Durable per-partition checkpoints: feature-engine state together with the offsets it reflects.

A partition (one partition number across the telemetry topics: every node hashes to exactly
one) is the unit of ownership in the consumer group, so it is also the unit of checkpointing:
whichever process owns partition ``p`` after a restart or a rebalance restores ``p`` alone and
seeks its logs to the offsets stored with it.

Layout under ``root``::

    p0003/CURRENT                       name of the live generation (replaced atomically)
    p0003/000000000042-1a2b3c4d/engine  whatever the engine's ``save(path)`` writes
    p0003/000000000042-1a2b3c4d/meta    msgpack: offsets, watermarks, held records, history
    p0003/journal                       JSON lines: the cuts made since the last seal
    p0003/journal.000000000007          a sealed journal: cuts made before a snapshot was taken

A generation is written in full (and fsynced) before ``CURRENT`` is swapped by rename, so a
``kill -9`` at any instant leaves either the old or the new checkpoint, never half of one.
Older generations are deleted after the swap.

The journal holds the decisions taken between two checkpoints that the logs alone do not
show (:meth:`foreshock.predictor.partition.PartitionState.cut`): an entry is appended and fsynced
before any score it shaped is published, so whoever restores the partition replays the same
decisions. The state is snapshotted on the scoring loop and written by another thread while
the loop goes on journaling (see :mod:`foreshock.predictor.service`), so the journal is *sealed*
(renamed aside) at the snapshot: a generation carries what the state still needs of the sealed
journals, which are deleted once it is live; the journal after the snapshot stays. Until then a
restore reads the sealed journals and the current one (replaying an entry the state already
reflects changes nothing).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import msgspec

__all__ = ["CheckpointStore", "SavableEngine", "Snapshot", "BackgroundWriter"]

_CURRENT = "CURRENT"
_META = "meta"
_ENGINE = "engine"
_JOURNAL = "journal"


class SavableEngine(Protocol):
    def save(self, path: str | Path) -> Any: ...


E = TypeVar("E", bound=SavableEngine)


def _fsync_tree(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(path if path.is_dir() else path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore(Generic[E]):
    """Save and restore ``(engine, meta)`` per partition number under one (shared) directory.

    ``load_engine(path)`` rebuilds an engine from what ``engine.save(path)`` wrote. Processes
    of one consumer group may share ``root``: a partition has one owner at a time.
    """

    def __init__(self, root: str | Path, load_engine: Callable[[Path], E]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._load_engine = load_engine

    def _dir(self, partition: int) -> Path:
        return self.root / f"p{partition:04d}"

    def _current(self, partition: int) -> Path | None:
        pointer = self._dir(partition) / _CURRENT
        try:
            name = pointer.read_text().strip()
        except FileNotFoundError:
            return None
        gen = self._dir(partition) / name
        return gen if (gen / _META).exists() else None

    def save(self, partition: int, engine: E, meta: dict[str, Any], sealed: int | None = None) -> Path:
        """Write a new generation for ``partition`` and make it the live one; returns its folder.

        ``sealed``: what :meth:`seal` returned when the state was snapshotted (the journals up to
        it are then deleted); None: the state is current, seal now.
        """
        base = self._dir(partition)
        base.mkdir(parents=True, exist_ok=True)
        current = self._current(partition)
        seq = int(current.name.split("-")[0]) + 1 if current is not None else 0
        gen = base / f"{seq:012d}-{uuid.uuid4().hex[:8]}"
        if sealed is None:
            sealed = self.seal(partition)
        gen.mkdir()
        engine.save(gen / _ENGINE)
        (gen / _META).write_bytes(msgspec.msgpack.encode(meta))
        _fsync_tree(gen)
        tmp = base / f".{_CURRENT}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(gen.name)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, base / _CURRENT)
        _fsync_dir(base)
        for n, journal in self._sealed(partition):  # the generation's meta holds what is still pending
            if n <= sealed:
                journal.unlink(missing_ok=True)
        for old in base.iterdir():
            if old != gen and old.name != _CURRENT and not old.name.startswith((_JOURNAL, ".")):
                shutil.rmtree(old, ignore_errors=True)
        return gen

    def seal(self, partition: int) -> int:
        """Set the journal of ``partition`` aside (later entries start a new one); returns the number
        of the newest sealed journal, for :meth:`save`."""
        sealed = self._sealed(partition)
        last = sealed[-1][0] if sealed else 0
        journal = self._dir(partition) / _JOURNAL
        if not journal.exists():
            return last
        os.replace(journal, journal.with_name(f"{_JOURNAL}.{last + 1:012d}"))
        return last + 1

    def _sealed(self, partition: int) -> list[tuple[int, Path]]:
        found = [(int(f.name.split(".")[1]), f) for f in self._dir(partition).glob(f"{_JOURNAL}.*")
                 if f.name.split(".")[1].isdigit()]
        return sorted(found)

    def journal(self, partition: int, entry: dict[str, Any]) -> None:
        """Append ``entry`` to ``partition``'s journal, durably (fsynced) before this returns."""
        base = self._dir(partition)
        base.mkdir(parents=True, exist_ok=True)
        with open(base / _JOURNAL, "ab") as fh:
            fh.write(msgspec.json.encode(entry) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def journaled(self, partition: int) -> list[dict[str, Any]]:
        """The entries of ``partition``'s journals (sealed, then current), oldest first. A torn last
        line is left out: its write never returned, so nothing was published after it. A process
        that restores the partition seals them (:meth:`seal`), so it never appends after one."""
        files = [f for _, f in self._sealed(partition)] + [self._dir(partition) / _JOURNAL]
        out = []
        for f in files:
            try:
                lines = f.read_bytes().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    out.append(msgspec.json.decode(line))
                except msgspec.DecodeError:
                    break
        return out

    def load(self, partition: int) -> tuple[E, dict[str, Any]] | None:
        """The live checkpoint of ``partition`` as ``(engine, meta)``, or None when there is none."""
        gen = self._current(partition)
        if gen is None:
            return None
        meta = msgspec.msgpack.decode((gen / _META).read_bytes())
        return self._load_engine(gen / _ENGINE), meta

    def partitions(self) -> list[int]:
        """Partition numbers that have a live checkpoint."""
        return sorted(int(d.name[1:]) for d in self.root.glob("p[0-9]*") if self._current(int(d.name[1:])))


@dataclass
class Snapshot:
    """A partition's state as of one moment: written later, its offsets committed once it is."""

    partition: int
    engine: Any  # a copy, or the live engine when written before the state moves on
    meta: dict[str, Any]
    positions: dict[tuple[str, int], int]
    sealed: int | None = None  # what CheckpointStore.seal returned at the snapshot
    write_s: float = 0.0  # wall time of the write, set by whoever writes it


class BackgroundWriter:
    """Writes one :class:`Snapshot` at a time on a thread of its own, so the caller's loop does not
    wait for the disk (numpy's file writes and fsync release the interpreter lock)."""

    def __init__(self, write: Callable[[Snapshot], None]):
        self._write = write
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Snapshot, Future[None]] | None = None

    @property
    def busy(self) -> bool:
        """Whether a snapshot was submitted and not yet handed back by :meth:`done`."""
        return self._pending is not None

    def submit(self, snapshot: Snapshot) -> None:
        if self._pending is not None:
            raise RuntimeError("a snapshot is still being written")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        self._pending = (snapshot, self._pool.submit(self._write, snapshot))

    def wait(self) -> None:
        """Block until the write in progress (if any) ends; :meth:`done` still hands it back."""
        if self._pending is not None:
            futures.wait([self._pending[1]])

    def done(self, wait: bool = False) -> Snapshot | None:
        """The submitted snapshot once it is written (``wait``: block until then); raises what the
        write raised. None while nothing is submitted or (without ``wait``) the write goes on."""
        if self._pending is None or not (wait or self._pending[1].done()):
            return None
        (snapshot, future), self._pending = self._pending, None
        future.result()
        return snapshot

    def close(self) -> None:
        """Wait for the write in progress and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
