"""dcgm-exporter scraper on real scrapes (tests/data/collectors/SOURCES.md)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from foreshock.ingest.collectors import CollectorOptions, create_collector, parser_for
from foreshock.ingest.collectors.dcgm import DcgmExporterCollector, parse_exposition
from foreshock.ingest.contract import GPU_FIELDS, Topic, decode, encode

DATA = Path(__file__).parents[1] / "data" / "collectors" / "dcgm"
SCRAPES = sorted(DATA.glob("*.prom"))


def _sample_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_real_l4_scrape_maps_onto_the_contract():
    result = parse_exposition((DATA / "cncf-kops-L4.prom").read_bytes(), node=None, ts=7)
    [gpu] = result.records
    assert (gpu.node, gpu.ts, gpu.gpu) == ("i-030791dc5a37cd257", 7, 0)
    assert gpu.uuid == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert (gpu.pci_bus_id, gpu.model_name) == ("0000:31:00.0", "NVIDIA L4")
    assert (gpu.sm_clock, gpu.mem_clock, gpu.gpu_temp, gpu.memory_temp) == (210.0, 405.0, 31.0, 0.0)
    assert gpu.power_usage == pytest.approx(16.365)
    assert (gpu.fb_free, gpu.fb_used) == (22563.0, 0.0)
    assert (gpu.total_energy_consumption, gpu.pcie_replay_counter) == (4742776, 0)
    assert (gpu.correctable_remapped_rows, gpu.uncorrectable_remapped_rows,
            gpu.row_remap_failure) == (0, 0, 0)
    assert isinstance(gpu.total_energy_consumption, int)
    # series the contract has no field for are kept, not dropped
    assert gpu.extra["fb_reserved"] == 470.0 and gpu.extra["prof_pcie_tx_bytes"] == 112603.0
    assert gpu.ecc_dbe_vol_total is None  # not in the scrape: left out, not faked
    assert decode(Topic.GPU, encode(gpu)) == [gpu]
    assert result.report.parsed == 23 and not result.report.skipped


@pytest.mark.parametrize("path", SCRAPES, ids=lambda p: p.name)
def test_every_series_of_every_real_scrape_lands_in_a_field_or_extra(path):
    result = parse_exposition(path.read_bytes(), node=None, ts=1)
    lines = _sample_lines(path)
    assert result.report.parsed == len(lines) and result.report.skipped == []
    assert result.report.read == len(path.read_text().splitlines())
    [gpu] = result.records  # every capture here is a one-GPU node
    filled = [f for f in GPU_FIELDS if getattr(gpu, f) is not None]
    assert len(filled) + len(gpu.extra or {}) == len(lines)
    for line in lines:  # each series' value is where its name says it is
        name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
        field = name.removeprefix("DCGM_FI_DEV_").lower()
        got = getattr(gpu, field) if field in GPU_FIELDS else gpu.extra[name.removeprefix("DCGM_FI_DEV_")
                                                                           .removeprefix("DCGM_FI_").lower()]
        assert got == pytest.approx(value), name


def test_second_scrape_of_the_same_gpu_has_later_values():
    first = parse_exposition((DATA / "cncf-kops-L4.prom").read_bytes(), node="n", ts=1).records[0]
    second = parse_exposition((DATA / "cncf-kops-L4.scrape2.prom").read_bytes(), node="n", ts=2).records[0]
    assert first.uuid == second.uuid and first.node == second.node == "n"
    assert second.total_energy_consumption >= first.total_energy_consumption


def test_unknown_series_mig_labels_and_malformed_lines():
    text = (
        "# HELP DCGM_FI_DEV_GPU_TEMP x\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",Hostname="h"} 40\n'
        "this is not exposition format\n"
        'DCGM_FI_DEV_XID_ERRORS{gpu="1",GPU_I_ID="2",GPU_I_PROFILE="1g.10gb"} 79\n'
        'DCGM_EXP_XID_ERRORS_COUNT{gpu="1",xid="79",window_size_in_ms="300000"} 3\n'
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="1",pod="trainer-0",namespace="ml"} 4\n'
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} NaN\n'
        'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-b"} 50\n'
        'my_own_metric{gpu="1"} 5\n'
    )
    result = parse_exposition(text, node=None, ts=1)
    [gpu] = result.records
    assert (gpu.gpu, gpu.node, gpu.pci_bus_id, gpu.gpu_temp) == (1, "h", "0000:3b:00.0", 40.0)
    assert gpu.clocks_event_reasons == 4 and gpu.xid_errors is None and gpu.ecc_dbe_vol_total is None
    assert gpu.extra == {"xid_errors[GPU_I_ID=2,GPU_I_PROFILE=1g.10gb]": 79.0,
                         "dcgm_exp_xid_errors_count[xid=79]": 3.0, "my_own_metric": 5.0}
    assert result.report.skipped == [3, 8]  # garbage; a series without a gpu label
    assert result.report.parsed == 6


def test_collector_with_injected_fetch_and_clock():
    body = (DATA / "cncf-rafay-T4.prom").read_bytes()
    calls = []

    def fetch(url: str, timeout_s: float) -> bytes:
        calls.append(url)
        if len(calls) == 2:
            raise ConnectionRefusedError("exporter restarting")
        return body

    collector = create_collector("dcgm", CollectorOptions(node="node0007", url="http://x:9400/metrics",
                                                          clock=lambda: 99, fetch=fetch))
    assert isinstance(collector, DcgmExporterCollector)
    [gpu] = collector.collect()
    assert (gpu.node, gpu.ts, gpu.model_name) == ("node0007", 99, "Tesla T4")
    assert collector.collect() == [] and collector.failures == 1
    assert len(collector.collect()) == 1 and calls == ["http://x:9400/metrics"] * 3


def test_collector_scrapes_a_real_http_endpoint():
    body = (DATA / "cncf-upcloud-L40S.prom").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        [gpu] = create_collector("dcgm", CollectorOptions(node="n", url=url, clock=lambda: 5)).collect()
        assert gpu.model_name and "L40S" in gpu.model_name and gpu.gpu_temp is not None
    finally:
        server.shutdown()
        server.server_close()


def test_file_parser_takes_hostname_unless_a_node_is_given():
    with open(DATA / "cncf-ericsson-T4.prom", "rb") as f:
        from_label = parser_for("dcgm")(f, CollectorOptions(node="", clock=lambda: 1)).records[0]
    with open(DATA / "cncf-ericsson-T4.prom", "rb") as f:
        imposed = parser_for("dcgm")(f, CollectorOptions(node="node0001", clock=lambda: 1)).records[0]
    assert from_label.node == "cp-bm14r7" and imposed.node == "node0001"
    assert from_label.gpu_util == 91.0  # the file without HELP/TYPE lines parses too
