"""Every long-running process's Prometheus metrics, read back through prometheus_client's own parser.

The risk service's per-node gauges against its API, the mitigator's spares, audit failures and job
figures against what its engine and audit log hold, and the collectors' counts against real
captures (kernel log, dcgm-exporter scrape) polled through the real collectors.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from foreshock.cli import app
from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.ingest.collectors import CollectorOptions, create_collector
from foreshock.ingest.collectors.metrics import CollectorMetrics
from foreshock.ingest.contract import GpuSample, Topic
from foreshock.ingest.kafka_local import free_port
from foreshock.ingest.outbox import Outbox
from foreshock.ingest.simulator import stream
from foreshock.mitigator.endpoint import RECENT_ACTIONS, StatusServer
from foreshock.predictor.api import create_app
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.service import RiskService, ServiceConfig
from tests.fixtures.predictor import simulator
from tests.unit.test_mitigator_policy import MIN, T0, feed, job, rig, risk

DATA = Path(__file__).parents[1] / "data" / "collectors"


def samples(text: str | bytes) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    text = text.decode() if isinstance(text, bytes) else text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def by_label(found: dict, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in found.items() if n == name}


# --- the risk service ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scored(risk_model_dir) -> tuple[RiskService, TestClient]:
    service = RiskService(InMemoryBus(partitions=2), OnlineEngines(DEFAULT_FEATURE_SET),
                          PathModelSource(risk_model_dir),
                          config=ServiceConfig(score_every_ms=5 * MIN)).start()
    client = TestClient(create_app(service, token=None))
    stream(simulator(minutes=25), service.bus)
    for _ in range(50):
        service.run_once()
    return service, client


def test_every_scored_node_is_a_probability_and_an_alert_series(scored):
    service, client = scored
    nodes = client.get("/v1/nodes", params={"limit": 1000}).json()["nodes"]
    assert len(nodes) >= 10
    found = samples(client.get("/metrics").text)
    assert by_label(found, "foreshock_node_failure_probability", "node") == {
        n["node"]: n["probability"] for n in nodes}
    assert by_label(found, "foreshock_node_alert", "node") == {n["node"]: float(n["alert"]) for n in nodes}
    assert found[("foreshock_predictor_model_threshold", ())] == service.model.threshold
    trained_ms = service.model.metrics["training"]["trained_at_ms"]  # the model card says when
    assert found[("foreshock_predictor_model_trained_timestamp_seconds", ())] == trained_ms / 1000
    assert time.time() - 86_400 < trained_ms / 1000 <= time.time()


def test_a_node_whose_partition_moved_away_stops_being_exported(scored):
    service, client = scored
    gone = service.board.latest()[-1].node
    kept = service.board.export([gone])
    service.board.forget([gone])
    try:
        found = samples(client.get("/metrics").text)
        assert gone not in by_label(found, "foreshock_node_failure_probability", "node")
        assert gone not in by_label(found, "foreshock_node_alert", "node")
    finally:
        service.board.restore(kept)


def test_a_second_app_over_the_same_service_does_not_export_twice(scored):
    service, client = scored
    TestClient(create_app(service, token=None))  # would raise "Duplicated timeseries" if registered twice
    text = client.get("/metrics").text
    assert text.count("# TYPE foreshock_node_failure_probability gauge") == 1


# --- the mitigator -------------------------------------------------------------------------------

def test_mitigator_spares_jobs_and_actions(tmp_path):
    llm = job("llm", ["n1", "n2", "n3", "n4"], last_ckpt_ms=T0 - 10 * MIN)
    service, _, _ = rig(tmp_path, [llm], spare_nodes=("spare0", "spare1"))
    found = samples(service.render_metrics())
    assert found[("foreshock_mitigator_spares", ())] == 2
    assert found[("foreshock_mitigator_spares_free", ())] == 2
    assert found[("foreshock_mitigator_jobs", ())] == 1 and found[("foreshock_mitigator_job_gpus", ())] == 32
    assert found[("foreshock_mitigator_unsaved_work_gpu_seconds", ())] == 32 * 600
    outcomes = feed(service, [risk("n1", i, p) for i, p in enumerate([0.1, 0.5, 0.9, 0.95])])
    assert [o.action.kind for o in outcomes] == ["migrate", "drain"]
    found = samples(service.render_metrics())
    assert found[("foreshock_mitigator_spares_free", ())] == 1  # spare0 is promised to n1's migration
    actions = {(dict(k)["action"], dict(k)["status"]): v for (n, k), v in found.items()
               if n == "foreshock_mitigator_actions_total"}
    assert actions == {("migrate", "succeeded"): 1, ("drain", "succeeded"): 1}
    assert by_label(found, "foreshock_mitigator_nodes", "state")["drained"] == 1
    assert found[("foreshock_mitigator_breaker_open", ())] == 0


def test_mitigator_counts_each_failed_audit_write(tmp_path):
    service, _, _ = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    assert samples(service.render_metrics())[("foreshock_mitigator_audit_write_failures_total", ())] == 0
    audit = service.executor.audit
    audit._db.execute("PRAGMA query_only = ON")  # the real SQLite refusing writes, as a read-only volume does
    feed(service, [risk("n1", i, 0.95) for i in range(3)])
    assert service.paused is not None
    failed = samples(service.render_metrics())[("foreshock_mitigator_audit_write_failures_total", ())]
    assert failed == audit.write_failures >= 1
    assert samples(service.render_metrics())[("foreshock_mitigator_paused", ())] == 1


# --- the collectors ------------------------------------------------------------------------------

def test_kernel_log_collector_counts_xids_by_code_and_records_by_topic():
    log = DATA / "xid" / "dmesg-xid48-63-94-sequence.log"
    collector = create_collector("kmsg", CollectorOptions(node="node0042", path=log))
    metrics = CollectorMetrics("kmsg", "node0042", 10.0, collector=collector, clock=lambda: 1234.5)
    records = collector.collect() + collector.drain()
    metrics.polled(records)
    found = samples(metrics.render())
    assert by_label(found, "foreshock_collector_xid_events_total", "xid") == {"48": 1, "63": 1, "94": 9}
    assert by_label(found, "foreshock_collector_records_published_total", "topic") == {Topic.XID: 11}
    assert found[("foreshock_collector_last_success_timestamp_seconds", ())] == 1234.5
    assert found[("foreshock_collector_interval_seconds", ())] == 10
    assert found[("foreshock_collector_info", (("node", "node0042"), ("source", "kmsg")))] == 1
    assert found[("foreshock_collector_parse_errors_total", ())] == 0


def test_kernel_log_collector_counts_an_xid_line_it_cannot_read(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 999999999, pid=1, name=x, too large a code\n"
                   "an ordinary kernel line\n")
    collector = create_collector("kmsg", CollectorOptions(node="n", path=log))
    metrics = CollectorMetrics("kmsg", "n", 10.0, collector=collector)
    metrics.polled(collector.collect())
    assert samples(metrics.render())[("foreshock_collector_parse_errors_total", ())] == 1


def test_dcgm_collector_failures_hold_back_the_last_success_and_bad_lines_count():
    scrape = (DATA / "dcgm" / "cncf-upcloud-L40S.prom").read_bytes()
    bodies = [OSError("connection refused"), scrape + b"DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} not-a-number\n"]

    def fetch(url: str, timeout_s: float) -> bytes:
        body = bodies.pop(0)
        if isinstance(body, Exception):
            raise body
        return body

    now = iter([100.0, 200.0])
    collector = create_collector("dcgm", CollectorOptions(node="n1", url="http://127.0.0.1:9/metrics",
                                                          fetch=fetch))
    metrics = CollectorMetrics("dcgm", "n1", 10.0, collector=collector, clock=lambda: next(now))
    metrics.polled(collector.collect())
    found = samples(metrics.render())
    assert found[("foreshock_collector_read_errors_total", ())] == 1
    assert found[("foreshock_collector_last_success_timestamp_seconds", ())] == 0  # never read yet
    records = collector.collect()
    metrics.polled(records)
    found = samples(metrics.render())
    assert all(isinstance(r, GpuSample) for r in records) and records
    assert found[("foreshock_collector_last_success_timestamp_seconds", ())] == 100.0  # clock's first answer
    assert found[("foreshock_collector_parse_errors_total", ())] == 1
    published = by_label(found, "foreshock_collector_records_published_total", "topic")
    assert published == {Topic.GPU: len(records)}


def test_outbox_backlog_while_the_broker_is_unreachable():
    def unreachable(messages, timeout_s):
        return 0, ConnectionError("broker down")

    outbox = Outbox(unreachable, memory_bytes=1 << 20)
    metrics = CollectorMetrics("ib", "n", 10.0, outbox=outbox)
    outbox.put([(Topic.LINK, "n", b"[]")] * 3, 7)
    found = samples(metrics.render())
    assert found[("foreshock_collector_buffered_records", ())] == 7
    assert found[("foreshock_collector_records_delivered_total", ())] == 0
    assert found[("foreshock_collector_records_dropped_total", ())] == 0


def test_collect_serves_its_metrics_while_it_runs(tmp_path):
    port = free_port()
    tree = DATA / "ib" / "sys-class-infiniband"
    proc = subprocess.Popen([sys.executable, "-m", "foreshock", "collect", "--source", "ib",
                             "--path", str(tree), "--node", "node0001", "--interval", "200ms", "--stdout",
                             "--metrics-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        found: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and found.get(("foreshock_collector_polls_total", ()), 0) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text)
            except httpx.TransportError:
                time.sleep(0.2)
        assert found[("foreshock_collector_polls_total", ())] >= 2
        assert by_label(found, "foreshock_collector_records_published_total", "topic")[Topic.LINK] >= 6
        assert found[("foreshock_collector_last_success_timestamp_seconds", ())] > time.time() - 60
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0


def test_collect_refuses_a_metrics_port_it_cannot_bind():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        tree = str(DATA / "ib" / "sys-class-infiniband")
        result = CliRunner().invoke(app, ["collect", "--source", "ib", "--path", tree, "--node", "n",
                                          "--stdout", "--polls", "1",
                                          "--metrics-port", str(taken.getsockname()[1])])
    assert result.exit_code == 1 and "cannot serve /metrics" in result.stderr


def test_mitigator_status_lists_the_newest_audit_rows_to_any_origin(tmp_path):
    service, _, _ = rig(tmp_path, [job("llm", ["n1", "n2", "n3", "n4"])])
    feed(service, [risk(f"n{k}", i, p) for k in range(1, 9) for i, p in enumerate([0.5, 0.9, 0.95])])
    trail = service.executor.audit.events()
    assert len(trail) > RECENT_ACTIONS
    server = StatusServer(service).start()
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/status", headers={"Origin": "http://risk:8080"})
    finally:
        server.stop()
    assert answer.headers["access-control-allow-origin"] == "*"
    recent = answer.json()["recent_actions"]
    assert recent == [msgspec.to_builtins(e) for e in trail[-RECENT_ACTIONS:]]
    assert recent[-1]["action_id"] == trail[-1].action_id  # newest last
