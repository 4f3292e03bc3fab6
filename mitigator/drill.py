"""``foreshock drill``: prove the prediction → snapshot → migrate path on your own machine.

Runs the drill job (:mod:`mitigator.drill_job`) under real torchrun elastic with three agents on
this host — A and B train, C stands by as the spare (``--nnodes=2:2``: a third agent waits in the
rendezvous' redundancy list) — twice:

* **warned**: risk on B rises on an in-memory bus; the real mitigator (engine + executor + file
  command channel) plans a migration; the hook snapshots, B leaves, A and C re-rendezvous and
  resume from that snapshot; then B is killed.
* **unwarned**: B is killed with no warning; A and C resume from the last periodic snapshot.

Steps lost = last step reached before the failure − step resumed from; seconds lost = the time
those steps had taken; alert → snapshot = risk record over the threshold → snapshot durable.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ingest.bus import InMemoryBus
from ingest.contract import RiskScore
from ingest.stream import now_ms, publish
from mitigator.audit import AuditLog
from mitigator.channels import FileChannel
from mitigator.engine import MitigationEngine
from mitigator.executor import Executor
from mitigator.jobs import FileJobs
from mitigator.policy import ExpectedLossPolicy, PolicyConfig
from mitigator.service import MitigationService

__all__ = ["DrillSettings", "ScenarioResult", "run_scenario", "run_drill"]

JOB = "drill"


@dataclass(frozen=True, slots=True)
class DrillSettings:
    """Pace of the drill job; defaults keep each scenario well under a minute on two cores."""

    every: int = 40  # periodic snapshot interval (steps)
    step_seconds: float = 0.05
    event_after_steps: int = 30  # steps after the last periodic snapshot when risk rises / B dies
    resume_steps: int = 10  # steps to see on A+C after the failure before stopping
    timeout_s: float = 90.0
    python: str = sys.executable


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    warned: bool
    last_step_before: int
    resumed_from: int
    steps_lost: int
    seconds_lost: float
    downtime_seconds: float
    alert_to_snapshot_seconds: float | None
    alert_to_resumed_seconds: float | None
    resumed_nodes: tuple[str, ...]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(progress: Path) -> list[dict]:
    if not progress.exists():
        return []
    return [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]


class _Cluster:
    """Three torchrun agents, each in its own session so a whole 'node' can be killed at once."""

    def __init__(self, work: Path, s: DrillSettings):
        self.work, self.s = work, s
        self.port = _free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.progress = work / "progress.jsonl"
        self.control = work / "control"
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, node: str, host: bool) -> None:
        cmd = [
            self.s.python,
            "-m",
            "torch.distributed.run",
            "--nnodes=2:2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id={JOB}",
            "--rdzv-conf",
            f"is_host={str(host).lower()},join_timeout=60,last_call_timeout=1,"
            "keep_alive_interval=1,keep_alive_max_attempt=3",
            "--max-restarts=3",
            "--monitor-interval=0.2",
            "-m",
            "mitigator.drill_job",
            "--job",
            JOB,
            "--drill-node",
            node,
            "--control-dir",
            str(self.control),
            "--ckpt-dir",
            str(self.work / "ckpt"),
            "--progress",
            str(self.progress),
            "--every",
            str(self.s.every),
            "--step-seconds",
            str(self.s.step_seconds),
        ]
        # A spare that joins in a later round never gets the shared TCP store's address when rank 0
        # kept its store from round 0 (torch 2.x shares it by default), so opt out of sharing.
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "LOGLEVEL": "INFO",
        }
        log = open(self.work / "logs" / f"{node}.log", "w")
        self.procs[node] = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        log.close()

    def kill(self, node: str) -> None:
        """The node dies: SIGKILL its agent and every process under it (workers run in their own groups)."""
        proc = self.procs.get(node)
        if proc is None or proc.poll() is not None:
            return
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

    def stop(self) -> None:
        for node in self.procs:
            self.kill(node)
        for proc in self.procs.values():
            proc.wait(timeout=10)

    def wait_for(self, what: str, predicate, deadline: float) -> dict | bool:
        while time.monotonic() < deadline:
            for node, proc in self.procs.items():
                if node != "B" and proc.poll() is not None:
                    raise RuntimeError(
                        f"agent {node} exited ({proc.returncode}) while waiting for {what}; "
                        f"see {self.work / 'logs'}"
                    )
            hit = predicate(_read(self.progress))
            if hit:
                return hit
            time.sleep(0.05)
        raise TimeoutError(f"drill: timed out waiting for {what}; logs in {self.work / 'logs'}")


def _max_step(events: list[dict]) -> int:
    return max((e["step"] for e in events if e["event"] == "step"), default=0)


def run_scenario(work: Path, warned: bool, settings: DrillSettings | None = None) -> ScenarioResult:
    """One drill run in ``work`` (see the module docstring)."""
    s = settings or DrillSettings()
    c = _Cluster(work, s)
    deadline = time.monotonic() + s.timeout_s
    try:
        c.start("A", host=True)
        c.start("B", host=False)
        c.wait_for("A and B training", lambda ev: _max_step(ev) >= 3, deadline)
        c.start("C", host=False)  # joins the redundancy list: the spare
        event_step = s.every + s.event_after_steps
        c.wait_for(f"step {event_step}", lambda ev: _max_step(ev) >= event_step, deadline)
        alert_ms = None
        if warned:
            alert_ms, failure_ms = _warn_and_migrate(c, deadline)
            c.procs["B"].wait(timeout=max(1.0, deadline - time.monotonic()))
        else:
            failure_ms = now_ms()
        c.kill("B")  # the predicted failure lands (warned) / the node dies unannounced (unwarned)

        def resumed(ev: list[dict]) -> dict | None:
            r = next(
                (
                    e
                    for e in ev
                    if e["event"] == "resume" and e["ts_ms"] >= failure_ms - 1000 and e["node"] != "B"
                ),
                None,
            )
            if r and any(
                e["event"] == "step" and e["ts_ms"] > r["ts_ms"] and e["step"] >= r["step"] + s.resume_steps
                for e in ev
            ):
                return r
            return None

        resume = c.wait_for("training resumed on A and C", resumed, deadline)
    finally:
        c.stop()
    return _measure(_read(c.progress), resume, failure_ms, warned, alert_ms)


def _warn_and_migrate(c: _Cluster, deadline: float) -> tuple[int, int]:
    """Rising risk on B through the real mitigator; returns (alert ms, snapshot durable / B left ms)."""
    bus = InMemoryBus()
    channel = FileChannel(c.control)
    engine = MitigationEngine(
        ExpectedLossPolicy(PolicyConfig(spare_nodes=("C",), restart_s=60.0, migration_s=5.0, confirm=2)),
        jobs=FileJobs(c.control),
        fleet_size=3,
    )
    executor = Executor(
        AuditLog(c.work / "audit.sqlite", bus=bus),
        channel=channel,
        acks=channel,
        ack_timeout_s=max(5.0, deadline - time.monotonic()),
    )
    service = MitigationService(bus, engine, executor)
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop, 0.05), daemon=True)
    thread.start()
    alert_ms = 0
    try:
        for p in (0.45, 0.85, 0.95):
            ts = now_ms()
            alert = p >= 0.8
            alert_ms = alert_ms or (ts if alert else 0)
            publish(bus, [RiskScore(node="B", ts=ts, probability=p, alert=alert, threshold=0.8)])
            time.sleep(0.05)
        while not any(o.action.kind == "drain" for o in service.outcomes):
            if time.monotonic() > deadline:
                raise TimeoutError("drill: the mitigator did not migrate B in time")
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
        service.close()
    migrate = next(o for o in service.outcomes if o.action.kind == "migrate")
    if not migrate.succeeded:
        raise RuntimeError(f"drill: migration failed: {migrate.detail}")
    ack = json.loads((c.control / JOB / "acks" / f"{migrate.action.action_id}.json").read_text())
    return alert_ms, ack["ts"]


def _measure(
    ev: list[dict], resume: dict, failure_ms: int, warned: bool, alert_ms: int | None
) -> ScenarioResult:
    before = [e for e in ev if e["event"] == "step" and e["ts_ms"] < resume["ts_ms"]]
    last = max(e["step"] for e in before)
    first_seen: dict[int, int] = {}
    for e in sorted(before, key=lambda e: e["ts_ms"]):
        first_seen.setdefault(e["step"], e["ts_ms"])
    start = resume["step"]
    start_ms = first_seen.get(start) or min(e["ts_ms"] for e in ev if e["event"] == "resume")
    after = [e["ts_ms"] for e in ev if e["event"] == "step" and e["ts_ms"] > resume["ts_ms"]]
    nodes = tuple(sorted({e["node"] for e in ev if e["event"] == "resume" and e["ts_ms"] >= resume["ts_ms"]}))
    return ScenarioResult(
        warned=warned,
        last_step_before=last,
        resumed_from=start,
        steps_lost=last - start,
        seconds_lost=round((first_seen[last] - start_ms) / 1000, 3) if last > start else 0.0,
        downtime_seconds=round((min(after) - failure_ms) / 1000, 3),
        alert_to_snapshot_seconds=None if alert_ms is None else round((failure_ms - alert_ms) / 1000, 3),
        alert_to_resumed_seconds=None if alert_ms is None else round((min(after) - alert_ms) / 1000, 3),
        resumed_nodes=nodes,
    )


def run_drill(settings: DrillSettings | None = None, workdir: Path | None = None) -> dict:
    """Warned and unwarned runs; the figures as a flat dict (the ``--json`` output)."""
    with tempfile.TemporaryDirectory(prefix="foreshock-drill-") as tmp:
        root = Path(workdir or tmp)
        warned = run_scenario(root / "warned", True, settings)
        unwarned = run_scenario(root / "unwarned", False, settings)
    return {
        "warned_steps_lost": warned.steps_lost,
        "unwarned_steps_lost": unwarned.steps_lost,
        "warned_seconds_lost": warned.seconds_lost,
        "unwarned_seconds_lost": unwarned.seconds_lost,
        "alert_to_snapshot_seconds": warned.alert_to_snapshot_seconds,
        "warned": asdict(warned),
        "unwarned": asdict(unwarned),
    }
