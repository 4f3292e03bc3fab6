"""``foreshock collect`` as a real process publishing to a real Kafka broker; SIGTERM flushes, exits 0."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from foreshock.ingest.contract import NodeEvent, Topic, XidEvent
from foreshock.ingest.kafka_bus import KafkaBus
from foreshock.ingest.stream import RecordStream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DATA = Path(__file__).parents[1] / "data" / "collectors"


@contextmanager
def _collecting(bootstrap: str, group_id: str, topic: str, *args: str,
                env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, RecordStream]]:
    """``foreshock collect ARGS --kafka BOOTSTRAP`` as a process, and a consumer of ``topic``."""
    proc = subprocess.Popen([sys.executable, "-m", "foreshock", "collect", *args, "--kafka", bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    bus = KafkaBus(bootstrap)
    stream = RecordStream(bus, bus.consumer(group_id, [topic]))
    try:
        yield proc, stream
    finally:
        if proc.poll() is None:
            proc.kill()
        stream.close()
        bus.close()


def _read_until(stream: RecordStream, node: str, done: Callable[[list], bool], timeout_s: float,
                seen: list) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done(seen):
        for decoded in stream.poll(timeout_s=0.5):
            seen.extend(r for r in decoded.records if r.node == node)
    return seen


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err.decode(errors="replace")


def test_kmsg_replay_folds_a_flood_and_sigterm_flushes_the_held_counts(kafka_bootstrap, group_id, tmp_path):
    real = (DATA / "xid" / "xid_lines.txt").read_text().splitlines()
    fallen = real[43]  # "NVRM: Xid (PCI:0000:05:00): 79, ... GPU has fallen off the bus."
    log = tmp_path / "kern.log"
    log.write_text("\n".join(real[:5] + [fallen] * 1000) + "\n")
    node = f"kmsg-{group_id}"
    with _collecting(kafka_bootstrap, group_id, Topic.XID, "--source", "kmsg", "--path", str(log),
                     "--node", node, "--interval", "200ms", "--fold-window", "1h") as (proc, stream):
        seen: list[XidEvent] = []
        _read_until(stream, node, lambda s: len(s) >= 6, 90, seen)
        assert [e.xid for e in seen[:6]] == [13] * 5 + [79] and seen[5].count == 1
        assert proc.poll() is None  # still running, 999 repeats held back in the fold window
        rc, err = _stop(proc)
        assert rc == 0, err
        _read_until(stream, node, lambda s: sum(e.count for e in s if e.xid == 79) >= 1000, 60, seen)
        fallen_events = [e for e in seen if e.xid == 79]
        assert sum(e.count for e in fallen_events) == 1000 and len(fallen_events) == 2
        assert fallen_events[1].count == 999 and fallen_events[1].severity == "FATAL"
        assert stream.dead_letters == 0


def test_ib_collector_publishes_samples_with_deltas(kafka_bootstrap, group_id, tmp_path):
    tree = tmp_path / "infiniband"
    shutil.copytree(DATA / "ib" / "sys-class-infiniband", tree)
    node = f"ib-{group_id}"
    with _collecting(kafka_bootstrap, group_id, Topic.LINK, "--source", "ib", "--path", str(tree),
                     "--node", node, "--interval", "300ms") as (proc, stream):
        seen: list = []
        _read_until(stream, node, lambda s: len(s) >= 3, 90, seen)
        counter = tree / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error"
        counter.chmod(0o644)
        counter.write_text("12\n")
        bumped = lambda s: any((r.deltas or {}).get("symbol_error") == 12 for r in s)  # noqa: E731
        _read_until(stream, node, bumped, 60, seen)
        assert {r.port for r in seen} == {"mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1"}
        assert any(r.port == "mlx5_1/1" and r.deltas and r.deltas["symbol_error"] == 12 for r in seen)
        assert seen[0].link_downed is not None and seen[0].state == "ACTIVE"
        rc, err = _stop(proc)
        assert rc == 0, err


def test_slurm_node_states_reach_node_events(kafka_bootstrap, group_id, slurm_cluster, tmp_path):
    """A drain and a resume in a real slurmctld arrive on ``node.events`` from the collector process."""

    def scontrol(*args: str) -> None:
        subprocess.run(["scontrol", "update", "NodeName=node1", *args], env=slurm_cluster.env,
                       check=True, timeout=30, capture_output=True)

    state = tmp_path / "slurm-state.json"
    with _collecting(kafka_bootstrap, group_id, Topic.NODE_EVENTS, "--source", "slurm",
                     "--path", str(state), "--interval", "200ms", env=slurm_cluster.env) as (proc, stream):
        seen: list[NodeEvent] = []
        scontrol("State=DRAIN", "Reason=foreshock kafka test")
        _read_until(stream, "node1", lambda s: len(s) >= 1, 60, seen)
        scontrol("State=RESUME")
        _read_until(stream, "node1", lambda s: len(s) >= 2, 60, seen)
        assert [e.event for e in seen] == ["drained", "repaired"]
        assert seen[0].ts < seen[1].ts and seen[0].detail == "slurm: state drained"
        rc, err = _stop(proc)
        assert rc == 0, err
        assert '"node1": "up"' in state.read_text()
        assert stream.dead_letters == 0
