"""The risk service's status page driven in headless Chromium, against a fleet fed through the real broker.

A Kafka broker, an hour of a 12-node cluster with one node at risk (tests/fixtures/fleet.py),
``foreshock serve`` with a trained model and an API token, and ``foreshock mitigate --dry-run``
whose /status the page reads (``--mitigator-url``). Debian's Chromium and ChromeDriver
(``scripts/install-services.sh``) load the page without a token: the raised node is listed first,
in alert, with its top features; the model card and the mitigator's last actions are filled in;
clicking the node opens its detail; the browser logs no error (the page loads nothing from
elsewhere: its Content-Security-Policy would refuse it); the page refreshes on its own. The
screenshot is kept in the test's temp folder (its path is printed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from foreshock.ingest.kafka_local import free_port
from tests.fixtures import fleet
from tests.fixtures.fleet import RAISED_NODE, Proc, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip("chromium/chromium-driver missing and scripts/install-services.sh needs root and apt")
        subprocess.run(["bash", str(ROOT / "scripts" / "install-services.sh")], check=True, timeout=900)
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,1100",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(kafka_bootstrap, alerting_model_dir, tmp_path_factory):
    """The status page's address, once the raised node is scored and the mitigator has acted on it."""
    tmp = tmp_path_factory.mktemp("status-page")
    fleet.publish_fleet(kafka_bootstrap)
    fleet.write_job_status(tmp / "control", "llm-70b", [RAISED_NODE, "node0001", "node0002", "node0003"],
                           int(time.time() * 1000) - 600_000)
    serve_port, mitigate_port = free_port(), free_port()
    mitigator = f"http://127.0.0.1:{mitigate_port}"
    procs = [
        Proc(tmp / "mitigate.log", "mitigate", "--kafka", kafka_bootstrap, "--dry-run", "--audit",
             str(tmp / "audit.sqlite"), "--control-dir", str(tmp / "control"), "--spare", "node0011",
             "--fleet-size", "12", "--breaker-share", "0.5", "--horizon", "3h", "--group", "page-mitigate",
             "--metrics-port", str(mitigate_port)),
        Proc(tmp / "serve.log", "serve", "--kafka", kafka_bootstrap, "--model", str(alerting_model_dir),
             "--port", str(serve_port), "--group", "page-serve", "--checkpoint-dir", str(tmp / "ckpt"),
             "--score-every", "1m", "--mitigator-url", mitigator, env={"FORESHOCK_API_TOKEN": "a-token"}),
    ]
    mitigate, serve = procs
    base = f"http://127.0.0.1:{serve_port}"
    try:
        def first() -> str | None:
            answer = serve.get(f"{base}/v1/nodes?limit=1")
            return answer.json()["nodes"][0]["node"] if answer and answer.json().get("nodes") else None

        def ranking() -> str:
            answer = serve.get(f"{base}/v1/nodes?limit=4")
            return f"{serve.tail()}\n/v1/nodes?limit=4: {answer.text[:3000] if answer else 'no answer'}"

        wait_for("the raised node scored first", lambda: first() == RAISED_NODE, 150, explain=ranking)
        wait_for("the mitigator's first actions", lambda: (r := mitigate.get(f"{mitigator}/status"))
                 and r.json()["recent_actions"], 60, explain=mitigate.tail)
        yield base
    finally:
        for p in procs:
            p.stop()


def text(driver, css: str) -> str:
    return driver.find_element("css selector", css).text


def test_the_raised_node_is_listed_first_and_its_detail_opens(page, browser, tmp_path):
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(page + "/")
    wait = WebDriverWait(browser, 30)
    rows = wait.until(lambda d: d.find_elements("css selector", "#nodes tbody tr[data-node]"))
    assert len(rows) == 12
    first = rows[0]
    assert first.get_attribute("data-node") == RAISED_NODE
    assert "alert" in first.get_attribute("class") and first.find_element("css selector", ".badge.alert")
    wait.until(lambda d: d.find_elements("css selector", "#nodes tbody tr:first-child .trend polyline"))

    def counts_the_services_alerts(driver) -> bool:  # a 12-node fleet's peer groups hold 1-3 nodes,
        # and a peer z-score over three can put a healthy node in alert on some hours
        in_alert = [n["node"] for n in httpx.get(f"{page}/v1/nodes?alert=true", timeout=5).json()["nodes"]]
        return RAISED_NODE in in_alert and text(driver, "#alert-count") == str(len(in_alert))

    wait.until(counts_the_services_alerts)
    assert int(text(browser, "#alert-count")) < 6
    alerting = browser.find_element("css selector", f'#alerts .alert-node[data-node="{RAISED_NODE}"]')
    features = alerting.find_elements("css selector", "tbody tr")
    assert len(features) == 5 and all(f.text.strip() for f in features)
    assert text(browser, "#model-threshold").endswith("%") and len(text(browser, "#model-hash")) == 12
    assert "trained" in text(browser, "#model-age") and text(browser, "#model-horizon") == "60 min"
    assert text(browser, "#ready") == "ready"
    actions = wait.until(lambda d: d.find_elements("css selector", "#actions-table tbody tr"))
    assert any(RAISED_NODE in a.text for a in actions) and "breaker closed" in text(browser, "#breaker")

    first.click()
    wait.until(lambda d: d.find_element("css selector", "#detail").is_displayed()
               and text(d, "#detail-node") == RAISED_NODE)
    wait.until(lambda d: len(d.find_elements("css selector", "#detail-features tbody tr")) == 5)
    assert "IN ALERT" in text(browser, "#detail-summary")
    assert browser.find_elements("css selector", "#detail-history polyline")
    assert browser.current_url.endswith(f"#node={RAISED_NODE}")

    shot = tmp_path / "status-page.png"
    browser.set_window_size(1366, browser.execute_script("return document.body.scrollHeight") + 40)
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 20_000
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_the_page_refreshes_on_its_own(page, browser):
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(page + "/?refresh=2")
    wait = WebDriverWait(browser, 30)
    stamp = wait.until(lambda d: text(d, "#updated"))
    browser.execute_script("document.querySelector('#nodes tbody').replaceChildren()")  # a redraw refills it
    wait.until(lambda d: text(d, "#updated") != stamp and d.find_elements("css selector", "#nodes tbody tr"))
    assert text(browser, "#period") == "2"
