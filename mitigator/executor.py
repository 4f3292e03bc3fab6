"""The executor: drives each plan's actions to an end — audited first, retried without blocking.

:meth:`Executor.submit` makes every action's intent durable (``planned``) before anything is
touched, and queues it; an action id that already succeeded is a ``duplicate`` and is not queued
again. :meth:`Executor.run_due` then starts the attempts that are due, one action at a time per
node (a node's migration before its drain), on a worker pool when there is one, so a scheduler
that hangs holds only its own node, for at most its call's timeout. Every attempt is audited:
``started``, then ``succeeded``, ``partial`` (the parts that held, named) or ``failed``.

What a failure leads to depends on the action:

* a drain or undrain is the node's desired state: it is repeated, with exponential backoff capped
  at ``max_backoff_s``, until the scheduler takes it (a slurmctld back from an outage, an eviction
  that goes through at last), unless the scheduler calls the error permanent (an unknown node),
  which is recorded once;
* a job-bound command (checkpoint, leave) gets ``attempts`` tries; a job that answers that it could
  not save its state gets none more, and the node is not drained under it.

When an action ends in failure, the actions queued after it in the same plan are ``skipped``.
A dry run records ``planned`` and ``skipped`` and touches nothing. An audit write that fails
raises :class:`~foreshock.mitigator.audit.AuditUnavailable` out of :meth:`submit` or :meth:`run_due`; the
action stays queued, to be repeated (idempotently) once the log can be written again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from foreshock.ingest.contract import MitigationEvent
from foreshock.ingest.stream import now_ms
from foreshock.mitigator.audit import RETRYING, AuditLog, AuditUnavailable
from foreshock.mitigator.channels import FAILED_ACK, AckWaiter, Command, CommandChannel
from foreshock.mitigator.plan import Action, Plan
from foreshock.mitigator.schedulers import NoScheduler, SchedulerAdapter, SchedulerError

__all__ = ["Outcome", "Executor", "InFlight"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_DESIRED_STATE = ("drain", "undrain")  # repeated until they hold


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an action ended: succeeded | failed | skipped | duplicate."""

    action: Action
    status: str
    detail: str = ""
    permanent: bool = False  # the scheduler does not know the node

    @property
    def succeeded(self) -> bool:
        return self.status in ("succeeded", "duplicate")


@dataclass(frozen=True, slots=True)
class InFlight:
    """An action not yet ended, for ``GET /status``."""

    action: Action
    attempts: int
    next_attempt_in_s: float
    running: bool


@dataclass(frozen=True, slots=True)
class _Result:
    ok: bool
    detail: str
    permanent: bool = False
    final: bool = False  # no further attempt can help (the job could not save its state)
    audit_error: AuditUnavailable | None = None


@dataclass(slots=True)
class _Task:
    """A plan's remaining actions for one node, the attempts of the first, when to try next."""

    actions: list[Action]
    attempts: int = 0
    due: float = 0.0
    running: Future | None = None


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
        max_backoff_s: float = 60.0,
        ack_timeout_s: float = 120.0,
        workers: int = 0,
        clock: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        if attempts < 1 or workers < 0:
            raise ValueError("attempts must be >= 1 and workers >= 0")
        self.audit = audit
        self.scheduler = scheduler or NoScheduler()
        self.channel = channel
        self.acks = acks
        self.dry_run = dry_run
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.ack_timeout_s = ack_timeout_s
        self.clock = clock
        self.monotonic = monotonic
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mitigator-action") if workers else None
        self._channel_lock = threading.Lock()  # one job-bound command (and its ack wait) at a time
        self._tasks: dict[str, list[_Task]] = {}

    def submit(self, plan: Plan) -> list[Outcome]:
        """Record each action's intent, then queue it; returns what ended at once (duplicates, dry runs)."""
        out: list[Outcome] = []
        queued: list[Action] = []
        for action in plan.actions:
            if self.audit.succeeded(action.action_id):
                out.append(Outcome(action, "duplicate", "already succeeded"))
                continue
            if self._queued(action.action_id):
                continue  # a replayed record: the action is already being driven
            self._record(action, "planned", action.reason)
            if self.dry_run:
                self._record(action, "skipped", f"dry run: would {action.kind} {action.node}")
                out.append(Outcome(action, "skipped", "dry run"))
                continue
            queued.append(action)
        self.resume(queued)
        return out

    def resume(self, actions: Iterable[Action]) -> None:
        """Queue actions whose intent is already recorded (a cold start's open actions), in order."""
        by_node: dict[str, list[Action]] = {}
        for a in actions:
            by_node.setdefault(a.node, []).append(a)
        for node, todo in by_node.items():
            self._tasks.setdefault(node, []).append(_Task(todo, due=self.monotonic()))

    def run_due(self) -> list[Outcome]:
        """Start the attempts that are due and collect those that finished; returns the actions ended."""
        out: list[Outcome] = []
        for node in list(self._tasks):
            while node in self._tasks:  # a node's next action starts as soon as the one before it ended
                task = self._tasks[node][0]
                if task.running is not None:
                    if not task.running.done():
                        break
                    result, task.running = task.running.result(), None
                elif task.due <= self.monotonic():
                    if self._pool is not None:
                        task.running = self._pool.submit(self._attempt, task.actions[0], task.attempts + 1)
                        break
                    result = self._attempt(task.actions[0], task.attempts + 1)
                else:
                    break
                out += self._advance(node, task, result)
        return out

    def next_due_s(self) -> float | None:
        """Seconds until the next attempt is due (0 while one runs), None when nothing is queued."""
        if not self._tasks:
            return None
        now = self.monotonic()
        return min(0.0 if t[0].running else max(0.0, t[0].due - now) for t in self._tasks.values())

    def in_flight(self) -> list[InFlight]:
        now = self.monotonic()
        return [
            InFlight(a, t.attempts if i == 0 else 0, max(0.0, t.due - now) if i == 0 else 0.0,
                     i == 0 and t.running is not None)
            for tasks in list(self._tasks.values()) for t in tasks for i, a in enumerate(t.actions)
        ]

    def busy(self) -> set[str]:
        """Nodes with an action queued or running (a reconciliation leaves them to this executor)."""
        return set(self._tasks)

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the worker pool, off the caller's loop; without a pool, at once on this thread."""
        if self._pool is not None:
            return self._pool.submit(fn)
        done: Future[T] = Future()
        try:
            done.set_result(fn())
        except Exception as exc:
            done.set_exception(exc)
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _queued(self, action_id: str) -> bool:
        return any(a.action_id == action_id for ts in self._tasks.values() for t in ts for a in t.actions)

    def _advance(self, node: str, task: _Task, result: _Result) -> list[Outcome]:
        if result.audit_error is not None:  # the effect may have happened: repeat it once the log is back
            task.due = self.monotonic()
            raise result.audit_error
        action = task.actions[0]
        task.attempts += 1
        if result.ok:
            task.actions.pop(0)
            task.attempts = 0
            out = [Outcome(action, "succeeded", result.detail)]
        elif not self._ends(action, task.attempts, result):
            task.due = self.monotonic() + self._backoff(task.attempts)
            return []
        else:
            out = [Outcome(action, "failed", result.detail, result.permanent)]
            for rest in task.actions[1:]:
                self._record(rest, "skipped", f"not attempted: {action.kind} failed")
                out.append(Outcome(rest, "skipped", "prerequisite failed"))
            task.actions.clear()
        if not task.actions:
            self._tasks[node].pop(0)
            if not self._tasks[node]:
                del self._tasks[node]
        return out

    def _ends(self, action: Action, attempts: int, result: _Result) -> bool:
        if result.permanent or result.final:
            return True
        return action.kind not in _DESIRED_STATE and attempts >= self.attempts

    def _backoff(self, attempts: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempts - 1))

    def _attempt(self, action: Action, attempt: int) -> _Result:
        """One try, audited (runs on a worker when there is a pool; never raises)."""
        try:
            self._record(action, "started", action.reason, attempt)
            try:
                detail = self._do(action)
            except SchedulerError as exc:
                result = _Result(False, str(exc), permanent=exc.permanent)
                self._record_failure(action, attempt, result, done=exc.done)
                return result
            except _JobCouldNotSave as exc:
                result = _Result(False, str(exc), final=True)
                self._record_failure(action, attempt, result)
                return result
            except Exception as exc:  # any other adapter or channel failure is retried like a transient one
                result = _Result(False, f"{type(exc).__name__}: {exc}")
                self._record_failure(action, attempt, result)
                return result
            self._record(action, "succeeded", detail or action.reason, attempt)
            return _Result(True, detail)
        except AuditUnavailable as exc:
            return _Result(False, str(exc), audit_error=exc)

    def _record_failure(
        self, action: Action, attempt: int, result: _Result, done: tuple[str, ...] = ()
    ) -> None:
        ends = self._ends(action, attempt, result)
        reason = f"permanent: {result.detail}" if result.permanent else result.detail
        if not ends:
            reason += f"{RETRYING} in {self._backoff(attempt):g} s"
        log.warning("%s attempt %d: %s", action.action_id, attempt, reason)
        if done:
            self._record(action, "partial", f"done: {', '.join(done)}; not done: {reason}", attempt)
        else:
            self._record(action, "failed", reason, attempt)

    def _do(self, action: Action) -> str:
        if action.kind in _DESIRED_STATE:
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
            with self._channel_lock:
                self.channel.send(cmd)
                if action.kind != "migrate" or self.acks is None:
                    return ""
                ack = self.acks.wait(cmd, self.ack_timeout_s)
            if ack is None:
                raise TimeoutError(f"no ack from job {action.job} within {self.ack_timeout_s:.0f}s")
            if ack.startswith(FAILED_ACK):  # the job could not save its state: do not drain under it
                raise _JobCouldNotSave(f"job {action.job}: {ack}")
            return ack
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


class _JobCouldNotSave(RuntimeError):
    """The hook acked a leave with :data:`~foreshock.mitigator.channels.FAILED_ACK`."""
