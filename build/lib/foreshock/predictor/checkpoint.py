"""Durable per-partition checkpoints: feature-engine state together with the offsets it reflects.

A partition (one partition number across the telemetry topics: every node hashes to exactly
one) is the unit of ownership in the consumer group, so it is also the unit of checkpointing:
whichever process owns partition ``p`` after a restart or a rebalance restores ``p`` alone and
seeks its logs to the offsets stored with it.

Layout under ``root``::

    p0003/CURRENT                       name of the live generation (replaced atomically)
    p0003/000000000042-1a2b3c4d/engine  whatever the engine's ``save(path)`` writes
    p0003/000000000042-1a2b3c4d/meta    msgpack: offsets, watermarks, held records, history

A generation is written in full (and fsynced) before ``CURRENT`` is swapped by rename, so a
``kill -9`` at any instant leaves either the old or the new checkpoint, never half of one.
Older generations are deleted after the swap.
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
        for old in base.iterdir():
            if old != gen and old.name != _CURRENT and not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        return gen

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
