"""The executor: applies a plan's actions — idempotently, with retries, and audited.

For every action: skip it if its id already succeeded (audit log), record ``planned``, then either
record ``skipped`` (dry run: nothing is touched) or try up to ``attempts`` times with exponential
backoff, recording ``started`` and ``succeeded``/``failed`` for each attempt. Later actions of the
same plan are skipped when an earlier one failed (a node is not drained when its job could not be
told to leave). A checkpoint succeeds once its command is durably delivered; a migration waits for
the hook's ack (snapshot durable, ranks left) before the drain that follows it, so an eviction never
races the snapshot (the loop is blocked meanwhile, at most ``ack_timeout_s``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ingest.contract import MitigationEvent
from ingest.stream import now_ms
from mitigator.audit import AuditLog
from mitigator.channels import FAILED_ACK, AckWaiter, Command, CommandChannel
from mitigator.plan import Action, Plan
from mitigator.schedulers import NoScheduler, SchedulerAdapter

__all__ = ["Outcome", "Executor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    action: Action
    status: str  # succeeded | failed | skipped | duplicate
    detail: str = ""

    @property
    def succeeded(self) -> bool:
        return self.status in ("succeeded", "duplicate")


class Executor:
    """Apply plans through a scheduler adapter and a command channel; record everything."""

    def __init__(
        self,
        audit: AuditLog,
        *,
        scheduler: SchedulerAdapter | None = None,
        channel: CommandChannel | None = None,
        acks: AckWaiter | None = None,
        dry_run: bool = False,
        attempts: int = 3,
        backoff_s: float = 0.5,
        ack_timeout_s: float = 120.0,
        clock: Callable[[], int] = now_ms,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.audit = audit
        self.scheduler = scheduler or NoScheduler()
        self.channel = channel
        self.acks = acks
        self.dry_run = dry_run
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.ack_timeout_s = ack_timeout_s
        self.clock = clock
        self.sleep = sleep

    def apply(self, plan: Plan) -> list[Outcome]:
        out: list[Outcome] = []
        for action in plan.actions:
            if out and not out[-1].succeeded and not self.dry_run:
                self._record(action, "skipped", f"not attempted: {out[-1].action.kind} failed")
                out.append(Outcome(action, "skipped", "prerequisite failed"))
                continue
            out.append(self._apply_one(action))
        return out

    def _apply_one(self, action: Action) -> Outcome:
        if self.audit.succeeded(action.action_id):
            return Outcome(action, "duplicate", "already succeeded")
        self._record(action, "planned", action.reason)
        if self.dry_run:
            self._record(action, "skipped", f"dry run: would {action.kind} {action.node}")
            return Outcome(action, "skipped", "dry run")
        detail = ""
        for attempt in range(1, self.attempts + 1):
            self._record(action, "started", action.reason, attempt)
            try:
                detail = self._do(action)
            except Exception as exc:  # any adapter failure is retried, then audited as failed
                detail = f"{type(exc).__name__}: {exc}"
                log.warning("%s attempt %d failed: %s", action.action_id, attempt, detail)
                self._record(action, "failed", detail, attempt)
                if attempt < self.attempts:
                    self.sleep(self.backoff_s * 2 ** (attempt - 1))
                continue
            self._record(action, "succeeded", detail or action.reason, attempt)
            return Outcome(action, "succeeded", detail)
        return Outcome(action, "failed", detail)

    def _do(self, action: Action) -> str:
        if action.kind in ("drain", "undrain"):
            self.scheduler.set_drained(action.node, action.kind == "drain", action.reason)
            return ""
        if action.kind in ("checkpoint", "migrate"):
            if self.channel is None or action.job is None:
                raise RuntimeError("no command channel to reach the job")
            cmd = Command(
                action.action_id,
                action.job,
                "checkpoint" if action.kind == "checkpoint" else "leave",
                action.node,
                self.clock(),
            )
            self.channel.send(cmd)
            if action.kind == "migrate" and self.acks is not None:
                ack = self.acks.wait(cmd, self.ack_timeout_s)
                if ack is None:
                    raise TimeoutError(f"no ack from job {action.job} within {self.ack_timeout_s:.0f}s")
                if ack.startswith(FAILED_ACK):  # the job could not save its state: do not drain under it
                    raise RuntimeError(f"job {action.job}: {ack}")
                return ack
            return ""
        return ""  # pin / unpin: the audit record is the effect

    def _record(self, action: Action, status: str, reason: str, attempt: int = 1) -> None:
        self.audit.record(
            MitigationEvent(
                ts=self.clock(),
                node=action.node,
                action_id=action.action_id,
                action=action.kind,
                status=status,
                job=action.job,
                reason=reason,
                dry_run=self.dry_run,
                attempt=attempt,
            )
        )
