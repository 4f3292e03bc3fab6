"""deploy/prometheus/ and deploy/grafana/ checked by the real promtool and against the code.

promtool (Debian's ``prometheus`` package, installed by ``make test``) checks both scrape
configurations and the rules, and runs the rules' unit tests. The rest ties the files to the
code and the docs: every alert has its annotations, a runbook section that exists, and a firing
and a quiet unit test; every metric the rules and the dashboard name is one a process exports.
(That each dashboard expression returns data is checked against a live Prometheus in
tests/integration/test_prometheus.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from foreshock.ingest.collectors.metrics import CollectorMetrics
from foreshock.ingest.outbox import Outbox
from foreshock.mitigator.metrics import MitigatorMetrics
from foreshock.predictor.metrics import BoardCollector, ServiceMetrics
from tests.fixtures.fleet import prometheus_binary

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = sorted((PROM / "rules").glob("*.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "foreshock.json"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([prometheus_binary("promtool"), *args], cwd=PROM, capture_output=True, text=True,
                          timeout=120)


def rules() -> list[dict]:
    return [r for f in RULES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def alerts() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def rule_exprs() -> list[str]:
    return [r["expr"] for r in rules()]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-kubernetes.yml"])
def test_promtool_accepts_the_scrape_configurations(config):
    done = promtool("check", "config", config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_accepts_the_rules():
    done = promtool("check", "rules", *map(str, RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_alerts_pass():
    done = promtool("test", "rules", "tests/foreshock-alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_says_what_and_links_a_runbook_that_exists():
    sections = anchors((ROOT / "docs" / "operations.md").read_text())
    assert len(alerts()) >= 8
    for alert in alerts():
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], alert["alert"]
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor in sections, (alert["alert"], anchor)
        assert alert["labels"]["severity"] in ("critical", "warning")


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_holds_it_off():
    suite = yaml.safe_load((PROM / "tests" / "foreshock-alerts.test.yml").read_text())
    cases = [c for t in suite["tests"] for c in t.get("alert_rule_test", [])]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"no test fires {alert['alert']}"
        assert any(not c["exp_alerts"] for c in mine), f"no test holds {alert['alert']} off"


def exported_names() -> set[str]:
    """Every sample name the three processes can export (counters with _total, histogram parts)."""
    outbox = Outbox(lambda messages, timeout_s: (len(messages), None), memory_bytes=1)
    registries = [ServiceMetrics().registry, MitigatorMetrics().registry,
                  CollectorMetrics("kmsg", "n", 1.0, outbox=outbox, collector=object()).registry]
    families = [f for r in registries for f in r.collect()] + list(BoardCollector._families())
    names = set()
    for f in families:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(f.type, [""])
        names |= {f.name + s for s in suffixes}
    return names


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_every_metric_named_is_one_a_process_exports(where):
    exprs = rule_exprs() if where == "rules" else dashboard_exprs()
    named = {m for e in exprs for m in re.findall(r"(?<![:\w])foreshock_[a-z_]+(?![:\w])", e)}
    assert named and named <= exported_names(), sorted(named - exported_names())


def test_the_dashboard_is_one_current_grafana_imports():
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 39 and board["uid"] == "foreshock"
    assert [v["type"] for v in board["templating"]["list"]] == ["datasource"]
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert g["x"] + g["w"] <= 24 and not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs)
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
    assert "heatmap" in {p["type"] for p in panels}
