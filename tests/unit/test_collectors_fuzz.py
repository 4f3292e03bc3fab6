"""Fuzzing the three captured-input parsers: arbitrary bytes, huge lines and invalid UTF-8 never
raise and never hang (each test runs under a timeout; a hang fails it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.ingest.collectors import CollectorOptions, parser_for
from foreshock.ingest.collectors.kmsg import journal_line
from foreshock.ingest.contract import RECORD_TYPES, decode, encode, topic_of

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).parents[1] / "data" / "collectors"
OPTIONS = CollectorOptions(node="fuzz", clock=lambda: 1_700_000_000_000)
REAL_XID = (DATA / "xid" / "xid_lines.txt").read_bytes().splitlines()
REAL_DCGM = (DATA / "dcgm" / "cncf-kops-L4.prom").read_bytes().splitlines()
REAL_IB = (DATA / "ib" / "sys-class-infiniband-h100.flat.txt").read_bytes().splitlines()[:60]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _mutated(real: list[bytes]) -> st.SearchStrategy[list[bytes]]:
    """Real lines, cut, spliced with random bytes, or replaced by junk (invalid UTF-8 included)."""
    line = st.one_of(
        st.sampled_from(real),
        st.tuples(st.sampled_from(real), st.integers(0, 400), st.binary(max_size=200))
        .map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1]:]),
        st.binary(max_size=300),
        st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.sampled_from([b"\xff\xfe\xfd", b"\xc3\x28", b"\xed\xa0\x80", b"\x00" * 10]),
    )
    # as iterating a file yields them: one newline, at the end
    return st.lists(line.map(lambda b: b.replace(b"\n", b" ") + b"\n"), max_size=40)


def _check(kind: str, lines: list[bytes]) -> None:
    result = parser_for(kind)(iter(lines), OPTIONS)
    report = result.report
    assert report.read == len(lines)
    assert report.parsed + len(report.skipped) <= report.read
    for record in result.records:  # whatever comes out is a valid record on the wire
        topic = topic_of(record)
        assert type(record) is RECORD_TYPES[topic]
        assert decode(topic, encode(record)) == [record]


@SETTINGS
@given(_mutated(REAL_XID))
def test_kmsg_parser_never_raises(lines):
    _check("kmsg", lines)


@SETTINGS
@given(_mutated(REAL_DCGM))
def test_dcgm_parser_never_raises(lines):
    _check("dcgm", lines)


@SETTINGS
@given(_mutated(REAL_IB))
def test_ib_parser_never_raises(lines):
    _check("ib", lines)


@SETTINGS
@given(st.binary(max_size=500))
def test_journal_line_never_raises(raw):
    line = journal_line(raw)
    assert line is None or isinstance(line[0], str)


HUGE = [
    b"NVRM: Xid (PCI:0000:38:00): 13, pid=1, name=" + b"x" * 3_000_000,
    b"NVRM: Xid (" + b"0:" * 1_000_000,
    b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="' + b"\\\"" * 1_000_000 + b'"} 1',
    b"mlx5_0/ports/1/counters/" + b"a" * 2_000_000 + b": 1",
    b"mlx5_core " * 300_000 + b"Link down",
    b"\xff" * 2_000_000,
]


@pytest.mark.parametrize("kind", ["kmsg", "dcgm", "ib"])
def test_huge_lines_are_skipped_in_bounded_time(kind):
    real = {"kmsg": REAL_XID, "dcgm": REAL_DCGM, "ib": REAL_IB}[kind][:5]
    lines = [ln + b"\n" for ln in real + HUGE + real]
    result = parser_for(kind)(iter(lines), OPTIONS)
    assert result.report.read == len(lines)
    assert set(range(len(real) + 1, len(real) + len(HUGE) + 1)) <= set(result.report.skipped)
    alone = parser_for(kind)(iter([ln + b"\n" for ln in real]), OPTIONS).report.parsed
    assert alone > 0 and result.report.parsed == 2 * alone  # the real lines around them still parse


def test_the_file_source_cuts_a_line_that_never_ends(tmp_path):
    from foreshock.ingest.collectors.kmsg import FileSource

    log = tmp_path / "kern.log"
    log.write_bytes(b"x" * 5_000_000 + b"\n" + REAL_XID[0] + b"\n")
    source = FileSource(log)
    lines = []
    for _ in range(5):
        lines += source.read_lines()
    source.close()
    assert len(lines) == 2 and len(lines[0][0]) < 100_000 and lines[1][0].endswith("Multiple Warp Errors")
