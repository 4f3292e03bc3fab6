"""The drill's mitigator: the real service, on the bus and the scheduler the drill was given.

In the ``warned`` and ``unwarned`` scenarios :class:`DrillMitigator` runs a
:class:`~foreshock.mitigator.service.MitigationService` for the whole scenario: the drill publishes
the training nodes' risk scores on the bus (a fresh in-memory bus by default; a real Kafka broker
with ``foreshock drill --bus kafka``), the service plans from them, commands the job through the
file channel, and drains the warned node through the scheduler (none by default; a real Slurm or a
Kubernetes API server with ``--scheduler``). At the end it reports what the scheduler shows, then
publishes ``repaired`` for each node it drained and waits until the scheduler shows it back in
service, so the drill leaves the cluster as it found it.

A broker or a cluster may carry more than the drill: the service reads only what is published
after it joined (the composition root passes ``auto_offset_reset=latest`` for Kafka), plans only for
the drill's nodes, and its scheduler touches and reports only those.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from foreshock.ingest.bus import Bus, InMemoryBus
from foreshock.ingest.contract import NodeEvent, RiskScore
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.channels import FileChannel
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.jobs import FileJobs
from foreshock.mitigator.plan import Plan
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig, PolicyContext
from foreshock.mitigator.schedulers import SchedulerAdapter, SchedulerError
from foreshock.mitigator.service import MitigationService

__all__ = ["DrillParts", "DrillMitigator"]


@dataclass(frozen=True, slots=True)
class DrillParts:
    """What the drill's mitigator runs on, built by the composition root.

    ``bus`` None: a fresh in-memory bus per scenario. ``scheduler`` None: drains are only audited.
    ``consumer_config`` is passed to the bus's consumer (where a new consumer group starts).
    """

    bus: Bus | None = None
    bus_name: str = "memory"
    scheduler: SchedulerAdapter | None = None
    scheduler_name: str = "none"
    consumer_config: Mapping[str, object] = field(default_factory=dict)


class _DrillNodesPolicy:
    """The drill's policy, for the drill's nodes only; another node's record changes nothing."""

    def __init__(self, config: PolicyConfig, nodes: Collection[str]):
        self.config = config
        self.nodes = frozenset(nodes)
        self._policy = ExpectedLossPolicy(config)

    def __call__(self, ctx: PolicyContext) -> Plan:
        node = ctx.record.node
        return self._policy(ctx) if node in self.nodes else Plan(node, ctx.view(node))


class _DrillNodesScheduler:
    """A scheduler adapter limited to the drill's nodes: it drains and reports no other node."""

    def __init__(self, scheduler: SchedulerAdapter, nodes: Collection[str]):
        self.scheduler = scheduler
        self.nodes = frozenset(nodes)

    def set_drained(self, node: str, drained: bool, reason: str) -> None:
        if node not in self.nodes:
            raise SchedulerError(f"{node} is not one of the drill's nodes", permanent=True)
        self.scheduler.set_drained(node, drained, reason)

    def foreshock_drained(self) -> set[str] | None:
        out = self.scheduler.foreshock_drained()
        return None if out is None else out & self.nodes


class DrillMitigator:
    """The service on a thread for one scenario (start, warn, finish, close)."""

    def __init__(self, work: Path, control: Path, nodes: tuple[str, ...], spare: str, parts: DrillParts,
                 ack_timeout_s: float):
        self.parts = parts
        self.control = control
        self.bus = parts.bus or InMemoryBus()
        self.scheduler = None if parts.scheduler is None else _DrillNodesScheduler(parts.scheduler, nodes)
        config = PolicyConfig(spare_nodes=(spare,), restart_s=60.0, migration_s=5.0, confirm=2)
        engine = MitigationEngine(_DrillNodesPolicy(config, nodes), jobs=FileJobs(control), fleet_size=3)
        channel = FileChannel(control)
        executor = Executor(AuditLog(work / "audit.sqlite", bus=self.bus), scheduler=self.scheduler,
                            channel=channel, acks=channel, ack_timeout_s=ack_timeout_s, workers=2)
        group = f"foreshock-drill-{uuid.uuid4().hex}"  # a group of its own: no other run's offsets
        self.service = MitigationService(self.bus, engine, executor, group=group, reconcile_every_s=0,
                                         consumer_config=parts.consumer_config)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.service.run, args=(self._stop, 0.05), daemon=True)

    def start(self, deadline: float, trainers: tuple[str, ...]) -> None:
        """Run the loop; once its consumer owns its partitions, publish the trainers' low risk."""
        self._thread.start()
        while not self.service.stream.consumer.assignment():  # a broker's group join takes seconds
            if time.monotonic() > deadline:
                raise TimeoutError("drill: the mitigator's consumer was never assigned its partitions")
            time.sleep(0.05)
        if self.parts.bus is not None:
            time.sleep(1.0)  # a new group's start at the log end is resolved on its next fetch
        self._risk(trainers, 0.02)

    def warn(self, node: str, deadline: float) -> tuple[int, int]:
        """Rising risk on ``node`` until the mitigator migrates its job and drains it.

        Returns (the first alert's ms, the ms the job acked that ``node``'s state is safe)."""
        self._risk((node,), 0.45)
        alert_ms = 0
        while not self._ended("drain"):
            if time.monotonic() > deadline:
                raise TimeoutError("drill: the mitigator did not migrate and drain the warned node in time")
            if not self._planned(node):
                alert_ms = alert_ms or now_ms()
                self._risk((node,), 0.95)  # the predictor keeps scoring until the mitigator acts
            time.sleep(0.2)
        migrate = next(o for o in self.service.outcomes if o.action.kind == "migrate")
        if not migrate.succeeded:
            raise RuntimeError(f"drill: migration failed: {migrate.detail}")
        ack = self.control / str(migrate.action.job) / "acks" / f"{migrate.action.action_id}.json"
        return alert_ms, json.loads(ack.read_text())["ts"]

    def finish(self, deadline: float) -> dict:
        """What the mitigator did and what the scheduler shows; then every drained node returned."""
        drained = None if self.scheduler is None else sorted(self.scheduler.foreshock_drained() or ())
        report = {
            "bus": self.parts.bus_name,
            "scheduler": self.parts.scheduler_name,
            "records": self.service.stream.records,
            "actions": [[o.action.kind, o.action.node, o.status] for o in self.service.outcomes],
            "drained": drained,
            "returned": None,
        }
        if drained:
            publish(self.bus, [NodeEvent(node=n, ts=now_ms(), event="repaired") for n in drained])
            self.bus.flush()
            while self.scheduler.foreshock_drained():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"drill: {', '.join(drained)} not back in service after 'repaired'")
                time.sleep(0.2)
            report["returned"] = True
        return report

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.service.close()
        if self.parts.bus is None:
            self.bus.close()

    def _risk(self, nodes: tuple[str, ...], p: float) -> None:
        ts = now_ms()
        publish(self.bus, [RiskScore(node=n, ts=ts, probability=p, alert=p >= 0.8, threshold=0.8)
                           for n in nodes])
        self.bus.flush()

    def _ended(self, kind: str) -> bool:
        return any(o.action.kind == kind for o in self.service.outcomes)

    def _planned(self, node: str) -> bool:
        return any(e.node == node and e.action in ("migrate", "drain") and e.status == "planned"
                   for e in self.service.executor.audit.events())
