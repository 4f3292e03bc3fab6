"""A real Prometheus server scrapes a running fleet of Foreshock processes fed through the real broker.

One module-scoped stack: a Kafka broker, an hour of a 12-node cluster with one node at risk
(tests/fixtures/fleet.py), ``foreshock serve`` with a trained model, ``foreshock mitigate
--dry-run`` with a reporting job and spares, a ``foreshock collect --source kmsg`` replaying real
Xid lines for that node, and Debian's Prometheus (127.0.0.1, a temp dir, 1 s scrapes) loading the
rules of deploy/prometheus/ unchanged. The node-at-risk alert must fire for the raised node and
for exactly the nodes the risk service holds in alert (in a fleet this small a node's peer group
holds two other nodes, and a peer z-score over three can put a healthy node over the threshold
on some hours), and every PromQL expression of deploy/grafana/foreshock.json must parse and return
data on this Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from foreshock.ingest.kafka_local import free_port
from tests.fixtures import fleet
from tests.fixtures.fleet import RAISED_NODE, Proc, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "foreshock.json"
XID_LOG = ROOT / "tests" / "data" / "collectors" / "xid" / "xid_lines.txt"
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


class Prometheus:
    """One Prometheus server process and its HTTP API."""

    def __init__(self, tmp: Path, targets: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(r) for r in RULES],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()],
        }
        path = tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [fleet.prometheus_binary("prometheus"), f"--config.file={path}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        wait_for("Prometheus ready", self._ready, 60, explain=lambda: self.log.read_text()[-3000:])

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def api(self, path: str, **params) -> dict:
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, alerting_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus-stack")
    sim = fleet.publish_fleet(kafka_bootstrap)
    job_nodes = [RAISED_NODE, "node0001", "node0002", "node0003"]
    fleet.write_job_status(tmp / "control", "llm-70b", job_nodes, int(time.time() * 1000) - 600_000)
    ports = {"serve": free_port(), "mitigate": free_port(), "collect": free_port()}
    broker = ("--kafka", kafka_bootstrap)
    procs = {
        "serve": Proc(tmp / "serve.log", "serve", *broker, "--model", str(alerting_model_dir),
                      "--port", str(ports["serve"]), "--group", "prom-serve", "--checkpoint-dir",
                      str(tmp / "ckpt"), "--score-every", "1m"),
        "mitigate": Proc(tmp / "mitigate.log", "mitigate", *broker, "--dry-run",
                         "--audit", str(tmp / "audit.sqlite"), "--control-dir", str(tmp / "control"),
                         "--spare", "node0010", "--spare", "node0011", "--fleet-size",
                         str(len(sim.node_names)), "--horizon", "3h", "--group", "prom-mitigate",
                         "--metrics-port", str(ports["mitigate"])),
        # replays real Xid lines of January 2025: the risk service dead-letters them (far behind its log)
        "collect": Proc(tmp / "collect.log", "collect", "--source", "kmsg", "--path", str(XID_LOG),
                        "--node", "node0005", "--interval", "1s", *broker,
                        "--metrics-port", str(ports["collect"])),
    }
    prometheus = None
    try:
        serve = procs["serve"]
        base = f"http://127.0.0.1:{ports['serve']}"
        wait_for("serve to score the raised node first", lambda: _top_node(serve, base) == RAISED_NODE, 150,
                 explain=serve.tail)
        prometheus = Prometheus(tmp, {"foreshock-serve": f"127.0.0.1:{ports['serve']}",
                                      "foreshock-mitigate": f"127.0.0.1:{ports['mitigate']}",
                                      "foreshock-collector": f"127.0.0.1:{ports['collect']}"})
        yield prometheus, procs, base
    finally:
        if prometheus is not None:
            prometheus.stop()
        for p in procs.values():
            p.stop()


def _top_node(serve: Proc, base: str) -> str | None:
    answer = serve.get(f"{base}/v1/nodes?limit=1")
    if answer is None or answer.status_code != 200 or not answer.json()["nodes"]:
        return None
    return answer.json()["nodes"][0]["node"]


def test_every_process_is_scraped(stack):
    prometheus, procs, _ = stack
    targets = wait_for("every target up", lambda: (t := prometheus.api("targets")["activeTargets"])
                       and all(x["health"] == "up" for x in t) and t, 30,
                       explain=lambda: json.dumps(prometheus.api("targets"), indent=1)[:4000])
    jobs = {t["labels"]["job"] for t in targets}
    assert jobs == {"foreshock-serve", "foreshock-mitigate", "foreshock-collector"}


def test_the_node_at_risk_alert_fires_for_the_raised_node_only(stack):
    prometheus, procs, base = stack
    serve = procs["serve"]

    def firing() -> set[str]:
        return {a["labels"]["node"] for a in prometheus.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "ForeshockNodeAtRisk" and a["state"] == "firing"}

    def in_alert() -> set[str]:
        return {n["node"] for n in serve.get(f"{base}/v1/nodes?alert=true").json()["nodes"]}

    def agreed() -> set[str] | None:
        nodes = firing()
        return nodes if RAISED_NODE in nodes and nodes == in_alert() else None

    nodes = wait_for("ForeshockNodeAtRisk firing for the raised node and the service's other alerts",
                     agreed, 150,
                     explain=lambda: json.dumps(prometheus.api("alerts"), indent=1)[:4000] + serve.tail(3000))
    assert len(nodes) < serve.get(f"{base}/v1/nodes").json()["total"] / 2  # not a rule that fires everywhere
    [alert] = [a for a in prometheus.api("alerts")["alerts"]
               if a["labels"]["alertname"] == "ForeshockNodeAtRisk" and a["labels"]["node"] == RAISED_NODE]
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"] == "docs/operations.md#foreshocknodeatrisk"
    probability = serve.get(f"{base}/v1/nodes/{RAISED_NODE}").json()["probability"]
    assert float(alert["value"]) == pytest.approx(probability)


def test_every_dashboard_expression_parses_and_returns_data(stack):
    prometheus, procs, _ = stack
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    concrete = [re.sub(r"\$__\w+", lambda m: GRAFANA_VARIABLES[m.group(0)], e) for e in exprs]
    def empty() -> list[str]:
        return [e for e in concrete if not prometheus.query(e)]

    wait_for("every dashboard query to return data", lambda: not empty(), 60, every=2,
             explain=lambda: "no data:\n" + "\n".join(empty()))


def test_every_recording_rule_returns_data(stack):
    prometheus, _, _ = stack
    recorded = [r["record"] for f in RULES for g in yaml.safe_load(f.read_text())["groups"]
                for r in g["rules"] if "record" in r]
    wait_for("every recording rule to return data", lambda: all(prometheus.query(r) for r in recorded), 30,
             every=2, explain=lambda: "no data: " + str([r for r in recorded if not prometheus.query(r)]))
