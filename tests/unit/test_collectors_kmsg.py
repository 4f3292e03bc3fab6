"""Kernel-log Xid collector on real captured lines (tests/data/collectors/SOURCES.md)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from foreshock.ingest.collectors import CollectorOptions, create_collector, parser_for
from foreshock.ingest.collectors.fold import XidFolder
from foreshock.ingest.collectors.kernel_log import KernelLineParser
from foreshock.ingest.collectors.kmsg import (
    DevKmsgSource,
    FileSource,
    KernelLogCollector,
    gpu_indexes_from_proc,
    journal_line,
)
from foreshock.ingest.collectors.pci import normalize_pci_bus_id
from foreshock.ingest.collectors.xid_policy import load_xid_policy
from foreshock.ingest.contract import LinkSample, Topic, XidEvent, decode, encode

DATA = Path(__file__).parents[1] / "data" / "collectors" / "xid"
CLOCK_MS = 1_800_000_000_000


def _parser(bus_to_gpu=None) -> KernelLineParser:
    return KernelLineParser("node0001", load_xid_policy(), bus_to_gpu or {}, lambda: CLOCK_MS)


def _real_lines() -> list[tuple[int, str, int]]:
    """(line number, text, xid recorded by the curator) for every real Xid line."""
    lines = (DATA / "xid_lines.txt").read_text().splitlines()
    with open(DATA / "xid_lines.sources.tsv") as f:
        expected = {int(r["line_no"]): int(r["xid"]) for r in csv.DictReader(f, delimiter="\t")}
    return [(n, text, expected[n]) for n, text in enumerate(lines, start=1)]


def test_every_real_xid_line_parses_with_its_code_and_bus_id():
    parser = _parser()
    lines = _real_lines()
    assert len(lines) == 88 and len({x for _, _, x in lines}) >= 15
    for number, text, xid in lines:
        event = parser.parse(text)
        assert isinstance(event, XidEvent), f"line {number} not parsed: {text}"
        assert event.xid == xid, number
        # bus id: whatever sits between "Xid (" and "):", canonicalised independently of the parser
        raw_bus = text.split("Xid (", 1)[1].split(")", 1)[0]
        assert event.pci_bus_id == normalize_pci_bus_id(raw_bus), number
        assert event.message and "NVRM" not in event.message
        assert event.severity and event.action
        assert decode(Topic.XID, encode(event)) == [event]  # valid on the wire


@pytest.mark.parametrize("line_no, pid, process, bus, message_start", [
    (20, 2519562, "python3", "0002:00:00.0", "Graphics Exception: ChID 000c"),
    (1, None, None, "0000:38:00.0", "Graphics SM Global Exception on (GPC 8, TPC 5, SM 1)"),
    (28, None, None, "0000:03:00.0", "Channel 00000001"),                    # "(0000:03:00)", no PCI:
    (41, 1896, None, "0000:10:1c.0", "Row Remapper: New row marked"),         # pid without name
    (39, None, None, "0000:19:00.0", "32260b5e 000154b0"),                    # no pid at all
    (66, 876766, "ray::WorkerDict", "0019:01:00.0", "RLW_RXPIPE Nonfatal"),
])
def test_pid_process_bus_and_message(line_no, pid, process, bus, message_start):
    text = (DATA / "xid_lines.txt").read_text().splitlines()[line_no - 1]
    event = _parser().parse(text)
    assert (event.pid, event.process, event.pci_bus_id) == (pid, process, bus)
    assert event.message.startswith(message_start)


def test_timestamps_from_line_prefixes_or_the_clock():
    lines = (DATA / "xid_lines.txt").read_text().splitlines()
    parser = _parser()
    assert parser.parse(lines[0]).ts == 1737434504283          # 2025-01-21T04:41:44,283302+00:00
    assert parser.parse(lines[16]).ts == 1725018189000         # [Fri Aug 30 11:43:09 2024]
    assert parser.parse(lines[22]).ts == CLOCK_MS              # [16450076.435595]: seconds since boot
    assert parser.parse(lines[22], ts=42).ts == 42             # the source's own timestamp wins


def test_dmesg_sequence_48_63_94_and_report():
    with open(DATA / "dmesg-xid48-63-94-sequence.log", "rb") as f:
        result = parser_for("kmsg")(f, CollectorOptions(node="n1", clock=lambda: CLOCK_MS))
    assert [r.xid for r in result.records] == [48, 63, 94] + [94] * 8
    assert all(r.pci_bus_id == "0000:19:00.0" for r in result.records)
    assert [r.severity for r in result.records[:2]] == ["FATAL", "NONFATAL"]
    report = result.report
    assert report.parsed == 11 and report.read == 11 + len(report.skipped)
    assert report.skipped[:10] == list(range(1, 11))
    assert "skipped" in report.summary() and "1-10" in report.summary()


def test_gsp_log_only_xid_lines_become_events():
    with open(DATA / "xid_dmesg-with-xid-119.log", "rb") as f:
        result = parser_for("kmsg")(f, CollectorOptions(node="n1", clock=lambda: CLOCK_MS))
    text = (DATA / "xid_dmesg-with-xid-119.log").read_text()
    raw_xid_lines = [ln for ln in text.splitlines() if "Xid (" in ln]
    assert len(raw_xid_lines) >= 1
    assert sum(r.count for r in result.records) == len(raw_xid_lines)
    assert {r.xid for r in result.records} == {119}


def test_fallen_off_the_bus_is_xid_79():
    line = "[ 1234.5] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    event = _parser({"0000:3b:00.0": 5}).parse(line)
    assert (event.xid, event.pci_bus_id, event.gpu, event.severity) == (79, "0000:3b:00.0", 5, "FATAL")


def test_mlx5_link_down_lines_become_link_samples():
    # Constructed in the shape of the mlx5 Ethernet driver's message (no citable capture exists in
    # the shared real data; see tests/data/collectors/SOURCES.md).
    parser = _parser()
    eth = parser.parse("[ 2929.428680] mlx5_core 0000:08:00.7 ens9f0v5: Link down")
    ib = parser.parse("mlx5_core 0000:4b:00.0 ibp75s0: Link is Down")
    assert isinstance(eth, LinkSample) and (eth.port, eth.kind, eth.state) == ("ens9f0v5", "eth", "DOWN")
    assert (ib.port, ib.kind, ib.state) == ("ibp75s0", "ib", "DOWN")
    assert parser.parse("mlx5_core 0000:04:00.0 enp4s0f0np0: Link up") is None
    assert parser.parse("igc 0000:05:00.0 eth5: NIC Link is Down") is None


def test_bus_id_maps_to_gpu_index_from_the_driver_proc_tree(tmp_path):
    for bus, minor in (("0000:38:00.0", 3), ("0000:19:00.0", 1)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: NVIDIA H100\nDevice Minor: \t {minor}\n")
    mapping = gpu_indexes_from_proc(tmp_path)
    assert mapping == {"0000:38:00.0": 3, "0000:19:00.0": 1}
    lines = (DATA / "xid_lines.txt").read_text().splitlines()
    assert _parser(mapping).parse(lines[0]).gpu == 3
    assert _parser(mapping).parse(lines[18 + 2]).gpu is None  # a bus not in the map
    assert gpu_indexes_from_proc(tmp_path / "absent") == {}


def test_policy_override_merges_over_the_shipped_table(tmp_path):
    shipped = load_xid_policy()
    assert shipped.lookup(79).severity == "FATAL" and shipped.version.startswith("builtin-")
    assert shipped.lookup(99999).severity == "UNKNOWN"
    override = tmp_path / "site.csv"
    override.write_text("# version: site-7\nxid,severity,action\n63,FATAL,DRAIN_AND_RESET\n555,NONFATAL,\n")
    policy = load_xid_policy(override)
    assert policy.version == f"{shipped.version}+site-7"
    assert (policy.lookup(63).severity, policy.lookup(63).action) == ("FATAL", "DRAIN_AND_RESET")
    assert policy.lookup(63).mnemonic == shipped.lookup(63).mnemonic      # empty column keeps shipped
    assert policy.lookup(555).severity == "NONFATAL"
    assert policy.lookup(13) == shipped.lookup(13)
    bad = tmp_path / "bad.csv"
    bad.write_text("xid,colour\n1,red\n")
    with pytest.raises(ValueError, match="unknown policy columns"):
        load_xid_policy(bad)


def _flood_event(ts: int, message: str = "GPU has fallen off the bus.") -> XidEvent:
    return XidEvent(node="n", ts=ts, xid=79, pci_bus_id="0000:91:00.0", message=message)


def test_flood_folding_loses_no_count():
    folder = XidFolder(window_ms=10_000)
    emitted = []
    for i in range(100_000):  # 100k identical lines over 50 s
        emitted += folder.offer(_flood_event(1_000_000 + i // 2))
    emitted += folder.drain()
    assert sum(e.count for e in emitted) == 100_000
    assert len(emitted) <= 2 * (50 // 10 + 1)
    assert emitted[0].count == 1 and emitted[0].ts == 1_000_000   # the first one is not held back
    folded = [e for e in emitted if e.count > 1]
    assert all(e.first_ts <= e.last_ts and e.last_ts - e.first_ts < 10_000 for e in folded)


def test_folding_keeps_distinct_lines_apart_and_expires_on_wall_time():
    folder = XidFolder(window_ms=1_000)
    out = folder.offer(_flood_event(0)) + folder.offer(_flood_event(1, "other"))
    out += folder.offer(_flood_event(2)) + folder.offer(_flood_event(3))
    assert [e.count for e in out] == [1, 1]
    assert folder.expire(500) == []
    expired = folder.expire(1_000)
    assert [(e.count, e.first_ts, e.last_ts) for e in expired] == [(2, 2, 3)]
    assert folder.drain() == []


def test_folding_memory_is_bounded():
    folder = XidFolder(window_ms=60_000, max_open=10)
    emitted = []
    for i in range(1000):
        emitted += folder.offer(_flood_event(i, f"msg {i % 50}"))
    emitted += folder.drain()
    assert len(folder._open) == 0 and sum(e.count for e in emitted) == 1000


def test_file_source_follows_appended_lines_and_folds(tmp_path):
    log = tmp_path / "kern.log"
    real = (DATA / "xid_lines.txt").read_text().splitlines()
    log.write_text("\n".join(real[:3]) + "\n" + real[3][:20])  # last line still being written
    collector = create_collector("kmsg", CollectorOptions(node="n", path=log, clock=lambda: CLOCK_MS,
                                                          fold_window_ms=3_600_000))
    assert isinstance(collector, KernelLogCollector) and isinstance(collector.source, FileSource)
    first = collector.collect()
    assert [e.xid for e in first] == [13, 13, 13]
    with open(log, "a") as f:
        f.write(real[3][20:] + "\n" + (real[43] + "\n") * 500)
    second = collector.collect()
    assert second[0].message.startswith("Graphics SM Global Exception on (GPC 9, TPC 1, SM 1)")
    assert [e.xid for e in second] == [13, 79]  # 499 repeats of the Xid 79 line held back
    rest = collector.drain()
    assert [(e.xid, e.count) for e in rest] == [(79, 499)]


def test_file_source_starts_over_when_the_file_is_truncated(tmp_path):
    log = tmp_path / "kern.log"
    real = (DATA / "xid_lines.txt").read_text().splitlines()
    log.write_text("\n".join(real[:10]) + "\n")
    source = FileSource(log)
    assert len(source.read_lines()) == 10
    log.write_text(real[43] + "\n")  # rotated by copytruncate, then one new line
    assert [t for t, _ in source.read_lines()] == [real[43]]
    source.close()


def test_dev_kmsg_source_reads_real_kernel_records():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    source = DevKmsgSource(Path("/dev/kmsg"), from_start=True, clock=lambda: CLOCK_MS)
    try:
        lines = source.read_lines()
    finally:
        source.close()
    assert lines and all(isinstance(t, str) and isinstance(ts, int) for t, ts in lines)
    assert all(ts <= CLOCK_MS for _, ts in lines)


def test_journal_json_lines():
    raw = (b'{"MESSAGE":"NVRM: Xid (PCI:0000:38:00): 13, pid=1, name=x, boom",'
           b'"__REALTIME_TIMESTAMP":"1700000000123456","PRIORITY":"4"}')
    text, ts = journal_line(raw)
    assert ts == 1_700_000_000_123 and _parser().parse(text, ts).xid == 13
    assert journal_line(b'{"MESSAGE":[78,86,82,77,58,32,255]}')[0].startswith("NVRM: ")
    assert journal_line(b"not json") is None
