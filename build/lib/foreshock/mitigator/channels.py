"""The command channel between the mitigator and the training-side hook.

Mitigator side: a :class:`CommandChannel` (``send``). Hook side: a :class:`CommandInbox`
(``poll`` for its job's commands, ``ack`` once the snapshot is durable). The executor can wait for
that acknowledgement through an :class:`AckWaiter` before it drains a node.

Two implementations, picked by name from :data:`CHANNELS`:

* ``topic`` (production): commands are ``mitigation.events`` records with status ``started`` for
  the job; acks are ``succeeded`` records from the hook (``reason`` starts with ``hook:``). Works
  across machines through Kafka.
* ``file`` (drill, tests, shared filesystems): ``ROOT/<job>/commands/<action_id>.json`` and
  ``ROOT/<job>/acks/<action_id>.json``, written atomically (temp file + rename).

Commands carry the action id, so a retried send is harmless: the hook acts on an id once.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

from foreshock.ingest.bus import Bus
from foreshock.ingest.contract import MitigationEvent, Topic
from foreshock.ingest.stream import RecordStream, now_ms, publish

__all__ = [
    "Command",
    "CommandChannel",
    "CommandInbox",
    "AckWaiter",
    "FileChannel",
    "TopicChannel",
    "CHANNELS",
    "write_json_atomic",
    "FAILED_ACK",
]

CommandKind = Literal["checkpoint", "leave"]
FAILED_ACK = "failed"  # an ack detail that starts with it: the job could not save its state


@dataclass(frozen=True, slots=True)
class Command:
    """``checkpoint``: snapshot now. ``leave``: snapshot, then the ranks on ``node`` leave the job."""

    action_id: str
    job: str
    kind: CommandKind
    node: str
    issued_ms: int


class CommandChannel(Protocol):
    def send(self, command: Command) -> None:
        """Deliver durably (returns once the hook can see it)."""
        ...


class CommandInbox(Protocol):
    def poll(self, job: str) -> list[Command]:
        """Commands for ``job`` not returned before (cheap: called every training step)."""
        ...

    def ack(self, command: Command, detail: str) -> None:
        """Tell the mitigator how the command ended: its state is safe, or ``FAILED_ACK: why``."""
        ...


class AckWaiter(Protocol):
    def wait(self, command: Command, timeout_s: float) -> str | None:
        """The hook's ack detail, or None if none came within ``timeout_s``."""
        ...


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write JSON so readers see the whole file or nothing (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class FileChannel:
    """Commands and acks as files under ``root`` (one directory per job)."""

    def __init__(self, root: str | Path, *, poll_s: float = 0.05):
        self.root = Path(root)
        self.poll_s = poll_s
        self._seen: set[str] = set()

    def send(self, command: Command) -> None:
        write_json_atomic(self.root / command.job / "commands" / f"{command.action_id}.json", asdict(command))

    def poll(self, job: str) -> list[Command]:
        folder = self.root / job / "commands"
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.startswith(".") or name in self._seen:
                continue
            self._seen.add(name)
            command = Command(**json.loads((folder / name).read_text()))
            if self.acked(command) is None:  # an acked command was carried out (maybe by an earlier run)
                out.append(command)
        return sorted(out, key=lambda c: c.issued_ms)

    def ack(self, command: Command, detail: str) -> None:
        write_json_atomic(
            self.root / command.job / "acks" / f"{command.action_id}.json",
            {"action_id": command.action_id, "detail": detail, "ts": now_ms()},
        )

    def acked(self, command: Command) -> dict | None:
        """The ack record, if the hook wrote one."""
        try:
            return json.loads((self.root / command.job / "acks" / f"{command.action_id}.json").read_text())
        except FileNotFoundError:
            return None

    def wait(self, command: Command, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while True:
            ack = self.acked(command)
            if ack is not None:
                return ack["detail"]
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)


_ACTION_OF: dict[str, Literal["checkpoint", "migrate"]] = {"checkpoint": "checkpoint", "leave": "migrate"}
_KIND_OF = {v: k for k, v in _ACTION_OF.items()}


class TopicChannel:
    """Commands and acks as ``mitigation.events`` records (Kafka in production, in-memory in tests).

    Each hook process reads through its own consumer group (every rank must see every command)
    and ignores records issued before it started, so a restarted job does not replay old commands.
    ``poll_s`` bounds the time one :meth:`poll` may spend (a Kafka consumer needs a few short
    polls to join its group; the hook calls :meth:`poll` once per training step).
    """

    def __init__(
        self,
        bus: Bus,
        *,
        group: str | None = None,
        since_ms: int | None = None,
        poll_s: float = 0.02,
        clock: Callable[[], int] = now_ms,
    ):
        self.bus = bus
        self.poll_s = poll_s
        self.clock = clock
        self.since_ms = clock() if since_ms is None else since_ms
        self._group = group or f"foreshock-hook-{uuid.uuid4().hex[:12]}"
        self._consumer = None
        self._seen: set[str] = set()
        self._acks: dict[str, str] = {}
        self._pending: list[Command] = []

    def _publish(self, command: Command, ts: int, status: str, reason: str) -> None:
        """One durable ``mitigation.events`` record about ``command``: the channel's only message form."""
        event = MitigationEvent(ts=ts, node=command.node, action_id=command.action_id,
                                action=_ACTION_OF[command.kind], status=status, job=command.job,
                                reason=reason)
        publish(self.bus, [event])
        self.bus.flush()

    def send(self, command: Command) -> None:
        self._publish(command, command.issued_ms, "started", f"command {command.kind}")

    def _drain(self, timeout_s: float) -> None:
        if self._consumer is None:  # through RecordStream: a bad message is dead-lettered, not raised
            self._consumer = RecordStream(self.bus, self.bus.consumer(self._group, [Topic.MITIGATION]))
        messages = self._consumer.poll(timeout_s)
        for m in messages:
            for e in m.records:
                if e.ts < self.since_ms or e.job is None or e.dry_run:
                    continue
                if e.status == "started" and e.action in _KIND_OF and e.action_id not in self._seen:
                    self._seen.add(e.action_id)
                    self._pending.append(Command(e.action_id, e.job, _KIND_OF[e.action], e.node, e.ts))
                elif e.status == "succeeded" and e.reason.startswith("hook:"):
                    self._acks[e.action_id] = e.reason.removeprefix("hook:").strip()
        if messages:
            self._consumer.commit(messages)

    def poll(self, job: str) -> list[Command]:
        self._drain(self.poll_s)
        mine = [c for c in self._pending if c.job == job]
        self._pending = [c for c in self._pending if c.job != job]
        return mine

    def ack(self, command: Command, detail: str) -> None:
        self._publish(command, self.clock(), "succeeded", f"hook: {detail}")

    def wait(self, command: Command, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while command.action_id not in self._acks:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._drain(min(left, 0.2))
        return self._acks[command.action_id]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


CHANNELS: dict[str, type] = {"file": FileChannel, "topic": TopicChannel}
