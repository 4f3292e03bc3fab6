"""Durable per-partition checkpoints: feature-engine state together with the offsets it reflects.

A partition (one partition number across the telemetry topics: every node hashes to exactly
one) is the unit of ownership in the consumer group, so it is also the unit of checkpointing:
whichever process owns partition ``p`` after a restart or a rebalance restores ``p`` alone and
seeks its logs to the offsets stored with it.

Layout under ``root``::

    p0003/CURRENT                       name of the live generation (replaced atomically)
    p0003/000000000042-1a2b3c4d/engine  whatever the engine's ``save(path)`` writes
    p0003/000000000042-1a2b3c4d/meta    msgpack: offsets, watermarks, held records, history
    p0003/journal                       JSON lines: the cuts made since that generation

A generation is written in full (and fsynced) before ``CURRENT`` is swapped by rename, so a
``kill -9`` at any instant leaves either the old or the new checkpoint, never half of one.
Older generations are deleted after the swap.

The journal holds the decisions taken between two checkpoints that the logs alone do not
show (:meth:`foreshock.predictor.partition.PartitionState.cut`): an entry is appended and fsynced
before any score it shaped is published, so whoever restores the partition replays the same
decisions. A new generation carries what the state still needs of it, so the journal then
starts afresh; a crash between the two leaves entries that replaying again changes nothing.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import msgspec

__all__ = ["CheckpointStore", "SavableEngine"]

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

    def save(self, partition: int, engine: E, meta: dict[str, Any]) -> Path:
        """Write a new generation for ``partition`` and make it the live one; returns its folder."""
        base = self._dir(partition)
        base.mkdir(parents=True, exist_ok=True)
        current = self._current(partition)
        seq = int(current.name.split("-")[0]) + 1 if current is not None else 0
        gen = base / f"{seq:012d}-{uuid.uuid4().hex[:8]}"
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
        (base / _JOURNAL).unlink(missing_ok=True)  # the generation's meta holds what is still pending
        for old in base.iterdir():
            if old != gen and old.name not in (_CURRENT, _JOURNAL) and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        return gen

    def journal(self, partition: int, entry: dict[str, Any]) -> None:
        """Append ``entry`` to ``partition``'s journal, durably (fsynced) before this returns."""
        base = self._dir(partition)
        base.mkdir(parents=True, exist_ok=True)
        with open(base / _JOURNAL, "ab") as fh:
            fh.write(msgspec.json.encode(entry) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def journaled(self, partition: int) -> list[dict[str, Any]]:
        """The entries of ``partition``'s journal, oldest first (a torn last line is left out: its
        write never returned, so nothing was published after it)."""
        try:
            lines = (self._dir(partition) / _JOURNAL).read_bytes().splitlines()
        except FileNotFoundError:
            return []
        out = []
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
