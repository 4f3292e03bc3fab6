"""The durable tier on storage that fills up or turns read-only: a tmpfs of a few MiB of its own (needs
root, as ``make test`` runs), with ``TrainingHook`` in one gloo process (world size 1).

Training never stops for a snapshot that cannot be saved, and nothing partial is ever marked complete.
Pruning makes room before the write, so ``keep=2`` fits where two snapshots fit, not three. A leave
command whose snapshot is refused for lack of room is acked as failed, and the real mitigator then
drains nothing under the job: checked in ``sinfo`` of a real Slurm, in the audit log, and against the
breaker's limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.contract import RiskScore
from foreshock.ingest.stream import now_ms, publish
from foreshock.mitigator.audit import AuditLog
from foreshock.mitigator.channels import FileChannel
from foreshock.mitigator.engine import MitigationEngine
from foreshock.mitigator.executor import Executor
from foreshock.mitigator.hook import TrainingHook, latest_complete_snapshot
from foreshock.mitigator.jobs import FileJobs
from foreshock.mitigator.policy import ExpectedLossPolicy, PolicyConfig
from foreshock.mitigator.schedulers import SlurmAdapter
from foreshock.mitigator.service import MitigationService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def mount(tmp_path):
    """``mount(options)``: a fresh tmpfs with those options (``size=…``, ``nr_inodes=…``); unmounted after."""
    mounted: list[Path] = []

    def make(options: str) -> Path:
        mnt = tmp_path / f"fs{len(mounted)}"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True,
                          timeout=30).returncode:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True, timeout=30)


def make_hook(tmp_path: Path, ckpt: Path, node: str = "nodeA", **kw) -> TrainingHook:
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights, and as much momentum: a 2 MiB state
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    control = tmp_path / "control"
    hook = TrainingHook(kw.pop("job", "job1"), node, FileChannel(control), ckpt, model=model,
                        optimizer=optimizer, status_root=control, **kw)
    hook.resume()
    return hook


def train(hook: TrainingHook, steps: range) -> None:
    model = hook.state.model
    optimizer = hook.state.optimizer
    for step in steps:
        loss = model(torch.full((3, 512), float(step % 5))).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        hook.step_end(step + 1)


def used(mnt: Path) -> tuple[int, int]:
    """(bytes, inodes) in use on the file system at ``mnt``."""
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree


def one_snapshot(tmp_path: Path, mount) -> tuple[int, int]:
    """(bytes, inodes) one complete snapshot of the test's state takes on a tmpfs."""
    mnt = mount("size=64m")
    before = used(mnt)
    (mnt / "ckpt").mkdir()
    hook = make_hook(tmp_path / "measure", mnt / "ckpt", durable_every=1, keep=1)
    train(hook, range(0, 1))
    hook.close()
    after = used(mnt)
    return after[0] - before[0], after[1] - before[1] - 1  # less the ckpt folder


def test_keep_two_needs_room_for_two_snapshots_not_three(tmp_path, mount, process_group):
    size, _ = one_snapshot(tmp_path, mount)
    room = 5 * size // 2  # two snapshots and a half
    assert 3 * size > room
    mnt = mount(f"size={room}")
    hook = make_hook(tmp_path, mnt / "ckpt", durable_every=1, keep=2)
    train(hook, range(0, 6))
    hook.close()
    assert hook.durable.failures == 0, hook.durable.last_error  # pruned before each write
    assert sorted(p.name for p in (mnt / "ckpt").iterdir()) == ["step-00000005", "step-00000006"]

    three = make_hook(tmp_path / "three", mnt / "ckpt3", durable_every=1, keep=3)  # the same room, keep=3
    train(three, range(0, 4))
    three.close()
    assert three.durable.failures >= 1
    assert three.durable.last_error == "not enough free space for the snapshot"


@pytest.mark.parametrize("fault", ["no room for the COMPLETE marker", "no room for the metadata",
                                   "read-only"])
def test_storage_that_fails_in_the_middle_of_a_snapshot_never_marks_it_and_training_goes_on(
        tmp_path, mount, process_group, fault, caplog):
    _, inodes = one_snapshot(tmp_path, mount)
    # the root and ckpt folders, one complete snapshot, and the next one's files but the last one or two
    short = {"no room for the COMPLETE marker": 1, "no room for the metadata": 2, "read-only": 0}[fault]
    mnt = mount(f"size=64m,nr_inodes={2 + 2 * inodes - short}" if short else "size=64m")
    hook = make_hook(tmp_path, mnt / "ckpt", durable_every=1, keep=2)
    train(hook, range(0, 1))
    assert hook.durable.finish() == 1 and latest_complete_snapshot(mnt / "ckpt")[0] == 1
    if fault == "read-only":
        remount(mnt, "ro")
    train(hook, range(1, 4))  # every later snapshot fails; not one step does
    hook.close()
    assert hook.durable.failures == 3
    why = {1: "COMPLETE marker not written", 2: "No space left on device", 0: "Read-only file system"}[short]
    assert why in hook.durable.last_error
    assert sorted(p.name for p in (mnt / "ckpt").iterdir()) == ["step-00000001"]  # no partial folder
    assert latest_complete_snapshot(mnt / "ckpt")[0] == 1
    assert "training goes on" in caplog.text
    if fault == "read-only":
        remount(mnt, "rw")
        train(hook, range(4, 5))  # the storage is back: the next snapshot completes
        hook.close()
        assert latest_complete_snapshot(mnt / "ckpt")[0] == 5


def test_a_full_snapshot_folder_refuses_the_leave_and_the_mitigator_drains_nothing(
        tmp_path, mount, process_group, slurm_cluster):
    mnt = mount("size=4m")
    (mnt / "ballast").write_bytes(b"\0" * (3 << 20))  # 1 MiB left for a 2 MiB state
    control = tmp_path / "control"
    hook = make_hook(tmp_path, mnt / "ckpt", node="node2", job="llm", durable_every=0)
    left: list[int] = []
    hook.leave = lambda: left.append(1)
    engine = MitigationEngine(ExpectedLossPolicy(PolicyConfig(spare_nodes=("node3",))),
                              jobs=FileJobs(control, max_age_s=0), fleet_size=3)
    channel = FileChannel(control)
    executor = Executor(AuditLog(tmp_path / "audit.sqlite"), scheduler=SlurmAdapter(env=slurm_cluster.env),
                        channel=channel, acks=channel, ack_timeout_s=60, workers=2)
    bus = InMemoryBus()
    service = MitigationService(bus, engine, executor)
    t = now_ms()
    publish(bus, [RiskScore(node="node2", ts=t + i, probability=0.95, alert=True, threshold=0.8)
                  for i in range(2)])
    step, deadline = 0, time.monotonic() + 60
    while not any(o.action.kind == "drain" for o in service.outcomes):  # train while the mitigator acts
        assert time.monotonic() < deadline, service.status()
        train(hook, range(step, step + 1))
        step += 1
        service.poll_once(0.01)
    train(hook, range(step, step + 3))  # and training goes on
    hook.close()
    service.close()
    outcomes = [(o.action.kind, o.status) for o in service.outcomes]
    assert outcomes == [("migrate", "failed"), ("drain", "skipped")]
    assert "not enough free space for the snapshot" in service.outcomes[0].detail
    assert left == [] and hook.durable.failures == 1  # the node never left without its state saved
    assert not list((mnt / "ckpt").glob("step-*"))  # the refused save was never begun
    assert slurm_cluster.states()["node2"] == "idle"  # nothing drained under a job whose state is not saved
    rows = [(e.action, e.status) for e in executor.audit.events() if e.node == "node2"]
    assert ("drain", "planned") in rows and ("drain", "skipped") in rows and ("drain", "started") not in rows
    ack = json.loads(next((control / "llm" / "acks").iterdir()).read_text())
    assert ack["detail"].startswith("failed: snapshot not saved")
