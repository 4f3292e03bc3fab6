"""TrainingHook in one process (gloo, world size 1): commands, async snapshots, resume, leave.

The multi-agent torchrun path is exercised end to end in tests/e2e/test_drill.py.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from foreshock.mitigator.channels import Command, FileChannel
from foreshock.mitigator.hook import TrainingHook, latest_complete_snapshot
from foreshock.mitigator.jobs import FileJobs


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def make(tmp_path, seed: int, **kw):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = TrainingHook("job1", "nodeA", FileChannel(tmp_path / "control"), tmp_path / "ckpt", model=model,
                        optimizer=optimizer, status_root=tmp_path / "control", **kw)
    return model, optimizer, hook


def train(model, optimizer, hook, steps: range) -> None:
    for step in steps:
        loss = model(torch.full((3, 4), float(step))).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        hook.step_end(step + 1)


def test_checkpoint_command_snapshots_acks_and_resume_restores_the_state(tmp_path, process_group):
    model, optimizer, hook = make(tmp_path, seed=0)
    assert hook.resume() == 0
    train(model, optimizer, hook, range(0, 3))
    cmd = Command("checkpoint:nodeA:job1:1", "job1", "checkpoint", "nodeA", 1)
    FileChannel(tmp_path / "control").send(cmd)
    train(model, optimizer, hook, range(3, 4))  # sees the command at step 4 and starts an async save
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, optimizer, hook, range(4, 6))  # training goes on while it writes
    hook.close()
    assert latest_complete_snapshot(tmp_path / "ckpt")[0] == 4
    ack = json.loads((tmp_path / "control" / "job1" / "acks" / f"{cmd.action_id}.json").read_text())
    assert "step 4" in ack["detail"]
    [job] = FileJobs(tmp_path / "control").jobs()
    assert job.nodes == ("nodeA",) and job.last_checkpoint_ms >= ack["ts"] - 5_000

    model2, optimizer2, hook2 = make(tmp_path, seed=123)  # different init: must be overwritten
    assert hook2.resume() == 4
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert optimizer2.state_dict()["state"], "momentum buffers restored"
    assert FileChannel(tmp_path / "control").poll("job1") == []  # acked commands are not replayed


def test_periodic_snapshots_keep_only_the_newest(tmp_path, process_group):
    model, optimizer, hook = make(tmp_path, seed=0, every_steps=2, keep=2)
    hook.resume()
    train(model, optimizer, hook, range(0, 9))
    hook.close()
    complete = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if (p / "COMPLETE").exists())
    assert complete == ["step-00000006", "step-00000008"]


def test_leave_waits_for_a_durable_snapshot_then_leaves(tmp_path, process_group):
    left: list[int | None] = []
    model, optimizer, hook = make(tmp_path, seed=0)
    hook.leave = lambda: left.append(latest_complete_snapshot(tmp_path / "ckpt")[0])
    hook.resume()
    FileChannel(tmp_path / "control").send(Command("migrate:nodeA:job1:7", "job1", "leave", "nodeA", 7))
    train(model, optimizer, hook, range(0, 2))
    assert left == [1]  # left at the first step that saw the command, after its snapshot was complete


def test_memory_tier_resumes_a_restarted_worker_bit_for_bit_and_ahead_of_the_durable_tier(tmp_path,
                                                                                       process_group):
    model, optimizer, hook = make(tmp_path, seed=0, memory_every=1, durable_every=4,
                                  memory_dir=tmp_path / "shm")
    hook.resume()
    train(model, optimizer, hook, range(0, 6))  # memory at every step, durable at step 4
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    hook.close()
    assert latest_complete_snapshot(tmp_path / "ckpt")[0] == 4 and len(hook.stall_s) == 6

    model2, optimizer2, hook2 = make(tmp_path, seed=123, memory_every=1, durable_every=4,
                                     memory_dir=tmp_path / "shm")  # the restarted worker, same node
    assert hook2.resume() == 6
    assert hook2.restored["source"] == "memory"
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert all(torch.equal(s["momentum_buffer"], m) for s, m in zip(optimizer2.state.values(), momentum,
                                                                     strict=True))
    train(model2, optimizer2, hook2, range(6, 7))  # the restored tensors are the optimizer's own, not views
    assert not torch.equal(model2.state_dict()["weight"], expected["weight"])
    hook2.close()

    model3, _, hook3 = make(tmp_path, seed=5, memory_every=1, durable_every=4, memory_dir=tmp_path / "gone")
    assert hook3.resume() == 4 and hook3.restored["source"] == "durable"  # the node's memory is lost
    hook3.close()


def test_importing_the_hook_loads_no_cluster_side_service():
    import subprocess
    import sys

    cluster_side = ("kafka", "fastapi", "foreshock.predictor", "foreshock.features", "foreshock.models",
                    "foreshock.mitigator.policy", "foreshock.mitigator.service", "foreshock.mitigator.engine",
                    "foreshock.mitigator.executor", "foreshock.mitigator.schedulers")
    code = ("import sys, foreshock.mitigator.hook; "
            f"print(' '.join(sorted(m for m in sys.modules if m.startswith({cluster_side!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_snapshot_folder_that_cannot_be_written_warns_counts_acks_the_failure_and_training_goes_on(
        tmp_path, process_group):
    ckpt = tmp_path / "ckpt"
    model, optimizer, hook = make(tmp_path, seed=0, durable_every=2)
    hook.resume()
    train(model, optimizer, hook, range(0, 2))  # step 2 saved while the folder is writable
    hook.close()
    assert latest_complete_snapshot(ckpt)[0] == 2
    for step in (3, 4, 6):  # a file where each snapshot folder must go: writes fail, for root too
        (ckpt / f"step-{step:08d}").write_text("in the way")
    cmd = Command("migrate:nodeA:job1:9", "job1", "leave", "nodeA", 9)
    FileChannel(tmp_path / "control").send(cmd)
    left: list[int] = []
    hook.leave = lambda: left.append(1)
    train(model, optimizer, hook, range(2, 6))  # step 3: the command; steps 4 and 6: periodic
    hook.close()
    assert hook.durable.failures == 3 and hook.durable.last_error.startswith("rank 0: ")
    assert left == []  # a node never leaves without its state saved
    ack = json.loads((tmp_path / "control" / "job1" / "acks" / f"{cmd.action_id}.json").read_text())
    assert ack["detail"].startswith("failed")
    assert latest_complete_snapshot(ckpt)[0] == 2  # nothing partial was marked complete
