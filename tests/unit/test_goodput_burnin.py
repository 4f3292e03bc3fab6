"""Burn-in in the goodput simulator: which failures it keeps off the job, what it costs the spare
pool, the with/without comparison on the real trace, and profile draws with repeat failures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.models.goodput import FailureTrace, JobParams, OperatingPoint, compare, simulate
from foreshock.models.goodput.burnin import apply_burn_in
from foreshock.models.goodput.traces import from_profile, load_infinitehbd, load_profile
from foreshock.models.reliability import DEFAULT_BURN_IN, SECONDS_PER_DAY, BurnIn
from foreshock.shipped import profile, trace

DAY, HOUR = SECONDS_PER_DAY, 3600.0
RULE = BurnIn(failures=2, window_s=30 * DAY, length_s=2 * DAY)


def node_trace(failures: list[tuple[int, float, float]], duration: float = 60 * DAY) -> FailureTrace:
    """(node, failed at, repair) rows, in any order."""
    rows = sorted(failures, key=lambda f: f[1])
    return FailureTrace("hand", 4, 8, duration, np.array([r[1] for r in rows]),
                        np.array([r[2] for r in rows]), np.array(["unknown"] * len(rows), dtype=object),
                        np.array([r[0] for r in rows]))


def test_a_fault_in_a_burn_in_is_kept_off_the_job_and_defers_the_nodes_return() -> None:
    # node 0: day 0 (first: no burn-in), day 10 (second in 30 days: burn-in from day 11), a refault at
    # day 11.5 inside it (held), back at day 12, burn-in again to day 14, day 20 after it; node 1 once
    t = node_trace([(0, 0.0, DAY), (0, 10 * DAY, DAY), (0, 11.5 * DAY, 0.5 * DAY), (0, 20 * DAY, DAY),
                    (1, 3 * DAY, DAY)])
    replay = apply_burn_in(t, RULE)
    assert replay.kept.tolist() == [True, True, True, False, True]  # in time order: node 1 is second
    assert (replay.held, replay.burn_ins) == (1, 3)
    assert replay.node_s == pytest.approx(0.5 * DAY + 2 * DAY + 2 * DAY)
    # the job's trace: the day-10 failure's node is usable again at day 14, the day-20 one at day 23
    assert replay.trace.fail_s.tolist() == [0.0, 3 * DAY, 10 * DAY, 20 * DAY]
    assert replay.trace.repair_s.tolist() == [DAY, DAY, 4 * DAY, 3 * DAY]
    assert apply_burn_in(t, BurnIn(failures=5, window_s=30 * DAY, length_s=DAY)).held == 0


def test_a_burned_in_node_is_not_a_spare_until_it_passes() -> None:
    # one spare, refilled only from repair. Node 0 is warned on day 0 and day 5 (its second failure:
    # burn-in), node 1 two hours after node 0's second repair ended.
    t = node_trace([(0, 0.0, HOUR), (0, 5 * DAY, HOUR), (1, 5 * DAY + 2 * HOUR, HOUR)])
    params = JobParams(spares=1, spare_refill_s=np.inf)
    plain = simulate(t, np.inf, params, warn_s=t.fail_s - 300)
    assert (plain.migrations, plain.planned_restarts) == (3, 0)  # node 0's return is the spare
    job = apply_burn_in(t, RULE).trace
    held = simulate(job, np.inf, params, warn_s=job.fail_s - 300)
    assert (held.migrations, held.planned_restarts) == (2, 1)  # node 0 is in burn-in: no spare for node 1


@pytest.fixture(scope="module")
def real_table():
    return compare([load_infinitehbd(trace("infinitehbd"))], JobParams(), OperatingPoint(),
                   burn_in=DEFAULT_BURN_IN).set_index("strategy")


def test_on_the_real_trace_the_burn_in_takes_its_repeat_failures_off_the_job(real_table) -> None:
    fixed, burned = real_table.loc["fixed"], real_table.loc["fixed+burn-in"]
    assert (burned["held_by_burn_in"], burned["burn_ins"]) == (74, 242) and fixed["held_by_burn_in"] == 0
    assert burned["interruptions_per_day"] == pytest.approx((582 - 74) / 349)
    assert fixed["interruptions_per_day"] == pytest.approx(582 / 349)
    assert burned["burn_in_node_days"] == pytest.approx(356.8, abs=0.1)
    t = real_table
    for name in ("fixed", "young_daly", "foreshock"):
        assert t.loc[f"{name}+burn-in", "ettr"] > t.loc[name, "ettr"]
        assert t.loc[f"{name}+burn-in", "lost_time_reduction"] > t.loc[name, "lost_time_reduction"]
    # the same draws decide which failures are warned: a burn-in only takes failures away
    assert t.loc["foreshock+burn-in", "migrations_per_day"] < t.loc["foreshock", "migrations_per_day"]


def test_a_profile_with_refaults_draws_repeat_failures_and_one_without_does_not() -> None:
    def within_a_day_of_return(name: str) -> float:
        spec = load_profile(profile(name))
        t = from_profile(dict(spec, name=name), gpus=3200, days=349, seed=3)
        back, nxt = [], []
        for node in np.unique(t.node):
            i = np.flatnonzero(t.node == node)
            back += list((t.fail_s + t.repair_s)[i[:-1]])
            nxt += list(t.fail_s[i[1:]])
        gap = np.array(nxt) - np.array(back)
        return float(np.mean((gap >= 0) & (gap < DAY))), t

    refault, t = within_a_day_of_return("infinitehbd-refault")
    plain, _ = within_a_day_of_return("infinitehbd")
    assert refault > 0.15 and plain < 0.05  # the trace: 22 % of repairs refault within a day
    assert t.nodes == 400 and t.days == 349
    assert (t.fail_s + t.repair_s <= np.r_[t.fail_s[1:], np.inf]).any()  # a node is down until repaired
    assert apply_burn_in(t, DEFAULT_BURN_IN).held > 0


def test_cli_replays_every_strategy_with_the_burn_in() -> None:
    runner = CliRunner()
    args = ["goodput", "--trace", "infinitehbd", "--burn-in", "48h", "--no-plot"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    strategies = [r["strategy"] for r in json.loads(result.stdout)]
    assert strategies == ["fixed", "young_daly", "foreshock", "oracle", "fixed+burn-in", "young_daly+burn-in",
                          "foreshock+burn-in", "oracle+burn-in"]
    text = runner.invoke(app, args).stdout
    assert "74 of 582 failures landed in a burn-in instead of the job; 242 burn-ins held 357" in text
    bad = runner.invoke(app, [*args, "--burn-in-failures", "0"])
    assert bad.exit_code == 2 and "burn-in needs failures >= 1" in bad.output
