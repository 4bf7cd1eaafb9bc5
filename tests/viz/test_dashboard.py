"""``tether viz dashboard``: its HTTP rules, and the page in headless Chromium over a real Prometheus.

The data are the ``lab`` fixture's: a real Prometheus scraping fake proxies
(web serves emoji's requests, web calls emoji over mTLS).  Screenshots go to a
temporary directory (printed, and named by ``VIZ_SCREENSHOTS`` when set) so a
person can look at what the page shows.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether.cli.main import cli
from tether.viz import metrics_api as api
from tether.viz.dashboard.server import Dashboard
from tether.viz.dashboard.views import Views
from viz.browser import CHROMEDRIVER, CHROMIUM, Browser
from viz.promlab import NS, PROMETHEUS, Objects

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus package (dev/setup.sh)")


@pytest.fixture(scope="module")
def dashboard(lab) -> Iterator[Dashboard]:
    prom, objs = lab
    server = Dashboard(Views(prom.client, Objects(objs), api.Mesh(), "30s"), "127.0.0.1", 0)
    server.start()
    yield server
    server.stop()


def _request(d: Dashboard, method: str, path: str, host: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.address[1], timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host or f"localhost:{d.address[1]}")
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_json_views_answer_from_prometheus(dashboard: Dashboard) -> None:
    status, headers, body = _request(dashboard, "GET", f"/api/stat?kind=deployment&namespace={NS}")
    assert status == 200 and headers["Content-Type"] == "application/json"
    rows = {r["name"]: r for r in json.loads(body)["items"]}
    assert rows["web"]["meshed"] == "1/1" and rows["web"]["stats"]["success"] == pytest.approx(10 / 12, rel=0.02)
    status, _, body = _request(dashboard, "GET", f"/api/pods?namespace={NS}")
    pods = {p["deployment"]: p for p in json.loads(body)["items"]}
    assert pods["web"]["meshed"] and pods["web"]["identity"].startswith("web.emojivoto.serviceaccount.")
    status, _, body = _request(dashboard, "GET", "/api/stat?kind=widget")
    assert status == 400 and "kind" in json.loads(body)["error"]


def test_a_foreign_host_header_is_refused(dashboard: Dashboard) -> None:
    """DNS rebinding: evil.example resolved to 127.0.0.1 still sends Host: evil.example."""
    for path in ("/", f"/api/stat?namespace={NS}"):
        status, _, body = _request(dashboard, "GET", path, host="evil.example:50750")
        assert status == 400 and b"host of 'evil.example:50750'" in body and b"denied" in body
    status, _, _ = _request(dashboard, "GET", "/", host="127.0.0.1")
    assert status == 200


def test_nothing_changes_state(dashboard: Dashboard) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, headers, _ = _request(dashboard, method, "/api/stat")
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, _ = _request(dashboard, "GET", "/")
    assert status == 200 and headers["X-Frame-Options"] == "DENY"
    assert "default-src 'self'" in headers["Content-Security-Policy"]


def test_dashboard_command_reports_prometheus_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["viz", "dashboard", "--show", "url"], env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 1 and "tether viz install" in result.output
    bad = CliRunner().invoke(cli, ["viz", "dashboard", "--enforced-host", "(", "--show", "url"],
                             env={"TETHER_HOME": str(tmp_path)})
    assert bad.exit_code == 2 and "--enforced-host" in bad.output


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
def test_the_page_shows_workloads_edges_routes_and_pods(dashboard: Dashboard,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    shots = Path(os.environ.get("VIZ_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    browser = Browser()
    try:
        browser.open(f"{dashboard.url}?namespace={NS}")
        web = browser.wait("web's row with numbers", """
            const row = document.querySelector('#workloads tr[data-name="web"]');
            return row && row.children[2].textContent.endsWith('%') ? [...row.children].map(c => c.textContent) : null;
        """)
        assert web[1] == "1/1" and float(web[2].rstrip("%")) == pytest.approx(100 * 10 / 12, abs=2)
        assert web[8] == "100.00%"  # every request over mTLS
        edge = browser.wait("the web -> emoji edge", """
            const row = document.querySelector('#edges tr[data-name="web"]');
            return row ? [...row.children].map(c => c.textContent) : null;
        """)
        assert edge == ["web", "emoji", "√ mTLS", "web.emojivoto", "emoji.emojivoto"]
        assert browser.script("return document.querySelectorAll('#graph .node').length") == 2
        assert browser.script("return document.querySelectorAll('#graph line').length") == 1
        # Routes of emoji, whose ServiceProfile names GET /list.
        browser.script("const s = document.getElementById('route-target'); s.value = 'emoji';"
                       "s.dispatchEvent(new Event('change'));")
        routes = browser.wait("emoji's routes with numbers", """
            const rows = [...document.querySelectorAll('#routes tbody tr')].map(r => [...r.children].map(c => c.textContent));
            return rows.length && rows[0][2].endsWith('%') ? rows : null;
        """)
        assert [r[0] for r in routes] == ["GET /list", "[DEFAULT]"]
        listed = routes[0]  # as web (emoji's client) sees it: 4 of 5 effective, 4 of 7 tries
        assert float(listed[2].rstrip("%")) == pytest.approx(80, abs=3)
        assert float(listed[7].rstrip("%")) == pytest.approx(400 / 7, abs=3)
        pods = browser.script("return [...document.querySelectorAll('#pods tbody tr')].map("
                              "r => [...r.children].map(c => c.textContent))")
        assert ["web-5d8f7c9b4-abcde", "Running", "yes", "web.emojivoto", "off"] in pods
        path = browser.screenshot(shots / "dashboard.png")
        print(f"screenshot: {path}")
        assert path.stat().st_size > 10_000
    finally:
        browser.close()
