"""``foreshock parse`` and ``foreshock collect --stdout`` end to end, in-process."""

from __future__ import annotations

import threading
from pathlib import Path

from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.commands.collect import CapturedKind, Source, run_collector
from foreshock.ingest.collectors import collector_names, parser_names
from foreshock.ingest.contract import Topic, decode

DATA = Path(__file__).parents[1] / "data" / "collectors"


def _records(stdout: str, topic: str) -> list:
    return [decode(topic, line.encode())[0] for line in stdout.splitlines() if line.strip()]


def test_cli_choices_are_the_registries():
    assert sorted(s.value for s in Source) == collector_names()
    assert sorted(k.value for k in CapturedKind) == parser_names()


def test_parse_kmsg_prints_records_and_the_report():
    result = CliRunner().invoke(app, ["parse", "kmsg", str(DATA / "xid" / "dmesg-xid48-63-94-sequence.log"),
                                      "--node", "node0042"])
    assert result.exit_code == 0, result.output
    events = _records(result.stdout, Topic.XID)
    assert [e.xid for e in events] == [48, 63] + [94] * 9 and {e.node for e in events} == {"node0042"}
    assert "parsed 11" in result.stderr and "lines 1-10" in result.stderr


def test_parse_dcgm_and_ib():
    runner = CliRunner()
    dcgm = runner.invoke(app, ["parse", "dcgm", str(DATA / "dcgm" / "cncf-upcloud-L40S.prom")])
    assert dcgm.exit_code == 0 and len(_records(dcgm.stdout, Topic.GPU)) == 1
    ib = runner.invoke(app, ["parse", "ib", str(DATA / "ib" / "sys-class-infiniband-h100.flat.txt")])
    assert ib.exit_code == 0 and len(_records(ib.stdout, Topic.LINK)) == 9
    assert "read 486 lines, parsed 459, skipped 27" in ib.stderr


def test_parse_an_unreadable_file_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["parse", "kmsg", str(tmp_path / "missing.log")])
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_collect_ib_to_stdout_for_two_polls():
    tree = str(DATA / "ib" / "sys-class-infiniband")
    result = CliRunner().invoke(app, ["collect", "--source", "ib", "--path", tree, "--node", "node0001",
                                      "--interval", "10ms", "--stdout", "--polls", "2"])
    assert result.exit_code == 0, result.output
    samples = _records(result.stdout, Topic.LINK)
    assert len(samples) == 6 and [s.deltas is None for s in samples] == [True] * 3 + [False] * 3


def test_collect_needs_exactly_one_sink():
    result = CliRunner().invoke(app, ["collect", "--source", "ib", "--node", "n"])
    assert result.exit_code != 0 and "exactly one of --kafka" in result.output


def test_docstring_examples():
    import doctest

    from foreshock.ingest.collectors import infiniband, kernel_log, pci

    for module in (pci, kernel_log, infiniband):
        failed, attempted = doctest.testmod(module)
        assert attempted > 0 and failed == 0, module.__name__


def test_run_loop_stops_on_the_event_and_drains():
    class Fake:  # the smallest collector with a held-back record
        def __init__(self):
            self.polls = 0

        def collect(self):
            self.polls += 1
            if self.polls == 3:
                stop.set()
            return [self.polls]

        def drain(self):
            return ["drained"]

    stop = threading.Event()
    out: list = []
    assert run_collector(Fake(), out.extend, 0.001, stop) == 3
    assert out == [1, 2, 3, "drained"]


def test_collect_needs_node_except_for_the_cluster_wide_slurm_source():
    result = CliRunner().invoke(app, ["collect", "--source", "dcgm", "--stdout", "--polls", "1"])
    assert result.exit_code == 2 and "--source dcgm needs --node" in result.output
