"""The node-state collector (:mod:`foreshock.ingest.collectors.node_states`) on scripted ``sinfo`` output
(the real sinfo and the Kubernetes node list: tests/integration)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from foreshock.ingest.collectors import CollectorOptions, CollectorUnavailable
from foreshock.ingest.collectors.node_states import NodeStateCollector
from foreshock.ingest.collectors.slurm import SINFO_ARGS, SinfoPoll, parse_sinfo, service_class


class ScriptedSinfo:
    """Answers each ``sinfo`` call with the next scripted output (``None``: sinfo fails with a
    message; a ``(returncode, stdout, stderr)`` tuple: exactly that)."""

    def __init__(self, *outputs: str | tuple[int, str, str] | None):
        self.outputs = list(outputs)
        self.calls: list[list[str]] = []

    def __call__(self, args, **_kwargs) -> subprocess.CompletedProcess:
        self.calls.append(args)
        out = self.outputs.pop(0)
        if isinstance(out, tuple):
            return subprocess.CompletedProcess(args, *out)
        if out is None:
            return subprocess.CompletedProcess(
                args, 1, "", "slurm_load_node error: Unable to contact slurm controller"
            )
        return subprocess.CompletedProcess(args, 0, out, "")


def collector(run, state_file=None, start=1_000):
    clock = iter(range(start, start + 1_000_000, 60_000))
    return NodeStateCollector(SinfoPoll(run=run), state_file, lambda: next(clock), "slurm")


def events(records) -> list[tuple[str, str]]:
    return [(r.node, r.event) for r in records]


@pytest.mark.parametrize(
    ("state", "cls"),
    [
        ("idle", "up"),
        ("allocated", "up"),
        ("mixed-", "up"),
        ("idle*", "up"),
        ("completing", "up"),
        ("drained", "drained"),
        ("draining", "drained"),
        ("drained*", "drained"),
        ("MAINT", "drained"),
        ("down", "down"),
        ("down*", "down"),
        ("fail", "down"),
        ("failing", "down"),
        ("reboot_issued", "down"),
        ("unknown", None),
        ("future", None),
        ("powered_down~", None),
        ("", None),
    ],
)
def test_service_class(state, cls):
    assert service_class(state) == cls


def test_parse_sinfo_dedupes_partitions_and_skips_junk():
    text = "node1|idle\nnode1|idle\nnode2|drained*\nnode3|future\ngarbage line\n|idle\n\nnode4|down\n"
    assert parse_sinfo(text) == {
        "node1": ("up", "state idle"),
        "node2": ("drained", "state drained*"),
        "node4": ("down", "state down"),
    }


def test_changes_become_events_and_the_first_sight_publishes_no_up():
    run = ScriptedSinfo(
        "node1|idle\nnode2|drained\nnode3|down*\n",
        "node1|allocated\nnode2|idle\nnode3|idle\n",
        "node1|draining\nnode2|idle\nnode3|idle\n",
        "node1|drained\nnode2|idle\nnode3|down\n",
    )
    c = collector(run)
    first = c.collect()
    assert events(first) == [("node2", "drained"), ("node3", "down")]
    assert first[0].ts == 1_000 and first[0].detail == "slurm: state drained"
    assert events(c.collect()) == [("node2", "repaired"), ("node3", "up")]  # after a drain / a fault
    assert events(c.collect()) == [("node1", "drained")]
    assert events(c.collect()) == [("node3", "down")]  # draining -> drained is the same class
    assert run.calls[0] == ["sinfo", *SINFO_ARGS]


def test_a_failing_sinfo_yields_nothing_and_forgets_nothing():
    c = collector(ScriptedSinfo("node1|drained\n", None, "node1|idle\n"))
    assert events(c.collect()) == [("node1", "drained")]
    assert c.collect() == [] and c.failures == 1
    assert events(c.collect()) == [("node1", "repaired")]


def test_a_silent_nonzero_exit_is_a_failure_not_an_empty_cluster():
    c = collector(ScriptedSinfo("node1|drained\n", (1, "", "")))
    c.collect()
    assert c.collect() == [] and c.failures == 1 and c.published == {"node1": "drained"}


def test_a_missing_binary_is_a_failed_poll_not_a_crash(tmp_path):
    c = NodeStateCollector(SinfoPoll(sinfo=str(tmp_path / "no-sinfo")), None, lambda: 0, "slurm")
    assert c.collect() == [] and c.failures == 1


def test_state_file_carries_a_return_across_a_restart(tmp_path):
    state = tmp_path / "slurm-state.json"
    a = collector(ScriptedSinfo("node1|idle\nnode2|drained\n"), state)
    assert events(a.collect()) == [("node2", "drained")]
    assert not state.exists()  # written only once the loop has handed the events over
    assert a.drain() == []
    # node2 was resumed while no collector ran: the next one still publishes the return
    b = collector(ScriptedSinfo("node1|idle\nnode2|idle\n", "node1|idle\nnode2|idle\n"), state)
    assert events(b.collect()) == [("node2", "repaired")]
    assert events(b.collect()) == []
    assert '"node2": "up"' in state.read_text()


def test_a_crash_before_the_state_is_written_repeats_the_event(tmp_path):
    state = tmp_path / "slurm-state.json"
    a = collector(ScriptedSinfo("node1|idle\n", "node1|drained\n"), state)
    a.collect()
    assert events(a.collect()) == [("node1", "drained")]  # published; then the process dies
    b = collector(ScriptedSinfo("node1|drained\n"), state)
    assert events(b.collect()) == [("node1", "drained")]  # at least once, never lost


def test_a_foreign_state_file_is_refused(tmp_path):
    bad = tmp_path / "state.json"
    bad.write_text('{"node1": "sleeping"}')
    with pytest.raises(CollectorUnavailable, match="not a node-state collector's state file"):
        collector(ScriptedSinfo(), bad)
    bad.write_text("{not json")
    with pytest.raises(CollectorUnavailable, match="cannot read"):
        collector(ScriptedSinfo(), bad)


def test_registered_under_slurm(monkeypatch):
    from foreshock.ingest.collectors import create_collector

    with pytest.raises(CollectorUnavailable, match="no folder"):
        create_collector("slurm", CollectorOptions(node="", path=Path("/nonexistent/dir/state.json")))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CollectorUnavailable, match="sinfo is not on PATH"):
        create_collector("slurm", CollectorOptions(node=""))
