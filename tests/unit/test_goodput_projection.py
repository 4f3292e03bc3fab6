"""Projecting a drill file to a cluster: restore and stall times scale with the state, fixed parts do not,
each path is bounded by the slower of the drill and the cited hardware."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foreshock.models.goodput import SOURCES, DrillReport, JobParams, project

SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "drill" / "sample.json"


@pytest.fixture
def drill() -> DrillReport:
    return DrillReport.from_json(SAMPLE)


def test_restore_and_stall_times_scale_with_the_state_size(drill):
    raw = json.loads(SAMPLE.read_text())
    small, large = project(drill, 0.4, 16384), project(drill, 1.2, 16384)
    for path, t in small.paths.items():
        assert large.paths[path].seconds == pytest.approx(3 * t.seconds)
        assert t.seconds == pytest.approx(0.4 / min(raw["bandwidth_gb_per_s"][path], t.cited.value))
    scenarios = {s["name"]: s for s in raw["scenarios"]}
    cases = (("peer", "unwarned", "peer_restore"), ("durable", "pair_lost", "durable_restore"),
             ("migration", "warned", "peer_restore"))
    for kind, name, path in cases:
        parts = scenarios[name]["components_seconds"]
        fixed = sum(parts[c] for c in ("detection", "rendezvous", "worker_start", "first_step"))
        for proj, gb in ((small, 0.4), (large, 1.2)):
            r = proj.recoveries[kind]
            assert r.fixed_s == pytest.approx(fixed)  # the drill's restore is replaced by bytes / bandwidth
            assert r.seconds == pytest.approx(fixed + gb / min(raw["bandwidth_gb_per_s"][path],
                                                                SOURCES[r.restore.cited.key].value) + 30.0)
        assert large.recoveries[kind].seconds - small.recoveries[kind].seconds == pytest.approx(
            2 * small.recoveries[kind].restore.seconds)


def test_each_path_is_bounded_by_the_slower_of_drill_and_hardware(drill):
    p = project(drill, 0.4, 16384)
    # This machine's loopback and memcpy are slower than a GPU node's NIC and PCIe; the shared storage of a
    # 16k-GPU cluster, per GPU, is slower than this machine's local disk.
    assert {k: t.bound for k, t in p.paths.items()} == {
        "memory_copy": "measured", "peer_replication": "measured", "peer_restore": "measured",
        "durable_write": "cited", "durable_restore": "cited"}
    fast = DrillReport(drill.state_mb, dict(drill.bandwidth_gb_s, peer_restore=500.0), drill.scenarios)
    restore = project(fast, 0.4, 16384).paths["peer_restore"]
    assert restore.bound == "cited" and restore.seconds == pytest.approx(0.4 / SOURCES["nic_per_gpu"].value)


def test_communicator_initialisation_is_the_cited_figure_for_the_size(drill):
    assert project(drill, 0.4, 1024).recoveries["peer"].reinit is SOURCES["reinit_2048"]
    assert project(drill, 0.4, 2048).recoveries["peer"].reinit.value == 5.0
    assert project(drill, 0.4, 4096).recoveries["peer"].reinit is SOURCES["reinit_10000"]
    big = project(drill, 0.4, 16384)
    assert {s.key for s in big.sources()} == {"gpu_to_host", "nic_per_gpu", "storage_per_gpu", "reinit_10000"}
    assert all(s.url.startswith("https://") and s.reference for s in big.sources())


def test_job_parameters_of_the_projection(drill):
    p = project(drill, 0.4, 16384)
    params = p.job_params(JobParams(spares=3))
    assert params.spares == 3 and params.migration_s == pytest.approx(p.recoveries["migration"].seconds)
    tiers = params.tiers
    assert tiers is not None and tiers.pair_loss_probability is None  # the trace gives it
    assert (tiers.snapshot_s, tiers.replicate_s, tiers.durable_s) == (
        p.paths["memory_copy"].seconds, p.paths["peer_replication"].seconds, p.paths["durable_write"].seconds)
    assert params.save_s == tiers.snapshot_s and params.rejoin_s == tiers.peer_recovery_s


def test_drill_file_is_validated(tmp_path):
    raw = json.loads(SAMPLE.read_text())
    broken = dict(raw, scenarios=[s for s in raw["scenarios"] if s["name"] != "pair_lost"])
    with pytest.raises(ValueError, match="pair_lost"):
        DrillReport.from_json(broken)
    with pytest.raises(ValueError, match="durable_write"):
        DrillReport.from_json(dict(raw, bandwidth_gb_per_s=dict(raw["bandwidth_gb_per_s"], durable_write=0)))
    path = tmp_path / "drill.json"
    path.write_text(json.dumps(raw))
    assert DrillReport.from_json(path).origin == str(path)
