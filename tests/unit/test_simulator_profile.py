"""Profiles: strict validation, documented defaults, and calibration to the published data."""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

import pytest

from foreshock.commands.simulate import profile_path
from foreshock.ingest.simulator import ProfileError, Simulator, load_profile, parse_profile
from foreshock.ingest.simulator.calibration import summarize_trace
from foreshock.shipped import profile_names

DATA = Path(__file__).parents[1] / "data" / "simulator"

MINIMAL = """
[cluster]
gpus_per_node = 8
interruptions_per_gpu_day = 0.000474
[[failure]]
cause = "gpu_hbm"
share = 0.6
xid = [48, 94, 95, 63, 64]
precursor = "ecc"
lead_minutes = [30, 360]
detectable = 0.8
[[failure]]
cause = "software"
share = 0.4
xid = []
precursor = "none"
lead_minutes = [0, 0]
detectable = 0.0
[noise]
benign_xid_per_gpu_day = 0.01
"""


def minimal() -> dict:
    return tomllib.loads(MINIMAL)


def test_minimal_profile_gets_documented_defaults_and_runs():
    p = parse_profile(minimal(), "mini")
    assert p.cluster.rate_multiplier == 1.0
    assert p.cluster.ib_ports_per_node == 8
    assert p.failures[0].scope == "gpu"
    assert p.failures[0].repair_median_hours == p.cluster.repair_median_hours == 4.0
    assert p.noise.benign_xids == (13, 31, 43) and p.noise.missing_scrape_fraction == 0.0
    sim = Simulator(p, nodes=2, duration_ms=600_000, interval_ms=30_000, seed=1)
    chunks = list(sim.chunks())
    assert sum(c.gpu.num_rows for c in chunks) == 2 * 8 * 20


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda d: d["cluster"].pop("gpus_per_node"), "cluster.gpus_per_node"),
        (lambda d: d["cluster"].pop("interruptions_per_gpu_day"), "cluster.interruptions_per_gpu_day"),
        (lambda d: d["failure"][1].pop("share"), "failure[1].share"),
        (lambda d: d["failure"][0].pop("lead_minutes"), "failure[0].lead_minutes"),
        (lambda d: d["noise"].pop("benign_xid_per_gpu_day"), "noise.benign_xid_per_gpu_day"),
        (lambda d: d.pop("noise"), "noise"),
        (lambda d: d["failure"][0].update(share=0.5), "failure.share"),
        (lambda d: d["failure"][1].update(detectable=0.3), "failure[1].detectable"),
        (lambda d: d["failure"][0].update(precursor="vibes"), "failure[0].precursor"),
        (lambda d: d["failure"][0].update(lead_minutes=[360, 30]), "failure[0].lead_minutes"),
        (lambda d: d["failure"][0].update(detectable=1.5), "failure[0].detectable"),
        (lambda d: d["failure"][0].update(xid=["48"]), "failure[0].xid"),
        (lambda d: d["failure"][1].update(cause="gpu_hbm"), "failure.cause"),
        (lambda d: d["failure"][0].update(scope="rack"), "failure[0].scope"),
        (lambda d: d["cluster"].update(gpus_per_node=0), "cluster.gpus_per_node"),
        (lambda d: d["cluster"].update(gpu_per_node=8), "cluster.gpu_per_node"),
        (lambda d: d["noise"].update(benign_xid_rate=0.1), "noise.benign_xid_rate"),
    ],
)
def test_missing_or_inconsistent_key_is_refused_by_name(edit, named):
    data = minimal()
    edit(data)
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "bad")
    assert str(err.value).startswith(named + ":") or f" {named}:" in str(err.value)


def test_profile_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text(MINIMAL.replace("gpus_per_node = 8", "gpus_per_node = 'eight'"))
    with pytest.raises(ProfileError, match=r"broken\.toml: cluster\.gpus_per_node"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="no profile named 'nope'"):
        profile_path("nope")


def test_shipped_profiles_load_by_name():
    names = profile_names()
    assert {"llama3", "infinitehbd"} <= set(names)
    for name in names:
        profile = load_profile(profile_path(name))
        assert abs(sum(f.share for f in profile.failures) - 1) < 1e-3


def test_llama3_is_the_published_interruption_table():
    rows = list(csv.DictReader((DATA / "failure_mix_llama3.csv").open()))
    total = sum(int(r["count"]) for r in rows)
    profile = load_profile(profile_path("llama3"))
    shares = {f.cause: f.share for f in profile.failures}
    assert set(shares) == {r["cause"] for r in rows}
    for r in rows:
        assert shares[r["cause"]] == pytest.approx(int(r["count"]) / total, abs=1e-5)
    assert profile.cluster.interruptions_per_gpu_day == pytest.approx(total / (54 * 16_384), rel=1e-3)


def test_infinitehbd_is_calibrated_to_the_real_trace():
    summary = summarize_trace(json.loads((DATA / "fault_trace.json").read_text()))
    assert summary.faults == 584
    profile = load_profile(profile_path("infinitehbd"))
    assert profile.cluster.interruptions_per_gpu_day == pytest.approx(
        summary.interruptions_per_gpu_day, rel=1e-4
    )
    shipped = {f.cause: f for f in profile.failures}
    assert set(shipped) == {c.cause for c in summary.causes}
    for fit in summary.causes:
        f = shipped[fit.cause]
        assert f.share == pytest.approx(fit.share, abs=1e-5)
        assert f.repair_median_hours == pytest.approx(fit.repair_median_hours, abs=0.01)
        assert f.repair_sigma == pytest.approx(fit.repair_sigma, abs=0.01)
