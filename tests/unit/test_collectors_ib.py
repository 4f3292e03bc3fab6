"""InfiniBand collector on a sysfs tree rebuilt from a real H100 node (tests/data/collectors/SOURCES.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from foreshock.ingest.collectors import CollectorOptions, CollectorUnavailable, create_collector, parser_for
from foreshock.ingest.collectors.infiniband import InfinibandCollector
from foreshock.ingest.contract import LINK_COUNTERS, Topic, decode, encode

DATA = Path(__file__).parents[1] / "data" / "collectors" / "ib"
TREE = DATA / "sys-class-infiniband"
FLAT = DATA / "sys-class-infiniband-h100.flat.txt"


def _flat_values() -> dict[str, str]:
    out = {}
    for line in FLAT.read_text().splitlines():
        path, _, value = line.partition(": ")
        out[path] = value
    return out


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "infiniband"
    shutil.copytree(TREE, root)
    for f in root.rglob("*"):
        if f.is_file():
            f.chmod(0o644)
    return root


def test_reads_state_rate_and_counters_of_a_real_tree():
    options = CollectorOptions(node="gpu-h100-07", path=TREE, clock=lambda: 5)
    samples = create_collector("ib", options).collect()
    by_port = {s.port: s for s in samples}
    assert sorted(by_port) == ["mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1"]
    hca = by_port["mlx5_1/1"]
    assert (hca.node, hca.ts, hca.kind, hca.state, hca.phys_state, hca.rate_gbps) == \
        ("gpu-h100-07", 5, "ib", "ACTIVE", "LinkUp", 400.0)
    assert (hca.link_downed, hca.port_rcv_errors, hca.excessive_buffer_overrun_errors) == (255, 14, 15)
    assert hca.extra["port_rcv_data"] == 205128687774249 and hca.extra["hw_roce_adp_retrans"] == 3
    assert hca.deltas is None  # first poll: nothing to compare with
    bond = by_port["mlx5_bond_0/1"]
    assert (bond.kind, bond.rate_gbps) == ("eth", 200.0)
    flat = _flat_values()
    for sample in samples:  # every counter equals the real dump's value
        dev = sample.port.split("/")[0]
        for name in LINK_COUNTERS:
            assert getattr(sample, name) == int(flat[f"{dev}/ports/1/counters/{name}"]), (dev, name)
        n_files = sum(1 for p in flat if p.startswith(f"{dev}/ports/1/") and "counters/" in p)
        assert len(LINK_COUNTERS) + len(sample.extra) == n_files
    assert all(decode(Topic.LINK, encode(s)) == [s] for s in samples)


def test_tree_and_flat_dump_give_the_same_samples():
    with open(FLAT, "rb") as f:
        result = parser_for("ib")(f, CollectorOptions(node="n", clock=lambda: 1))
    from_dump = {s.port: s for s in result.records}
    from_tree = InfinibandCollector(TREE, "n", lambda: 1).collect()
    assert len(from_dump) == 9
    for sample in from_tree:
        assert from_dump[sample.port] == sample
    assert result.report.read == 486 and result.report.parsed == 459 and len(result.report.skipped) == 27


def test_deltas_handle_increases_and_resets(tree):
    ticks = iter([1_000, 11_000, 21_000])
    collector = InfinibandCollector(tree, "n", lambda: next(ticks))
    collector.collect()
    counters = tree / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("7\n")                   # 0 -> 7
    (counters / "port_rcv_errors").write_text("2\n")                # 14 -> 2: reset (perfquery -R)
    (counters / "port_xmit_data").write_text(str(230442669431839 + 4096) + "\n")
    (tree / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    (tree / "mlx5_0" / "ports" / "1" / "phys_state").write_text("3: Disabled\n")
    second = {s.port: s for s in collector.collect()}["mlx5_0/1"]
    assert second.deltas["symbol_error"] == 7
    assert second.deltas["port_rcv_errors"] == 2
    assert second.deltas["port_xmit_data"] == 4096
    assert second.deltas["link_downed"] == 0
    assert (second.state, second.phys_state, second.ts) == ("DOWN", "Disabled", 11_000)
    third = {s.port: s for s in collector.collect()}["mlx5_0/1"]
    assert all(v == 0 for v in third.deltas.values())


def test_unreadable_or_odd_counter_files_are_left_out(tree):
    counters = tree / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("N/A\n")
    (counters / "link_downed").unlink()
    [sample] = [s for s in InfinibandCollector(tree, "n", lambda: 1).collect() if s.port == "mlx5_0/1"]
    assert sample.symbol_error is None and sample.link_downed is None and sample.port_rcv_errors == 14


def test_missing_root_is_one_clear_sentence(tmp_path):
    with pytest.raises(CollectorUnavailable, match="does not exist"):
        create_collector("ib", CollectorOptions(node="n", path=tmp_path / "nothing"))
