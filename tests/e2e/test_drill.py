"""End-to-end fire drill with real torchrun elastic (CPU, gloo, one agent per node on this machine).

Every fault of the tiered state ends with the job training again from the newest valid state, bit
for bit as an uninterrupted run: a warned migration (no step lost, B's state from its buddy's
memory), a node killed without warning (from memory and the buddy's copy), both members of a buddy
pair killed (durable tier), a corrupted replica (caught by its CRC, durable tier), and a node
killed while a durable snapshot is being written (never marked complete; memory tier).

The warned and unwarned scenarios also run on real parts: risk scores and the audit over a real Kafka
broker, the warned node drained through a real Slurm (munged, slurmctld, slurmd) and through the
Kubernetes stand-in API server (tests/fixtures/kube.py, driven by the official client), each with a
small state so that the run stays within a few minutes on two cores.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from foreshock.ingest.contract import Topic
from tests.integration.test_predictor_kafka import TopicReader

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DURABLE_EVERY = 10
MEMORY_EVERY = 1


@pytest.fixture(scope="module")
def drill_run(tmp_path_factory) -> tuple[dict, Path, set[Path]]:
    """The drill's figures, its work folder, and the folders it left in the temporary folder."""
    work = tmp_path_factory.mktemp("drill")
    before = set(Path(tempfile.gettempdir()).glob("torchelastic_*"))
    proc = subprocess.run(
        [sys.executable, "-m", "foreshock", "drill", "--json", "--state-mb", "32",
         "--memory-every", str(MEMORY_EVERY), "--durable-every", str(DURABLE_EVERY), "--workdir", str(work)],
        capture_output=True, text=True, timeout=880,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for s in result["scenarios"]:
        print(f"\n{s['name']}: {s['steps_lost']} steps lost, {s['recovery_seconds']} s from "
              f"{s['restore_source']}, {s['components_seconds']}")
    print(f"stall p50 {result['stall_ms_p50']} ms, p99 {result['stall_ms_p99']} ms; "
          f"{result['bandwidth_gb_per_s']}")
    return result, work, set(Path(tempfile.gettempdir()).glob("torchelastic_*")) - before


@pytest.fixture(scope="module")
def drill(drill_run) -> dict:
    return drill_run[0]


def test_torchruns_logs_stay_in_the_drills_folder_and_nothing_is_left_in_tmp(drill_run):
    _, work, left = drill_run
    assert not left
    assert list((work / "warned" / "logs" / "torchelastic").rglob("attempt_*"))


def _scenario(result: dict, name: str) -> dict:
    return next(s for s in result["scenarios"] if s["name"] == name)


def test_the_drill_reports_every_scenario_with_its_keys(drill):
    assert set(drill) >= {"warned_steps_lost", "unwarned_steps_lost", "warned_seconds_lost",
                          "unwarned_seconds_lost", "alert_to_snapshot_seconds", "stall_ms_p50",
                          "stall_ms_p99"}
    assert [s["name"] for s in drill["scenarios"]] == ["warned", "unwarned", "pair_lost", "corrupt_replica",
                                                       "during_snapshot"]
    for s in drill["scenarios"]:
        assert {"name", "steps_lost", "recovery_seconds", "restore_source"} <= set(s)
        parts = s["components_seconds"]
        assert abs(sum(parts.values()) - s["recovery_seconds"]) < 0.01 and min(parts.values()) >= 0
        assert s["bit_exact"] and s["compared_steps"] >= 2, s  # every rank, at least at the resumed step
    assert 0 < drill["stall_ms_p50"] <= drill["stall_ms_p99"]


def test_a_warned_node_hands_its_state_to_the_spare_through_memory_and_loses_nothing(drill):
    w = _scenario(drill, "warned")
    assert w["resumed_nodes"] == ["A", "C"]  # the spare took B's place
    assert w["restore_source"] == "peer" and w["steps_lost"] == 0 and drill["warned_steps_lost"] == 0
    assert 0 < drill["alert_to_snapshot_seconds"] < 30


def test_a_node_lost_without_warning_comes_back_from_its_buddy_within_a_snapshot_or_two(drill):
    u = _scenario(drill, "unwarned")
    assert u["restore_source"] == "peer" and u["resumed_nodes"] == ["A", "C"]
    assert u["resumed_from"] > DURABLE_EVERY  # newer than any durable snapshot
    # a snapshot every step; B's copy on A can lag one replication round behind A's own
    assert 0 <= u["steps_lost"] <= 2 * MEMORY_EVERY + 1, u


def test_a_lost_buddy_pair_and_a_corrupt_replica_fall_back_to_the_durable_tier(drill):
    for name in ("pair_lost", "corrupt_replica"):
        s = _scenario(drill, name)
        assert s["restore_source"] == "durable", s
        assert s["resumed_from"] % DURABLE_EVERY == 0 and s["resumed_from"] > 0
    assert _scenario(drill, "pair_lost")["resumed_nodes"] == ["C", "D"]
    assert _scenario(drill, "corrupt_replica")["extra"]["corrupted_step"] > DURABLE_EVERY


def test_a_node_lost_while_a_snapshot_is_written_never_marks_it_complete(drill):
    s = _scenario(drill, "during_snapshot")
    assert s["extra"]["snapshot_finished_before_failure"] is False  # the kill did land mid-write
    assert s["unfinished_snapshot_marked"] is False
    assert s["restore_source"] in ("memory", "peer")
    # from memory, newer than the last complete durable snapshot (the kill may land before this
    # step's memory copy is replicated, and then the job resumes a step or two earlier)
    assert s["resumed_from"] > DURABLE_EVERY and s["steps_lost"] <= 2 * MEMORY_EVERY + 1, s


def run_drill_on(work: Path, env: dict[str, str], *args: str) -> dict:
    cmd = [sys.executable, "-m", "foreshock", "drill", "--json", "--state-mb", "8", "--workdir", str(work),
           *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def drains_planned(audit: Path) -> int:
    db = sqlite3.connect(f"file:{audit}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM mitigation_events WHERE action='drain' AND status='planned'"
                          ).fetchone()[0]
    finally:
        db.close()


@pytest.mark.integration
def test_the_drill_runs_through_a_real_broker_and_a_real_slurm(kafka_bootstrap, slurm_cluster, tmp_path):
    events = TopicReader(kafka_bootstrap, Topic.MITIGATION)
    mark = events.mark()
    result = run_drill_on(tmp_path, slurm_cluster.env, "--bus", "kafka", "--kafka", kafka_bootstrap,
                          "--scheduler", "slurm", "--nodes", "node1,node2,node3",
                          "--scenarios", "warned,unwarned")
    assert (result["bus"], result["scheduler"]) == ("kafka", "slurm")
    warned, unwarned = _scenario(result, "warned"), _scenario(result, "unwarned")
    assert warned["resumed_nodes"] == ["node1", "node3"] and warned["restore_source"] == "peer"
    assert warned["steps_lost"] == 0 and warned["bit_exact"]
    m = warned["extra"]["mitigation"]
    assert m["actions"] == [["migrate", "node2", "succeeded"], ["drain", "node2", "succeeded"]]
    assert m["drained"] == ["node2"] and m["returned"] is True  # sinfo showed it drained, then back
    assert m["records"] >= 3  # the rising risk came over the broker
    audit = [e for e in events.since(mark) if e.node == "node2"]  # the audit's copy on the broker
    assert {(e.action, e.status) for e in audit} >= {("drain", "succeeded"), ("undrain", "succeeded")}
    assert drains_planned(tmp_path / "warned" / "audit.sqlite") == 1  # the breaker's limit: one
    u = unwarned["extra"]["mitigation"]
    assert unwarned["restore_source"] == "peer" and unwarned["resumed_nodes"] == ["node1", "node3"]
    assert u["actions"] == [] and u["drained"] == [] and u["records"] >= 1  # no warning: nothing done
    assert all(state == "idle" for state in slurm_cluster.states().values())  # left as it was found


@pytest.mark.integration
def test_the_drill_drains_through_the_kubernetes_stand_in(kafka_bootstrap, api_server, tmp_path):
    gpu3 = copy.deepcopy(api_server.nodes["gpu-2"])
    gpu3["metadata"]["name"] = "gpu-3"
    api_server.nodes["gpu-3"] = gpu3  # the spare
    kubeconfig = tmp_path / "kubeconfig.json"
    server = f"http://127.0.0.1:{api_server.server_address[1]}"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "drill", "user": {}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "drill"}}],
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    result = run_drill_on(tmp_path / "work", {**env, "KUBECONFIG": str(kubeconfig)}, "--bus", "kafka",
                          "--kafka", kafka_bootstrap, "--scheduler", "kubernetes",
                          "--nodes", "gpu-1,gpu-2,gpu-3", "--kube-selector", "foreshock.io/job=llm",
                          "--scenarios", "warned")
    warned = _scenario(result, "warned")
    assert warned["steps_lost"] == 0 and warned["resumed_nodes"] == ["gpu-1", "gpu-3"]
    m = warned["extra"]["mitigation"]
    assert m["actions"][-1] == ["drain", "gpu-2", "succeeded"] and m["drained"] == ["gpu-2"]
    assert m["returned"] is True
    assert ("POST", "/api/v1/namespaces/train/pods/llm-1/eviction") in {r[:2] for r in api_server.requests}
    node = api_server.nodes["gpu-2"]  # cordoned, tainted and evicted, then returned on 'repaired'
    assert not node["spec"]["unschedulable"] and "foreshock.io/failure-risk" not in {
        t["key"] for t in node["spec"]["taints"]}
    assert [n for n, v in api_server.nodes.items() if v["spec"].get("unschedulable")] == []
