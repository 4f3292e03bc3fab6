"""Parse throughput of the collectors: kernel-log Xid lines/s and dcgm-exporter scrapes/s.

Inputs are the real captures under tests/data/collectors (see SOURCES.md there):
- Xid lines: the 88 real Xid lines, cycled; and a realistic kernel log where one line in ten is
  an Xid and the rest are the real non-Xid lines of a captured dmesg.
- dcgm-exporter: a real one-GPU L4 scrape, and an eight-GPU scrape made by repeating its series
  for gpu="0".."7" (the size of one H100 node's scrape).

Baselines measured in the same run:
- Xid: a naive per-line parser (one general regex searched over every line, then splitting and
  ``int()`` in try/except and ``datetime.strptime`` for the timestamp), the way a quick script
  would do it.
- dcgm: prometheus_client's parser alone on the whole scrape (no mapping onto the contract). Our
  scraper runs the same parser but hands it only the sample lines (HELP/TYPE lines carry nothing
  it needs), which is why it can beat its own parser on a scrape that is two-thirds comments.

Run: ``.venv/bin/python benchmarks/bench_parse.py [--quick]``.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from foreshock.ingest.collectors.dcgm import parse_exposition
from foreshock.ingest.collectors.kernel_log import KernelLineParser
from foreshock.ingest.collectors.xid_policy import load_xid_policy

DATA = Path(__file__).parents[1] / "tests" / "data" / "collectors"
_NAIVE = re.compile(r"NVRM: Xid \((.*?)\): (\d+), (.*)")


def naive_parse(line: str) -> dict | None:
    """The baseline: what a quick per-line script does (search everything, exceptions for control)."""
    m = re.search(_NAIVE.pattern, line)
    if not m:
        return None
    try:
        xid = int(m.group(2))
    except ValueError:
        return None
    rest = m.group(3)
    pid = None
    try:
        pid = int(rest.split("pid=")[1].split(",")[0])
    except (IndexError, ValueError):
        pass
    ts = None
    try:
        ts = datetime.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        try:
            ts = datetime.strptime(line[1:25], "%a %b %d %H:%M:%S %Y")
        except ValueError:
            pass
    return {"xid": xid, "bus": m.group(1), "pid": pid, "message": rest, "ts": ts}


def _rate(fn: Callable[[], int], min_seconds: float) -> float:
    """Items per second of ``fn`` (which returns how many items it handled), repeated >= min_seconds."""
    fn()  # warm up
    items, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds:
        items += fn()
    return items / elapsed


def _count(parse: Callable[[str], object], lines: list[str]) -> int:
    """Parse every line; returns the number of lines handled (the records are discarded)."""
    for line in lines:
        parse(line)
    return len(lines)


def bench_xid(n_lines: int, seconds: float) -> None:
    xid_lines = (DATA / "xid" / "xid_lines.txt").read_text().splitlines()
    noise = [ln for ln in (DATA / "xid" / "dmesg-xid48-63-94-sequence.log").read_text().splitlines()
             if "Xid" not in ln] + [ln for ln in (DATA / "xid" / "xid_dmesg-with-xid-119.log").read_text()
                                    .splitlines() if "Xid" not in ln]
    all_xid = [xid_lines[i % len(xid_lines)] for i in range(n_lines)]
    mixed = [xid_lines[i % len(xid_lines)] if i % 10 == 0 else noise[i % len(noise)] for i in range(n_lines)]
    parser = KernelLineParser("node0000", load_xid_policy(), {}, lambda: 0)
    for label, lines in (("all Xid lines", all_xid), ("1 in 10 lines an Xid", mixed)):
        ours = _rate(lambda lines=lines: _count(parser.parse, lines), seconds)
        naive = _rate(lambda lines=lines: _count(naive_parse, lines), seconds)
        print(f"kernel log, {label:22s}: foreshock {ours:12,.0f} lines/s   naive per-line {naive:12,.0f} "
              f"lines/s   ratio {ours / naive:5.2f}x")


def _eight_gpu(scrape: str) -> str:
    out = []
    for line in scrape.splitlines():
        if line.startswith("#") or 'gpu="0"' not in line:
            out.append(line)
            continue
        out.extend(line.replace('gpu="0"', f'gpu="{g}"').replace('device="nvidia0"', f'device="nvidia{g}"')
                   for g in range(8))
    return "\n".join(out) + "\n"


def bench_dcgm(seconds: float) -> None:
    one = (DATA / "dcgm" / "cncf-kops-L4.prom").read_text()
    for label, text in (("1 GPU (real L4)", one), ("8 GPUs (L4 x 8)", _eight_gpu(one))):
        data = text.encode()
        n_series = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        ours = _rate(lambda data=data: len(parse_exposition(data, node="n", ts=0).records) and 1, seconds)
        floor = _rate(lambda text=text: sum(len(f.samples) for f in text_string_to_metric_families(text))
                      and 1, seconds)
        print(f"dcgm-exporter, {label:16s}: foreshock {ours:9,.0f} scrapes/s ({ours * n_series:10,.0f} "
              f"series/s)   prometheus_client parser alone {floor:9,.0f} scrapes/s   "
              f"ratio {ours / floor:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small inputs, short timings")
    args = parser.parse_args()
    n_lines, seconds = (2_000, 0.2) if args.quick else (50_000, 3.0)
    mode = "quick" if args.quick else "full"
    print(f"bench_parse ({mode}): {n_lines} lines per pass, >= {seconds}s per figure")
    bench_xid(n_lines, seconds)
    bench_dcgm(seconds)


if __name__ == "__main__":
    main()
