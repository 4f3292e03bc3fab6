"""Repeat failures in the simulator: the [refault] table, its calibration to the InfiniteHBD
trace, and the simulated repeat-failure curve against the real one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foreshock.ingest.simulator import ProfileError, load_profile, parse_profile
from foreshock.ingest.simulator.calibration import refault_curve
from foreshock.ingest.simulator.profile import read_profile_data
from foreshock.ingest.simulator.schedule import MS_PER_DAY, draw_schedule
from foreshock.models.fleet.records import spells
from foreshock.models.fleet.refault import calibrate_refault, failures_per_unit_day
from foreshock.models.fleet.repeat import repeat_failure_curve
from foreshock.models.fleet.sources import from_ground_truth, load_infinitehbd
from foreshock.shipped import profile as profile_path
from foreshock.shipped import trace

WINDOWS = [pd.Timedelta("1D"), pd.Timedelta("7D"), pd.Timedelta("30D")]
TOLERANCE = 0.03
"""Simulated against real P(refault within W): the real curve's 95 % band is about +-0.035 wide at
these W (582 repairs), and 2,000 simulated servers over the trace's 349 days vary by about +-0.012
from seed to seed."""


@pytest.fixture(scope="module")
def real_curve() -> pd.DataFrame:
    return repeat_failure_curve(load_infinitehbd(trace("infinitehbd")), WINDOWS).frame


def simulated(name: str, seed: int, nodes: int = 2000, days: int = 349) -> pd.DataFrame:
    """The fleet records of a run's schedule (its ground truth), one node = one server."""
    profile = load_profile(profile_path(name))
    end = days * MS_PER_DAY
    schedule = draw_schedule(profile, nodes, 0, end, seed=seed)
    truth = pd.DataFrame([(f"node{f.node}", f.ts, f.cause, f.repair_ts) for f in schedule.failures],
                         columns=["node", "ts", "cause", "repair_ts"])
    return from_ground_truth(truth, [f"node{i}" for i in range(nodes)], 0, end)


def test_simulated_repeat_failure_curve_matches_the_trace_at_1_7_and_30_days(real_curve) -> None:
    records = simulated("infinitehbd-refault", seed=1)
    sim = repeat_failure_curve(records, WINDOWS).frame
    for w, real_p, sim_p in zip(WINDOWS, real_curve["p_refault"], sim["p_refault"], strict=True):
        assert sim_p == pytest.approx(real_p, abs=TOLERANCE), w
    # refaults and lemons added, the cluster still fails as often as the trace
    assert failures_per_unit_day(records) == pytest.approx(
        failures_per_unit_day(load_infinitehbd(trace("infinitehbd"))), rel=0.1)
    assert sim["base_rate"].to_numpy() == pytest.approx(real_curve["base_rate"].to_numpy(), rel=0.2)


def test_without_refaults_the_simulator_misses_the_traces_repeat_failures(real_curve) -> None:
    sim = repeat_failure_curve(simulated("infinitehbd", seed=1), WINDOWS).frame
    assert sim["p_refault"].iloc[0] < 0.02 < real_curve["p_refault"].iloc[0] - 0.15
    assert (real_curve["p_refault"] - sim["p_refault"] > TOLERANCE).all()


def test_the_shipped_table_is_the_fit_to_the_trace_and_its_model_curve_matches() -> None:
    shipped = load_profile(profile_path("infinitehbd-refault"))
    base = load_profile(profile_path("infinitehbd"))
    fit = calibrate_refault(load_infinitehbd(trace("infinitehbd")), base)
    for key in ("failed_repair_probability", "failed_repair_median_hours", "failed_repair_sigma",
                "lemon_fraction", "lemon_rate_multiplier"):
        assert getattr(shipped.refault, key) == pytest.approx(getattr(fit, key), rel=2e-3), key
    model = refault_curve(shipped.refault, np.array([24.0, 168.0, 720.0]), base.node_failures_per_day(),
                          base.mean_repair_days(349.0))
    assert model == pytest.approx([0.224, 0.312, 0.432], abs=0.01)


def test_a_refault_profile_extends_its_base_and_changes_nothing_else() -> None:
    shipped = load_profile(profile_path("infinitehbd-refault"))
    base = load_profile(profile_path("infinitehbd"))
    assert base.refault is None and shipped.refault is not None
    assert (shipped.failures, shipped.cluster, shipped.noise) == (base.failures, base.cluster, base.noise)
    assert shipped.description != base.description


# draw_schedule(profile, 64, 0, 30 days, seed=7, rate_multiplier=20) before repeat failures existed
GOLDEN = {
    "llama3": (159, "3b78e2a4861a6e87d062dc325f1b023837bbb98e11e44175e750fb953e4ef7bd"),
    "infinitehbd": (138, "d6efe55150a9f45a9772c29113c1853104543b3b8aa148cf82ceea65121f1063"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_profile_without_refault_draws_the_schedule_it_always_did(name: str) -> None:
    schedule = draw_schedule(load_profile(profile_path(name)), 64, 0, 30 * MS_PER_DAY, seed=7,
                             rate_multiplier=20.0)
    digest = hashlib.sha256(repr((schedule.failures, schedule.episodes)).encode()).hexdigest()
    assert (len(schedule.failures), digest) == GOLDEN[name]


def test_refault_schedules_are_deterministic_and_repeat_the_cause() -> None:
    profile = load_profile(profile_path("infinitehbd-refault"))
    one = draw_schedule(profile, 200, 0, 60 * MS_PER_DAY, seed=5, rate_multiplier=5.0)
    two = draw_schedule(profile, 200, 0, 60 * MS_PER_DAY, seed=5, rate_multiplier=5.0)
    assert one == two
    assert one != draw_schedule(profile, 200, 0, 60 * MS_PER_DAY, seed=6, rate_multiplier=5.0)
    by_node: dict[int, list] = {}
    for f in one.failures:
        by_node.setdefault(f.node, []).append(f)
    quick = [(a, b) for fs in by_node.values() for a, b in zip(fs, fs[1:], strict=False)
             if b.ts - a.repair_ts < 3_600_000]
    assert quick and sum(a.cause == b.cause for a, b in quick) / len(quick) > 0.9
    for fs in by_node.values():  # a node is never failing while it is down
        assert all(b.ts >= a.repair_ts for a, b in zip(fs, fs[1:], strict=False))
    assert spells(from_ground_truth(
        pd.DataFrame([(f"node{f.node}", f.ts, f.cause, f.repair_ts) for f in one.failures],
                     columns=["node", "ts", "cause", "repair_ts"]),
        [f"node{i}" for i in range(200)], 0, 60 * MS_PER_DAY))["failed"].sum() == len(one.failures)


def test_refault_table_errors_name_the_key(tmp_path: Path) -> None:
    data = read_profile_data(profile_path("infinitehbd-refault"))
    bad = {**data, "refault": {**data["refault"], "lemon_rate_multiplier": 0.5}}
    with pytest.raises(ProfileError, match="refault.lemon_rate_multiplier: expected a number >= 1"):
        parse_profile(bad, "x")
    missing = {**data, "refault": {k: v for k, v in data["refault"].items() if k != "failed_repair_sigma"}}
    with pytest.raises(ProfileError, match="refault.failed_repair_sigma: missing required key"):
        parse_profile(missing, "x")
    typo = {**data, "refault": {**data["refault"], "lemons": 0.1}}
    with pytest.raises(ProfileError, match="refault.lemons: unknown key"):
        parse_profile(typo, "x")
    (tmp_path / "a.toml").write_text('extends = "b"\n')
    (tmp_path / "b.toml").write_text('extends = "c"\n')
    with pytest.raises(ProfileError, match="'b' extends another profile"):
        load_profile(tmp_path / "a.toml")
    (tmp_path / "d.toml").write_text('extends = "nowhere"\n')
    with pytest.raises(ProfileError, match="nowhere.toml: no such profile file"):
        load_profile(tmp_path / "d.toml")
