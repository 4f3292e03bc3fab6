"""deploy/systemd/: ``systemd-analyze verify`` on every unit, and their command lines against the CLI.

``systemd-analyze verify`` (where the machine has systemd's tools) loads each unit as systemd
would and reports every key it does not know or cannot parse; the units name the install path
``/opt/foreshock/bin/foreshock``, which the test points at this checkout's ``foreshock`` so that
the check of the executable passes. Each ``ExecStart`` is expanded as systemd would (the
example environment file, the state and credentials directories, ``%l``) and parsed by the CLI.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from foreshock.cli import app

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
INSTALLED = "/opt/foreshock/bin/foreshock"


def directives(unit: Path) -> dict[str, list[str]]:
    """Key -> values of a unit file, continuation lines joined."""
    out: dict[str, list[str]] = {}
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def example_environment() -> dict[str, str]:
    lines = (ROOT / "deploy" / "systemd" / "foreshock.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_every_process_has_a_unit():
    names = {u.stem for u in UNITS}
    assert {"foreshock-serve", "foreshock-mitigate"} <= names
    assert {f"foreshock-collect-{s}" for s in ("kmsg", "dcgm", "ib", "nvml", "slurm")} <= names


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed on this machine (Debian package systemd)")
def test_systemd_analyze_verifies_every_unit_without_a_warning(tmp_path):
    here = Path(sys.executable).with_name("foreshock")
    assert here.exists()
    for unit in UNITS:
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, str(here)))
    done = subprocess.run(["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_every_unit_restarts_and_is_hardened(unit):
    d = directives(unit)
    assert d["Restart"] == ["always"] and d["StartLimitIntervalSec"] == ["0"]
    assert d["ProtectSystem"] == ["strict"] and d["NoNewPrivileges"] == ["yes"]
    assert d["ProtectHome"] == ["yes"] and d["PrivateTmp"] == ["yes"]
    assert len(d["StateDirectory"]) == 1 and d["StateDirectory"][0].startswith("foreshock/")
    assert "CapabilityBoundingSet" in d  # empty, or the one capability the kernel log needs
    assert d.get("DynamicUser") == ["yes"] or d.get("User") == ["root"]  # root only where it must


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_every_exec_start_is_a_command_line_the_cli_accepts(unit):
    env = {**example_environment(), "STATE_DIRECTORY": "/var/lib/foreshock/x",
           "CREDENTIALS_DIRECTORY": "/run/credentials/x"}
    [line] = directives(unit)["ExecStart"]
    line = line.replace("%l", "node0001").replace("%S", "/var/lib")
    line = re.sub(r"\$\{(\w+)\}", lambda m: shlex.quote(env[m.group(1)]), line)  # one word each
    line = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], line)  # split into words, as systemd does
    binary, name, *args = shlex.split(line)
    assert binary == INSTALLED
    group = typer.main.get_command(app)
    command = group.get_command(typer.Context(group), name)
    with command.make_context(name, args) as ctx:
        assert ctx.params
