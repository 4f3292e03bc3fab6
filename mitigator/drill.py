"""``foreshock drill``: prove the prediction → snapshot → migrate path and fast recovery on your own machine.

Runs the drill job (:mod:`foreshock.mitigator.drill_job`) under real torchrun elastic, one agent per
simulated node on this host: A and B train (``--nnodes=2:2``), C (and D) wait as hot spares in the
rendezvous' redundancy list. The rendezvous store is hosted by the drill itself, as an etcd or a
stable head node would be on a cluster, so any node may die. Each node has its own memory-tier
folder; killing a node kills its process tree and deletes that folder (its RAM is gone).

Scenarios (:data:`SCENARIOS`), each on a fresh cluster:

* ``warned``: risk on B rises on the bus; the real mitigator (service, engine, executor, file
  command channel; :mod:`foreshock.mitigator.drill_mitigation`) plans a migration; the hook snapshots
  to memory, waits until B's buddy holds the copy, B leaves and is drained through the scheduler;
  A and C re-rendezvous, C fetches B's state from A's memory; then B dies.
* ``unwarned``: B is killed with no warning; A restores from its own memory, C from A's copy. The
  mitigator runs on the bus all along and acts on nothing.
* ``pair_lost``: A and B (each other's buddy) die together; C and D restore from the durable tier.
* ``corrupt_replica``: B dies and the copies of B's state in A's memory (both slots) are corrupted:
  the CRC check catches it and the job falls back to the durable tier.
* ``during_snapshot``: B dies while a durable snapshot is being written (and a memory copy or a
  replication round is usually in flight): the unfinished snapshot is never marked complete and the
  job restores from memory.
* ``hung`` (only when named): B's worker freezes (SIGSTOP) while its agent stays up, so no socket
  closes, torchrun's keep-alive goes on and the survivors' collective would wait for its timeout;
  the hook's heartbeat detects it.

The bus is a fresh in-memory one and no scheduler is told, unless the caller passes
:class:`~foreshock.mitigator.drill_mitigation.DrillParts` (``foreshock drill --bus kafka --scheduler
slurm``); the nodes are then named after scheduler nodes (``DrillSettings.nodes``: A, B, C, D in
that order).

For each: steps lost (last step reached − step resumed from), the recovery time failure → first
step split into detection → rendezvous → worker start → restore → first step, the restore source,
and whether the resumed run reproduces the uninterrupted one bit for bit (the CRC32C of each
rank's parameters at every step both runs reached).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import psutil

from foreshock.ingest.stream import now_ms
from foreshock.mitigator.drill_mitigation import DrillMitigator, DrillParts

__all__ = ["SCENARIOS", "DrillSettings", "ScenarioResult", "run_scenario", "run_drill"]

JOB = "drill"
SCENARIOS = ("warned", "unwarned", "pair_lost", "corrupt_replica", "during_snapshot")
EXTRA_SCENARIOS = ("hung",)  # run when named: it waits out the heartbeat timeout
COMPONENTS = ("detection", "rendezvous", "worker_start", "restore", "first_step")


@dataclass(frozen=True, slots=True)
class DrillSettings:
    """The drill job's size and pace; defaults keep each scenario under a minute on two cores."""

    state_mb: int = 64  # parameters + momentum per rank
    memory_every: int = 1
    durable_every: int = 20
    step_seconds: float = 0.0  # extra simulated compute per step
    event_after_steps: int = 12  # steps after the first durable snapshot when risk rises / nodes die
    resume_steps: int = 8  # steps to see after the recovery before stopping
    timeout_s: float = 1800.0  # a whole scenario, at most
    quiet_s: float = 90.0  # at most this long without a progress line (torch import and recovery included)
    python: str = sys.executable
    scenarios: tuple[str, ...] = SCENARIOS
    nodes: tuple[str, ...] = ("A", "B", "C", "D")  # trainers A, B; spares C, D (pair_lost only)

    def __post_init__(self) -> None:
        need = 4 if "pair_lost" in self.scenarios else 3
        if len(set(self.nodes)) != len(self.nodes) or len(self.nodes) < need:
            raise ValueError(f"the drill needs {need} distinct node names for these scenarios, "
                             f"got {', '.join(self.nodes) or 'none'}")


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    name: str
    last_step_before: int
    resumed_from: int
    steps_lost: int
    seconds_lost: float
    recovery_seconds: float
    restore_source: str | None
    components_seconds: dict[str, float]
    bit_exact: bool
    compared_steps: int
    resumed_nodes: tuple[str, ...]
    alert_to_snapshot_seconds: float | None = None
    alert_to_resumed_seconds: float | None = None
    unfinished_snapshot_marked: bool | None = None
    restored_bytes: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def downtime_seconds(self) -> float:
        return self.recovery_seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(progress: Path) -> list[dict]:
    if not progress.exists():
        return []
    out = []
    for line in progress.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
            out.append(json.loads(line))
    return out


def _memory_root() -> Path:
    """Node-local tmpfs when there is one (RAM, as on a real node), else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class _Cluster:
    """Torchrun agents, each in its own session so a whole 'node' can be killed at once."""

    def __init__(self, work: Path, s: DrillSettings):
        import torch.distributed as dist  # the drill hosts the rendezvous store; torch only here

        self.work, self.s = work, s
        self.port = _free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False)
        self.procs: dict[str, subprocess.Popen] = {}
        self.progress = work / "progress.jsonl"
        self.control = work / "control"
        self.ckpt = work / "ckpt"
        self.memory = Path(tempfile.mkdtemp(prefix="foreshock-drill-", dir=_memory_root()))
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def memory_dir(self, node: str) -> Path:
        return self.memory / node

    def start(self, node: str) -> None:
        s = self.s
        cmd = [
            s.python, "-m", "torch.distributed.run", "--nnodes=2:2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={JOB}",
            "--rdzv-conf", "is_host=false,join_timeout=90,last_call_timeout=1,keep_alive_interval=1,"
            "keep_alive_max_attempt=3",
            "--max-restarts=3", "--monitor-interval=0.1",
            # its per-attempt logs beside the drill's own: by default each agent leaves a folder in /tmp
            f"--log-dir={self.work / 'logs' / 'torchelastic'}",
            "-m", "foreshock.mitigator.drill_job", "--job", JOB, "--drill-node", node,
            "--control-dir", str(self.control), "--ckpt-dir", str(self.ckpt),
            "--memory-dir", str(self.memory_dir(node)), "--progress", str(self.progress),
            "--state-mb", str(s.state_mb), "--memory-every", str(s.memory_every),
            "--durable-every", str(s.durable_every), "--step-seconds", str(s.step_seconds),
        ]
        # A spare that joins in a later round never gets the shared TCP store's address when rank 0
        # kept its store from round 0 (torch 2.x shares it by default), so opt out of sharing.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO"}
        log = open(self.work / "logs" / f"{node}.log", "w")
        self.procs[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, cwd=Path(__file__).resolve().parents[1])
        log.close()

    def kill(self, node: str) -> None:
        """The node dies: SIGKILL its agent and every process under it, and its memory is gone."""
        proc = self.procs.get(node)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                for p in tree:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
        shutil.rmtree(self.memory_dir(node), ignore_errors=True)

    def freeze(self, node: str) -> None:
        """The node's worker hangs (SIGSTOP) while its torchrun agent stays up: alive and silent."""
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(self.procs[node].pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.suspend()

    def stop(self) -> None:
        for node in self.procs:
            self.kill(node)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        shutil.rmtree(self.memory, ignore_errors=True)

    def wait_for(self, what: str, predicate, deadline: float, dead: tuple[str, ...] = ()):
        """Wait until ``predicate(progress)``: the job must keep writing progress while it runs."""
        seen, last = -1, time.monotonic()
        while time.monotonic() < min(deadline, last + self.s.quiet_s):
            for node, proc in self.procs.items():
                if node not in dead and proc.poll() is not None:
                    raise RuntimeError(f"agent {node} exited ({proc.returncode}) while waiting for {what}; "
                                       f"see {self.work / 'logs'}")
            events = _read(self.progress)
            if len(events) != seen:
                seen, last = len(events), time.monotonic()
            hit = predicate(events)
            if hit:
                return hit
            time.sleep(0.02)
        raise TimeoutError(f"drill: timed out waiting for {what}; logs in {self.work / 'logs'}")


def _max_step(events: list[dict]) -> int:
    return max((e["step"] for e in events if e["event"] == "step"), default=0)


def _corrupt_replica(c: _Cluster, node: str) -> int:
    """Flip bytes in every replica ``node``'s memory holds (a memory error); the newest one's step.

    Both slots: with the newest alone corrupted, the older slot's copy, one snapshot back, is a
    whole restore from memory whenever its replication had finished before the failure, which
    turns on timing; the job rightly takes it, and the scenario would not reach the durable tier."""
    from foreshock.mitigator.tiers.memory import SlotPair  # torch, which only the drill's own steps need

    held = SlotPair(c.memory_dir(node) / "local-0", "replica").committed()
    if not held:
        raise RuntimeError(f"drill: node {node} holds no replica to corrupt")
    for slot, header in held:
        with open(slot.path, "r+b") as f:
            f.seek(header.nbytes // 2)
            chunk = bytearray(f.read(64))
            f.seek(header.nbytes // 2)
            f.write(bytes(b ^ 0xFF for b in chunk))
    return held[0][1].step


def run_scenario(work: Path, name: str, settings: DrillSettings | None = None,
                 parts: DrillParts | None = None) -> ScenarioResult:
    """One drill scenario in ``work`` (see the module docstring)."""
    if name not in SCENARIOS + EXTRA_SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS + EXTRA_SCENARIOS)}")
    s = settings or DrillSettings()
    a, b, spare, *more = s.nodes
    c = _Cluster(work, s)
    deadline = time.monotonic() + s.timeout_s
    lost = (a, b) if name == "pair_lost" else (b,)
    spares = (spare, more[0]) if name == "pair_lost" else (spare,)
    alert_ms = failure_ms = None
    extra: dict = {}
    mitigator = None
    if name in ("warned", "unwarned"):
        mitigator = DrillMitigator(work, c.control, s.nodes, spare, parts or DrillParts(),
                                   ack_timeout_s=max(5.0, s.timeout_s))
    try:
        c.start(a)
        c.start(b)
        if mitigator is not None:
            mitigator.start(deadline, (a, b))
        c.wait_for(f"{a} and {b} training", lambda ev: _max_step(ev) >= 2, deadline)
        for spare in spares:
            c.start(spare)  # joins the redundancy list: a hot spare
        event_step = s.durable_every + s.event_after_steps
        if name == "during_snapshot":
            event_step = 2 * s.durable_every  # wait for the next durable save to begin, then strike
        c.wait_for(f"step {event_step}", lambda ev: _max_step(ev) >= event_step - 1, deadline)
        if name == "warned":
            alert_ms, failure_ms = mitigator.warn(b, deadline)
            c.procs[b].wait(timeout=max(1.0, deadline - time.monotonic()))
            c.kill(b)  # the predicted failure lands
        elif name == "hung":
            failure_ms = now_ms()
            c.freeze(b)  # no socket closes: only the heartbeat can tell
        elif name == "during_snapshot":
            saving = c.wait_for("a durable snapshot in flight", lambda ev: next(
                (e for e in ev if e.get("durable_started") and e["node"] == b and e["step"] >= event_step),
                None), deadline)
            failure_ms = now_ms()
            for node in lost:
                c.kill(node)
            extra["snapshot_step"] = saving["step"]
        else:
            failure_ms = now_ms()
            for node in lost:
                c.kill(node)
            if name == "corrupt_replica":
                extra["corrupted_step"] = _corrupt_replica(c, a)

        def resumed(ev: list[dict]) -> list[dict] | None:
            r = [e for e in ev if e["event"] == "resume" and e["ts_ms"] >= failure_ms]
            if len(r) < 2:
                return None
            after = [e for e in ev if e["event"] == "step" and e["ts_ms"] > max(x["ts_ms"] for x in r)]
            return r if _max_step(after) >= r[0]["step"] + s.resume_steps else None

        c.wait_for("training resumed", resumed, deadline, dead=lost)
        if mitigator is not None:
            extra["mitigation"] = mitigator.finish(deadline)
    finally:
        if mitigator is not None:
            mitigator.close()
        c.stop()
    events = _read(c.progress)
    result = _measure(name, events, failure_ms, alert_ms)
    if name == "during_snapshot":
        step = extra["snapshot_step"]
        finished = any(e.get("durable_done", {}).get("step") == step and e["ts_ms"] < failure_ms
                       for e in events)
        # the step may be saved again, rightly, once the job has resumed before it and redone it
        resumed_ms = min(e["ts_ms"] for e in events if e["event"] == "resume" and e["ts_ms"] >= failure_ms)
        marker = c.ckpt / f"step-{step:08d}" / "COMPLETE"
        marked = marker.exists() and json.loads(marker.read_text())["ts_ms"] < resumed_ms
        extra["snapshot_finished_before_failure"] = finished
        return _with(result, unfinished_snapshot_marked=marked and not finished, extra=extra)
    return _with(result, extra=extra)


def _with(r: ScenarioResult, **changes) -> ScenarioResult:
    return ScenarioResult(**{**asdict(r), **changes})


def _first(events: list[dict], pick) -> int | None:
    found = [e["ts_ms"] for e in events]
    return pick(found) if found else None


def _measure(name: str, ev: list[dict], failure_ms: int, alert_ms: int | None) -> ScenarioResult:
    """Steps lost, the recovery timeline and the bit-for-bit comparison from the progress lines."""
    before = [e for e in ev if e["event"] == "step" and e["ts_ms"] < failure_ms]
    resumes = [e for e in ev if e["event"] == "resume" and e["ts_ms"] >= failure_ms]
    resumed_at = max(e["ts_ms"] for e in resumes)
    start = resumes[0]["step"]
    after = [e for e in ev if e["event"] == "step" and e["ts_ms"] > resumed_at]
    last = _max_step(before)
    first_seen: dict[int, int] = {}
    for e in sorted(before, key=lambda e: e["ts_ms"]):
        first_seen.setdefault(e["step"], e["ts_ms"])
    # the timeline: failure, first survivor to notice, new workers started, ready, restored, stepping
    t0 = failure_ms
    t1 = _first([e for e in ev if e["event"] == "failed" and e["ts_ms"] >= t0], min) or t0
    new = [e for e in ev if e["ts_ms"] >= t0]
    t2 = _first([e for e in new if e["event"] == "start"], max) or t1
    t3 = _first([e for e in new if e["event"] == "ready"], max) or t2
    t4 = resumed_at
    first_step = {}
    for e in sorted(after, key=lambda e: e["ts_ms"]):
        first_step.setdefault(e["rank"], e["ts_ms"])
    t5 = max(first_step.values())
    marks = [t0, max(t0, t1), max(t1, t2), max(t2, t3), max(t3, t4), max(t4, t5)]
    components = {k: round((marks[i + 1] - marks[i]) / 1000, 3) for i, k in enumerate(COMPONENTS)}
    original = {(e["rank"], e["step"]): e["crc"] for e in before}
    again = {(e["rank"], e["step"]): e["crc"] for e in after}
    again.update({(e["rank"], e["step"]): e["crc"] for e in resumes})
    shared = [k for k in again if k in original]
    sources = {e.get("job_source") for e in resumes}
    return ScenarioResult(
        name=name,
        last_step_before=last,
        resumed_from=start,
        steps_lost=last - start,
        seconds_lost=round((first_seen[last] - first_seen.get(start, first_seen[last])) / 1000, 3)
        if last > start and start in first_seen else 0.0,
        recovery_seconds=round((t5 - t0) / 1000, 3),
        restore_source=sources.pop() if len(sources) == 1 else ",".join(sorted(map(str, sources))),
        components_seconds=components,
        bit_exact=bool(shared) and all(original[k] == again[k] for k in shared),
        compared_steps=len(shared),
        resumed_nodes=tuple(sorted({e["node"] for e in resumes})),
        alert_to_snapshot_seconds=None if alert_ms is None else round((failure_ms - alert_ms) / 1000, 3),
        alert_to_resumed_seconds=None if alert_ms is None else round((t5 - alert_ms) / 1000, 3),
        restored_bytes=max((e.get("state_bytes", 0) for e in ev), default=0),
    )


def _tier_figures(progress: list[dict], results: list[ScenarioResult]) -> dict:
    """Stall percentiles and the bandwidths each tier reached, over every scenario's progress."""
    stalls = np.array([e["stall_ms"] for e in progress if "stall_ms" in e], dtype=float)
    state = max((e.get("state_bytes", 0) for e in progress), default=0)
    rounds = [e["round"] for e in progress if "round" in e and e["round"]["seconds"] > 0]
    writes = [e["durable_done"]["seconds"] for e in progress if "durable_done" in e]
    steps = sorted(e["ts_ms"] for e in progress if e["event"] == "step" and e["rank"] == 0)
    by = {r.name: r for r in results}

    def gbps(nbytes: float, seconds: float | None) -> float | None:
        return round(nbytes / seconds / 1e9, 3) if seconds else None

    def restore_s(name: str) -> float | None:
        r = by.get(name)
        return r.components_seconds["restore"] if r else None

    return {
        "stall_ms_p50": round(float(np.percentile(stalls, 50)), 3) if len(stalls) else None,
        "stall_ms_p99": round(float(np.percentile(stalls, 99)), 3) if len(stalls) else None,
        "state_bytes": state,
        "step_seconds": round(float(np.median(np.diff(steps))) / 1000, 4) if len(steps) > 2 else None,
        "bandwidth_gb_per_s": {
            "memory_copy": gbps(state, float(np.median(stalls)) / 1000 if len(stalls) else None),
            "peer_replication": gbps(float(np.median([r["bytes"] for r in rounds])),
                                     float(np.median([r["seconds"] for r in rounds]))) if rounds else None,
            "peer_restore": gbps(state, restore_s("unwarned")),
            "durable_write": gbps(state, float(np.median(writes)) if writes else None),
            "durable_restore": gbps(state, restore_s("pair_lost")),
        },
    }


def run_drill(settings: DrillSettings | None = None, workdir: Path | None = None,
              parts: DrillParts | None = None) -> dict:
    """Every scenario of ``settings``; the figures as a dict (the ``--json`` output)."""
    s = settings or DrillSettings()
    p = parts or DrillParts()
    with tempfile.TemporaryDirectory(prefix="foreshock-drill-") as tmp:
        root = Path(workdir or tmp)
        results = [run_scenario(root / name, name, s, p) for name in s.scenarios]
        progress = [e for name in s.scenarios for e in _read(root / name / "progress.jsonl")]
    by = {r.name: r for r in results}
    out: dict = {"state_mb": s.state_mb, "memory_every": s.memory_every, "durable_every": s.durable_every,
                 "bus": p.bus_name, "scheduler": p.scheduler_name, **_tier_figures(progress, results)}
    for name in ("warned", "unwarned"):
        if name in by:
            out[f"{name}_steps_lost"] = by[name].steps_lost
            out[f"{name}_seconds_lost"] = by[name].seconds_lost
            out[name] = {**asdict(by[name]), "downtime_seconds": by[name].recovery_seconds}
    if "warned" in by:
        out["alert_to_snapshot_seconds"] = by["warned"].alert_to_snapshot_seconds
    out["scenarios"] = [asdict(r) for r in results]
    return out
