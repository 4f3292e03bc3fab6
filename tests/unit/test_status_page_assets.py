"""The status page as the risk service serves it: shipped files, no token, nothing from elsewhere.

What the page does in a browser is tests/e2e/test_status_page.py; here, the service side: ``/``
and its two assets are served from the installed package to a reader without a token, under a
Content-Security-Policy that admits nothing but this service (and the mitigator, when given);
the page names no outside address; every API path its script reads is a GET endpoint of the
app; the mitigator's address reaches the page escaped, and a malformed one is refused.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
from fastapi.testclient import TestClient

from foreshock.features import DEFAULT_FEATURE_SET
from foreshock.ingest.bus import InMemoryBus
from foreshock.predictor.api import create_app, status_page
from foreshock.predictor.engines import OnlineEngines
from foreshock.predictor.model_source import PathModelSource
from foreshock.predictor.service import RiskService

STATIC = resources.files("foreshock.predictor").joinpath("static")


@pytest.fixture(scope="module")
def app(risk_model_dir):
    service = RiskService(InMemoryBus(), OnlineEngines(DEFAULT_FEATURE_SET), PathModelSource(risk_model_dir))
    service.start()
    return create_app(service, token="write-token", mitigator_url="http://mitigator.example:9403/")


def test_the_page_and_its_assets_are_served_from_the_package_without_a_token(app):
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == STATIC.joinpath("index.html").read_text().replace(
        'name="foreshock-mitigator" content=""', 'name="foreshock-mitigator" content="http://mitigator.example:9403"')
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self' http://mitigator.example:9403" in policy
    for name, kind in (("status.js", "text/javascript"), ("status.css", "text/css")):
        asset = client.get(f"/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert asset.content == STATIC.joinpath(name).read_bytes()
    assert client.get("/static/../api.py").status_code == 404
    assert client.get("/static/index.html").status_code == 404
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_the_page_loads_nothing_from_elsewhere():
    for name in ("index.html", "status.js", "status.css"):
        text = STATIC.joinpath(name).read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), name
        assert "@import" not in text and "url(" not in text, name


def test_the_script_reads_only_get_endpoints_of_the_api(app):
    script = STATIC.joinpath("status.js").read_text()
    read = {m.split("?")[0] for m in re.findall(r"""(?:getJSON|fetch)\(\s*[`"']([^`"'$]+)""", script)}
    read |= {"v1/nodes/{node}"} if '"v1/nodes/" + encodeURIComponent' in script else set()
    gets = {route.path.lstrip("/") for route in app.routes if "GET" in getattr(route, "methods", ())}
    assert read == {"readyz", "v1/nodes", "v1/model", "v1/nodes/{node}"}
    assert read <= gets


def test_the_mitigator_address_is_escaped_and_must_be_http():
    page, policy = status_page('http://m:9403/"><script>alert(1)</script>')
    assert b"<script>alert(1)" not in page and b"&quot;&gt;&lt;script&gt;" in page
    for bad in ("javascript:alert(1)", "mitigator:9403", "ftp://m/"):
        with pytest.raises(ValueError, match="http"):
            status_page(bad)
    assert status_page(None)[1].startswith("default-src 'self'; connect-src 'self';")
