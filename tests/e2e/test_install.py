"""Foreshock installed from its wheel, outside the checkout, and beside a training repository.

The wheel is built from this checkout and installed into a fresh virtual environment in a temporary
folder. Its dependencies are not downloaded again: a ``.pth`` line points the new environment at
the test's own site-packages (the project's editable install there is not activated by a path
line, so every ``foreshock`` import resolves to the wheel, which the test checks).
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KMSG = ROOT / "tests" / "data" / "collectors" / "xid" / "xid_lines.txt"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> Path:
    """A fresh virtual environment with the freshly built wheel installed; returns its bin folder."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"  # a copy, so the build leaves nothing in the checkout
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in listed:
        if (ROOT / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(base / "dist"), str(source)], check=True, cwd=base)
    [wheel] = (base / "dist").glob("foreshock-*.whl")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False)
    purelib = Path(subprocess.run([str(env_dir / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
                    "--no-deps", "-q", str(wheel)], check=True, cwd=base)
    return env_dir / "bin"


def run(bin_dir: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_resolves_foreshock_to_itself(wheel_env, tmp_path):
    code = "import foreshock.ingest.contract as c; print(c.__file__)"
    out = run(wheel_env, ["python", "-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    assert str(wheel_env.parent) in out.stdout and str(ROOT) not in out.stdout


def test_the_wheel_simulates_a_shipped_profile_outside_the_checkout(wheel_env, tmp_path):
    out = run(wheel_env, ["foreshock", "simulate", "--profile", "llama3", "--nodes", "2", "--duration", "10m",
                          "--out", str(tmp_path / "data")], tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "data" / "manifest.json").is_file()


def test_the_wheel_replays_the_shipped_trace(wheel_env, tmp_path):
    out = run(wheel_env, ["foreshock", "goodput", "--trace", "infinitehbd", "--json", "--no-plot",
                          "--drill", "drill-256mb", "--state-gb-per-gpu", "0.4"], tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {row["strategy"] for row in rows} >= {"fixed", "tiered"}


def test_the_wheel_parses_a_kernel_log_with_the_shipped_xid_table(wheel_env, tmp_path):
    out = run(wheel_env, ["foreshock", "parse", "kmsg", str(KMSG)], tmp_path)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert records and all("xid" in r for r in records)
    assert {r["severity"] for r in records} - {None}  # severities come from the shipped Xid table


TRAIN_SCRIPT = '''
import models, features, ingest          # the training repository's own packages
import torch
import torch.distributed as dist
from foreshock.mitigator.channels import FileChannel
from foreshock.mitigator.hook import TrainingHook

assert models.OWN and features.OWN and ingest.OWN
dist.init_process_group("gloo", init_method="file://" + str(__import__("pathlib").Path("pg").resolve()),
                        rank=0, world_size=1)
model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
hook = TrainingHook("job", "node0", FileChannel("control"), "ckpt", model=model, optimizer=optimizer,
                    memory_every=1, durable_every=2, memory_dir="mem")
start = hook.resume()
for step in range(start, start + 2):
    loss = model(torch.ones(3, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    hook.step_end(step + 1)
hook.close()
dist.destroy_process_group()
print("trained to step", start + 2)
'''


def make_training_repo(path: Path) -> Path:
    """A training repository with packages of its own named like Foreshock's layers."""
    for name in ("models", "features", "ingest"):
        (path / name).mkdir(parents=True)
        (path / name / "__init__.py").write_text("OWN = True\n")
    (path / "models" / "__init__.py").write_text(
        "import torch\nOWN = True\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n"
        "        super().__init__(4, 2)\n")
    (path / "train.py").write_text(TRAIN_SCRIPT)
    return path


@pytest.mark.parametrize("where", ["wheel", "checkout"])
def test_a_training_repo_with_its_own_models_package_trains_with_the_hook(where, wheel_env, tmp_path):
    repo = make_training_repo(tmp_path / "repo")
    python = str(wheel_env / "python") if where == "wheel" else sys.executable
    for expected in (2, 4):  # the second run resumes from the tiers the first one wrote
        out = subprocess.run([python, "train.py"], cwd=repo, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert f"trained to step {expected}" in out.stdout
