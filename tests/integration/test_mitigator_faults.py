"""The mitigator under faults, on a real Kafka broker and a real Slurm (munged, slurmctld, slurmd).

``foreshock mitigate`` runs as its own process, as in production, and is killed with SIGKILL,
starved of file space (``RLIMIT_FSIZE``, as ``ulimit -f`` does), given its audit log on storage
that is read-only (a tmpfs remounted ``ro``; needs root) or cannot be opened, fed a tombstone by
a foreign producer (kcat) and cut off from slurmctld. Each
case checks what ``sinfo`` shows afterwards, what the audit log says, and that the nodes drained
never exceed the breaker's limit (a 3-node fleet at ``--breaker-share 0.34``: one drain an hour).
The Kubernetes faults (an API server answering 500 or holding requests) run against the stand-in
API server in test_mitigator_kube_faults.py.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from foreshock.ingest.contract import TOMBSTONE_REASON, MitigationEvent, NodeEvent, RiskScore, Topic
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.kafka_local import free_port
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.channels import Command, FileChannel
from foreshock.mitigator.jobs import write_job_status
from foreshock.mitigator.plan import JobView
from tests.integration.test_poison_messages import committed_and_end, kcat_produce
from tests.integration.test_predictor_kafka import TopicReader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BREAKER_LIMIT = 1  # floor(0.34 x 3 nodes)
UNOPENABLE = "foreshock mitigate: cannot open the audit log {}: unable to open database file"


class Mitigator:
    """One ``foreshock mitigate`` process against the test broker and cluster."""

    def __init__(self, bootstrap: str, group: str, audit: Path, slurm, *extra: str):
        self.port = free_port()
        self.args = [
            sys.executable, "-m", "foreshock", "mitigate", "--kafka", bootstrap, "--group", group,
            "--scheduler", "slurm", "--audit", str(audit), "--metrics-port", str(self.port),
            "--fleet-size", "3", "--breaker-share", "0.34", "--max-drains", "3", "--scheduler-timeout", "4s",
            *extra,
        ]
        self.env = slurm.env
        self.output: list[str] = []
        self.proc: subprocess.Popen | None = None

    def start(self, file_limit: int | None = None) -> Mitigator:
        def limit() -> None:
            if file_limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, resource.RLIM_INFINITY))

        self.output = []
        self.proc = subprocess.Popen(  # output to a pipe: the file limit does not apply to it
            self.args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=limit)
        threading.Thread(target=lambda: self.output.extend(self.proc.stdout), daemon=True).start()
        wait_for(lambda: self._get("/healthz")[0] == 200, 60, "the mitigator to serve /healthz", self)
        return self

    def status(self) -> dict:
        return self._get("/status")[1]

    def readyz(self) -> tuple[int, dict]:
        return self._get("/readyz")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.log()

    def log(self) -> str:
        return "".join(self.output)[-4000:]

    def _get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)
        except OSError:
            return 0, {}


def wait_for(predicate, timeout_s: float, what: str, mitigator: Mitigator | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{mitigator.log() if mitigator else ''}")
        time.sleep(0.3)


def rows(audit: Path, where: str = "1=1") -> list[tuple]:
    """(action, status, node, action_id, reason) rows, oldest first; the connection is closed again."""
    db = sqlite3.connect(f"file:{audit}?mode=ro", uri=True)
    try:
        sql = "SELECT action, status, node, action_id, reason FROM mitigation_events"
        return db.execute(f"{sql} WHERE {where} ORDER BY seq").fetchall()
    finally:
        db.close()


def drained(slurm) -> list[str]:
    return sorted(n for n, s in slurm.states().items() if "drain" in s)


def alert(bootstrap: str, *nodes: str, ts: int | None = None, records: int = 2) -> None:
    bus = KafkaBus(bootstrap)
    t = now_ms() if ts is None else ts
    publish(bus, [RiskScore(node=n, ts=t + i, probability=0.95, alert=True, threshold=0.8)
                  for n in nodes for i in range(records)])
    bus.flush()
    bus.close()


def start_at_end(bootstrap: str, group: str) -> None:
    """Commit ``group`` at the end of the mitigator's topics: it reads only what this test publishes."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in (Topic.RISK, Topic.NODE_EVENTS, Topic.MITIGATION)
                 for p in sorted(consumer.partitions_for_topic(t))]
        consumer.assign(parts)
        consumer.seek_to_end(*parts)
        consumer.commit({tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in parts})
    finally:
        consumer.close()


@pytest.fixture
def cluster(slurm_cluster):
    """The module's Slurm cluster, every node back in service after the test."""
    yield slurm_cluster
    if slurm_cluster.controller.poll() is not None:
        slurm_cluster.start_controller()
    for node in slurm_cluster.nodes:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=slurm_cluster.env,
                       capture_output=True, timeout=30)


@pytest.fixture
def group(kafka_bootstrap, group_id):
    start_at_end(kafka_bootstrap, group_id)
    return group_id


def test_an_alert_storm_across_a_kill_and_a_restart_never_drains_past_the_breaker(
        kafka_bootstrap, group, cluster, tmp_path):
    audit = tmp_path / "audit.sqlite"
    first = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    alert(kafka_bootstrap, "node1", "node2")
    wait_for(lambda: rows(audit, "status='tripped'") and rows(audit, "action='drain' AND status='succeeded'"),
             60, "one drain and the breaker tripping", first)
    out = drained(cluster)
    assert len(out) == BREAKER_LIMIT
    first.kill()

    second = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    status = second.status()
    assert status["breaker"]["open"] and status["nodes"]["drained"] == out  # the state after == before
    assert status["cold_start"]["nodes"]["drained"] == 1
    alert(kafka_bootstrap, "node1", "node2", "node3")  # the storm goes on
    wait_for(lambda: rows(audit, "node='node3' AND status='blocked'"), 30, "node3's drain held back", second)
    time.sleep(2)
    assert drained(cluster) == out  # nothing more drained across the restart
    assert all("circuit breaker open" in r[4] for r in rows(audit, "status='blocked'"))

    reset = [sys.executable, "-m", "foreshock", "mitigate", "--kafka", kafka_bootstrap, "--reset-breaker"]
    subprocess.run(reset, check=True, capture_output=True, timeout=60)
    wait_for(lambda: not second.status()["breaker"]["open"], 30, "the operator's reset", second)
    assert [r[:2] for r in rows(audit, "action='breaker'")] == [("breaker", "tripped"), ("breaker", "reset")]

    bus = KafkaBus(kafka_bootstrap)  # the node drained before the restart is repaired
    publish(bus, [NodeEvent(node=out[0], ts=now_ms(), event="repaired")])
    bus.flush()
    bus.close()
    wait_for(lambda: out[0] not in drained(cluster), 30, f"{out[0]} back in service", second)
    assert rows(audit, f"node='{out[0]}' AND action='undrain' AND status='succeeded'")
    second.stop()


def test_a_drain_during_a_controller_outage_is_retried_when_it_is_back_and_the_loop_goes_on(
        kafka_bootstrap, group, cluster, tmp_path):
    audit = tmp_path / "audit.sqlite"
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    letters = TopicReader(kafka_bootstrap, Topic.DEADLETTER)
    mark = letters.mark()
    cluster.stop_controller()
    alert(kafka_bootstrap, "node2")
    wait_for(lambda: rows(audit, "action='drain' AND status='failed'"), 30, "a failed attempt", mitigator)
    sent = time.monotonic()
    alert(kafka_bootstrap, "node3", ts=now_ms() + 3_600_000, records=1)  # an hour ahead
    alert(kafka_bootstrap, "node3", ts=now_ms() - 5 * 3_600_000, records=1)  # five hours old
    wait_for(lambda: len(rows(audit, "status='rejected'")) == 2, 20, "both rejections", mitigator)
    assert time.monotonic() - sent < 10  # the loop was not held by the drain waiting for slurmctld
    reasons = " | ".join(r[4] for r in rows(audit, "status='rejected'"))
    assert "after its receipt" in reasons and "old at receipt" in reasons
    assert mitigator.status()["in_flight"][0]["node"] == "node2"
    time.sleep(6)
    cluster.start_controller()
    wait_for(lambda: drained(cluster) == ["node2"], 90, "the drain once slurmctld is back", mitigator)
    # Slurm shows the drain before the mitigator has written that it succeeded
    wait_for(lambda: rows(audit, "action='drain'")[-1][1] == "succeeded", 30, "its outcome", mitigator)
    trail = rows(audit, "action='drain'")
    assert len({r[3] for r in trail}) == 1  # one action, driven to its end
    assert [r[1] for r in trail][-2:] == ["started", "succeeded"]
    assert all("will retry" in r[4] for r in trail if r[1] == "failed")
    dead = [d for d in letters.since(mark) if d.topic == Topic.RISK]
    assert len(dead) == 2 and {d.key for d in dead} == {"node3"}
    assert drained(cluster) == ["node2"]  # node3 was never acted on
    mitigator.stop()


def test_an_unknown_node_is_recorded_once_and_never_retried(kafka_bootstrap, group, cluster, tmp_path):
    audit = tmp_path / "audit.sqlite"
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    alert(kafka_bootstrap, "node99")
    wait_for(lambda: rows(audit, "node='node99' AND status='failed'"), 30, "node99's failure", mitigator)
    alert(kafka_bootstrap, "node99")
    time.sleep(5)
    failed = rows(audit, "node='node99' AND status='failed'")
    assert len(failed) == 1 and failed[0][4].startswith("permanent: ") and "Invalid node name" in failed[0][4]
    assert len(rows(audit, "node='node99' AND status='started'")) == 1
    assert mitigator.status()["unmanageable"] == ["node99"]
    assert drained(cluster) == []
    mitigator.stop()


def test_kill_9_while_a_job_leaves_then_a_restart_resumes_the_same_action(kafka_bootstrap, group, cluster,
                                                                         tmp_path):
    audit, control = tmp_path / "audit.sqlite", tmp_path / "control"
    write_job_status(control, JobView("llm", ("node2", "node3"), 8, now_ms() - 3 * 3_600_000, 30.0))
    extra = ("--control-dir", str(control), "--spare", "node1")
    first = Mitigator(kafka_bootstrap, group, audit, cluster, *extra).start()
    alert(kafka_bootstrap, "node2")
    commands = control / "llm" / "commands"
    wait_for(lambda: commands.exists() and list(commands.iterdir()), 30, "the leave command", first)
    first.kill()  # while it waits for the job's ack
    [path] = list(commands.iterdir())
    migrate_id = json.loads(path.read_text())["action_id"]

    second = Mitigator(kafka_bootstrap, group, audit, cluster, *extra).start()
    resumed = second.status()["cold_start"]["resumed"]
    assert resumed[0] == migrate_id and resumed[1].startswith("drain:node2:llm:")  # in their order
    assert rows(audit, f"action_id='{migrate_id}' AND status='abandoned'")
    FileChannel(control).ack(Command(**json.loads(path.read_text())), "snapshot durable at step 7")
    wait_for(lambda: drained(cluster) == ["node2"], 60, "the drain after the resumed migration", second)
    wait_for(lambda: rows(audit, "action='drain' AND status='succeeded'"), 30, "its outcome recorded", second)
    trail = [r[1] for r in rows(audit, f"action_id='{migrate_id}'")]
    assert trail[-3:] == ["abandoned", "started", "succeeded"]
    assert len(list(commands.iterdir())) == 1  # the job was told to leave once, under one id
    assert len(rows(audit, "action='drain' AND status='succeeded'")) == BREAKER_LIMIT
    second.stop()


SHM_BYTES = 32768  # SQLite's WAL index, written at open: a smaller limit refuses the start itself


def _wal_size_after(audit: Path, scratch: Path, commits: int) -> int:
    """The WAL's size once a start's probe and ``commits`` more rows are committed, on a copy of the log."""
    scratch.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{audit}{suffix}").exists():
            shutil.copy(f"{audit}{suffix}", scratch / f"audit.sqlite{suffix}")
    log = AuditLog(scratch / "audit.sqlite")
    log.probe()  # a start makes sure the log takes writes
    for status in ("planned", "started")[:commits]:
        log.record(MitigationEvent(ts=now_ms(), node="node3", action_id="drain:node3:-:1", action="drain",
                                   status=status, reason="foreshock: p=0.95, idle node on alert"))
    size = (scratch / "audit.sqlite-wal").stat().st_size
    log.close()
    return size


def test_an_audit_log_that_cannot_grow_pauses_the_mitigator_before_and_after_acting(
        kafka_bootstrap, group, cluster, tmp_path):
    audit = tmp_path / "audit.sqlite"
    Mitigator(kafka_bootstrap, group, audit, cluster).start().kill()  # the log and its WAL exist
    full_limit = max(SHM_BYTES, _wal_size_after(audit, tmp_path / "scratch0", commits=0))
    assert full_limit < _wal_size_after(audit, tmp_path / "scratch1", commits=1)  # not one more row fits

    full = Mitigator(kafka_bootstrap, group, audit, cluster).start(file_limit=full_limit)
    alert(kafka_bootstrap, "node3")
    code, body = wait_for(lambda: (r := full.readyz())[0] == 503 and r, 30, "not ready", full)
    assert "cannot write the audit log" in body["reason"]
    time.sleep(3)
    assert full.proc.poll() is None and drained(cluster) == []  # up, and no action without its record
    assert full.log().count("paused, acting on nothing") == 1 and "Traceback" not in full.log()
    full.kill()

    limit = _wal_size_after(audit, tmp_path / "scratch2", commits=2)  # room for planned + started only
    after = Mitigator(kafka_bootstrap, group, audit, cluster).start(file_limit=limit)
    wait_for(lambda: after.readyz()[0] == 503, 30, "not ready after the drain", after)
    assert drained(cluster) == ["node3"]  # the drain happened; its outcome could not be written
    assert [r[1] for r in rows(audit, "action='drain'")] == ["planned", "started"]
    after.kill()

    healed = Mitigator(kafka_bootstrap, group, audit, cluster).start()  # room again
    wait_for(lambda: rows(audit, "action='drain' AND status='succeeded'"), 30, "the outcome recorded", healed)
    assert [r[1] for r in rows(audit, "action='drain'")] == ["planned", "started", "abandoned", "started",
                                                             "succeeded"]
    assert healed.readyz()[0] == 200 and drained(cluster) == ["node3"]
    healed.stop()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not on PATH (scripts/install-services.sh)")
def test_a_tombstone_on_risk_scores_stops_nothing_and_the_drain_goes_through_slurm(
        kafka_bootstrap, group, cluster, tmp_path):
    audit = tmp_path / "audit.sqlite"
    letters = TopicReader(kafka_bootstrap, Topic.DEADLETTER)
    mark = letters.mark()
    kcat_produce(kafka_bootstrap, Topic.RISK, [b"node2:"])  # in front of node2's scores, same partition
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    alert(kafka_bootstrap, "node2")
    wait_for(lambda: drained(cluster) == ["node2"], 60, "node2 drained behind the tombstone", mitigator)
    alert(kafka_bootstrap, "node1", "node3")  # the storm goes on: the breaker allows one drain an hour
    wait_for(lambda: len(rows(audit, "status='blocked'")) == 2, 30, "the other drains held back", mitigator)
    assert drained(cluster) == ["node2"]
    trail = [r[1] for r in rows(audit, "action='drain' AND node='node2'")]
    assert trail == ["planned", "started", "succeeded"]
    assert all("circuit breaker open" in r[4] for r in rows(audit, "status='blocked'"))
    dead = wait_for(lambda: [d for d in letters.since(mark) if d.topic == Topic.RISK], 30, "the dead letter")
    assert {(d.key, d.value, d.reason) for d in dead} == {("node2", None, TOMBSTONE_REASON)}  # at least once
    mitigator.stop()
    committed, end = committed_and_end(kafka_bootstrap, group, Topic.RISK)
    assert committed == end  # past the tombstone: a restart does not meet it again


@pytest.fixture
def audit_fs(tmp_path):
    """A tmpfs of its own for the audit log, which the test remounts read-only and back (root only)."""
    mnt = tmp_path / "audit-fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True,
                      timeout=30).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True, timeout=30)


@pytest.mark.parametrize("where", ["a folder that does not exist", "read-only storage"])
def test_an_audit_log_that_cannot_be_opened_is_one_line_and_exit_1(kafka_bootstrap, group, cluster, tmp_path,
                                                                  where, request):
    if where == "read-only storage":
        mnt = request.getfixturevalue("audit_fs")
        remount(mnt, "ro")  # an empty file system: SQLite can create neither the log nor its WAL
        audit = mnt / "audit.sqlite"
    else:
        audit = tmp_path / "no-such-folder" / "audit.sqlite"
    proc = subprocess.run(Mitigator(kafka_bootstrap, group, audit, cluster).args, env=cluster.env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == f"{UNOPENABLE.format(audit)}\n"
    assert drained(cluster) == [] and not audit.exists()


def test_an_audit_log_on_read_only_storage_before_acting_starts_paused_and_acts_once_writable(
        kafka_bootstrap, group, cluster, audit_fs):
    audit = audit_fs / "audit.sqlite"
    Mitigator(kafka_bootstrap, group, audit, cluster).start().kill()  # a log whose WAL is left behind
    remount(audit_fs, "ro")  # so it opens, read-only
    mitigator = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    code, body = mitigator.readyz()
    assert code == 503 and "attempt to write a readonly database" in body["reason"]  # at once
    alert(kafka_bootstrap, "node3")
    time.sleep(4)
    assert mitigator.proc.poll() is None and drained(cluster) == [] and rows(audit) == []

    remount(audit_fs, "rw")
    wait_for(lambda: drained(cluster) == ["node3"], 60, "the drain once the log takes writes", mitigator)
    # Slurm shows the drain before the mitigator has written that it succeeded
    wait_for(lambda: [r[1] for r in rows(audit, "action='drain'")] == ["planned", "started", "succeeded"], 30,
             "the drain's audit rows", mitigator)
    alert(kafka_bootstrap, "node1")
    wait_for(lambda: rows(audit, "node='node1' AND status='blocked'"), 30, "node1 held back", mitigator)
    assert drained(cluster) == ["node3"] and mitigator.readyz()[0] == 200
    assert mitigator.log().count("paused, acting on nothing") == 1 and "Traceback" not in mitigator.log()
    mitigator.stop()


def test_an_audit_log_on_read_only_storage_after_a_crash_mid_action_starts_paused_and_resumes(
        kafka_bootstrap, group, cluster, audit_fs):
    audit = audit_fs / "audit.sqlite"
    first = Mitigator(kafka_bootstrap, group, audit, cluster).start()
    cluster.stop_controller()
    alert(kafka_bootstrap, "node3")
    wait_for(lambda: rows(audit, "action='drain' AND status='failed'"), 30, "a failed attempt", first)
    first.kill()  # the drain is open; SQLite's WAL is left behind, so the log opens read-only
    cluster.start_controller()
    remount(audit_fs, "ro")

    second = Mitigator(kafka_bootstrap, group, audit, cluster).start()  # up, not crash-looping
    code, body = wait_for(lambda: (r := second.readyz())[0] == 503 and r, 30, "not ready", second)
    assert "attempt to write a readonly database" in body["reason"]
    assert second.status()["cold_start"] is None  # read, but not taken in: its rows are not written
    alert(kafka_bootstrap, "node1")  # read once the log can be written
    time.sleep(4)
    assert second.proc.poll() is None and drained(cluster) == []  # no action without its record

    remount(audit_fs, "rw")
    wait_for(lambda: second.readyz()[0] == 200, 30, "ready once the log takes writes", second)
    wait_for(lambda: drained(cluster) == ["node3"], 60, "the resumed drain", second)
    wait_for(lambda: rows(audit, "node='node1' AND status='blocked'"), 30, "node1 held back", second)
    wait_for(lambda: rows(audit, "action='drain' AND node='node3'")[-1][1] == "succeeded", 30,
             "the resumed drain's outcome", second)
    trail = [r[1] for r in rows(audit, "action='drain' AND node='node3'")]
    assert trail[:2] == ["planned", "started"] and trail[-3:] == ["abandoned", "started", "succeeded"]
    assert drained(cluster) == ["node3"]  # the breaker's one drain, restart or not
    assert second.log().count("paused, acting on nothing") == 1 and "Traceback" not in second.log()
    second.stop()
