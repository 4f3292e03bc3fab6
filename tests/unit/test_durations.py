"""The CLI's one duration type: parsed once, one unit inside, an error that names the flag."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.commands.durations import Duration


@pytest.mark.parametrize(("text", "ms"), [("250ms", 250), ("30s", 30_000), ("1.5m", 90_000),
                                          ("2h", 7_200_000), ("7d", 604_800_000), ("45", 45_000)])
def test_every_unit_comes_out_in_milliseconds(text, ms):
    assert Duration.parse(text).ms == ms


def test_a_bare_number_takes_the_flags_unit_and_never_is_refused_unless_allowed():
    assert Duration.parse("60", default_unit="m") == Duration.parse("1h")
    assert math.isinf(Duration.parse("never", never=True).ms)
    with pytest.raises(ValueError, match="not a duration"):
        Duration.parse("never")
    assert str(Duration.parse("90m")) == "90m" and str(Duration.parse("1500ms")) == "1500ms"


@pytest.mark.parametrize("argv", [
    ["serve", "--model", "m", "--score-every", "10x"],
    ["train", "--data", ".", "--out", "o", "--censor", "six hours"],
    ["collect", "--source", "kmsg", "--interval", "-1s"],
])
def test_a_bad_duration_is_a_usage_error_that_names_its_flag(argv):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert argv[-2] in result.output and "not a duration" in result.output


def test_a_horizon_that_is_not_whole_minutes_is_refused_before_any_work(tmp_path):
    result = CliRunner().invoke(app, ["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"),
                                      "--horizon", "90s", "--no-register"])
    assert result.exit_code == 2
    assert "--horizon" in result.output and "whole number of minutes" in result.output
