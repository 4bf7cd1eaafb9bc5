"""The demo end to end: the local platform up, emojivoto deployed meshed, traffic through the proxies, purge.

Needs root, iproute2, iptables and setpriv (else skipped).  The platform's
names and ranges are this run's own, in the scheme of ``tests/up`` (so other
runs recognise them as a live run's): prefix ``tu<pid in hex>u``, bridge
``<prefix>br``, pods in ``10.193.<pid>.0/27`` and services in
``10.192.<pid>.0/27``.  The platform is torn down even when the test fails,
and the host is checked for leftovers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.conftest import DEMO_DIR, load_demo
from tether.viz.prometheus import Prometheus
from up import uplab
from viz.browser import CHROMEDRIVER, CHROMIUM, Browser
from viz.promlab import free_port

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "iptables", "setpriv")),
                       reason="needs root, iproute2, iptables and setpriv"),
    pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None, reason="no proxy in the tree"),
]

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[uplab.Platform]:
    uplab.remove_dead_runs()
    before = uplab.Snapshot.take()
    pid = os.getpid()
    p = uplab.Platform(tmp_path / "home", f"tu{pid:x}u", f"10.193.{pid % 256}.0/27", f"10.192.{pid % 256}.0/27",
                       {**os.environ, "TETHER_HOME": str(tmp_path / "home"), "NO_COLOR": "1"})
    try:
        yield p
    finally:
        problems = p.teardown() + before.leftovers(p.prefix)
        assert not problems, "\n".join(problems)


def _inbound_tls_bytes(prom: Prometheus) -> float:
    """Bytes emoji's proxy read on inbound mTLS connections from web, as Prometheus scraped them."""
    samples = prom.query(f'sum(tcp_read_bytes_total{{deployment="emoji", direction="inbound", peer="src", '
                         f'tls="true", client_id="{WEB_ID}"}})')
    return samples[0].value if samples else 0.0


def _dashboard_shows_the_demo_live(p: uplab.Platform) -> None:
    """What a new user does next: `tether viz dashboard`, in headless Chromium: the demo's workloads with the
    proxies' numbers, and the live tap of deploy/web streaming its requests. The screenshot goes to
    $VIZ_SCREENSHOTS or a temporary directory (its path is printed)."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (dev/setup.sh)")
    port = free_port()
    dashboard = subprocess.Popen([uplab.TETHER, "viz", "dashboard", "--show", "url", "--port", str(port)],
                                 env=p.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def answering() -> bool:
            assert dashboard.poll() is None, dashboard.communicate()
            try:
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy for localhost
                with opener.open(f"http://localhost:{port}/", timeout=5) as response:
                    return response.status == 200
            except OSError:
                return False

        uplab.wait_for("the dashboard answering", answering, timeout=30)
        browser = Browser()
        try:
            browser.open(f"http://localhost:{port}/?namespace=emojivoto")
            web = browser.wait("web's row with the proxies' numbers", """
                const row = document.querySelector('#workloads tr[data-name="web"]');
                return row && row.children[2].textContent.endsWith('%') ? [...row.children].map(c => c.textContent) : null;
            """, timeout=60)
            # Meshed; vote-bot's requests arrive over mTLS, while the scrapes of web's admin port by viz's Prometheus,
            # outside the mesh on this platform, are plaintext requests, counted as Linkerd's proxies count them.
            assert web[1] == "1/1" and 50.0 < float(web[8].rstrip("%")) < 100.0, web
            browser.script("document.getElementById('tap-resource').value = 'deploy/web';"
                           "document.getElementById('tap-start').click();")
            lines = browser.wait("the live tap's requests", """
                const lines = document.getElementById('tap').textContent.split('\\n').filter(l => l.startsWith('req '));
                return lines.length >= 3 ? lines : null;
            """, timeout=60)
            assert any("proxy=in" in line and ":path=/api/" in line for line in lines), lines
            shots = Path(os.environ.get("VIZ_SCREENSHOTS") or tempfile.mkdtemp(prefix="demo-dashboard-"))
            shots.mkdir(parents=True, exist_ok=True)
            print(f"screenshot: {browser.screenshot(shots / 'demo-dashboard.png')}")
            browser.script("document.getElementById('tap-stop').click();")
        finally:
            browser.close()
    finally:
        dashboard.send_signal(signal.SIGINT)
        try:
            dashboard.wait(10)
        except subprocess.TimeoutExpired:
            dashboard.kill()
            dashboard.wait()


def test_the_demo_runs_meshed_and_leaves_nothing_behind(platform: uplab.Platform) -> None:
    p = platform
    before = uplab.Snapshot.take()
    p.tether("up", *p.up_args, "--restart-backoff", "0.5")
    port = free_port()
    p.tether("viz", "install", "--prometheus-port", str(port), "--discovery-port", str(free_port()),
             "--scrape-interval", "1s")
    prom = Prometheus(f"http://127.0.0.1:{port}")
    render = load_demo("render")
    p.apply(render.render(sys.executable, str(DEMO_DIR), vote_rate=8))

    def all_ready() -> list[dict] | None:
        pods = p.pods("emojivoto")
        return pods if len(pods) == 4 and all(uplab.ready(x) for x in pods) else None

    pods = {x["metadata"]["labels"]["linkerd.io/proxy-deployment"]: x
            for x in uplab.wait_for("4 ready emojivoto pods", all_ready, timeout=90)}
    assert set(pods) == {"emoji", "voting", "web", "vote-bot"}
    for pod in pods.values():
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["linkerd-init", "linkerd-proxy"]

    # vote-bot -> web -> emoji: the emoji pod's proxy reads more and more bytes on mTLS connections from web.
    first = uplab.wait_for("mTLS traffic from web at emoji's proxy", lambda: _inbound_tls_bytes(prom), timeout=45)
    uplab.wait_for("more mTLS traffic from web at emoji's proxy", lambda: _inbound_tls_bytes(prom) > first,
                   timeout=30)

    bot = pods["vote-bot"]["metadata"]["name"]
    tally = uplab.wait_for("a tally from vote-bot",
                           lambda: [line for line in p.logs("emojivoto", bot).splitlines()
                                    if " requests in " in line], timeout=20)
    assert " 0 ok" not in tally[-1], tally

    # viz sees every workload meshed and every edge over mTLS.
    checks = load_demo("checks")

    def problems() -> list[str]:
        rows = json.loads(p.tether("viz", "stat", "deploy", "-n", "emojivoto", "-o", "json", "-t", "30s").stdout)
        edges = json.loads(p.tether("viz", "edges", "deploy", "-n", "emojivoto", "-o", "json").stdout)
        return checks.traffic(rows, edges)

    uplab.wait_for("every edge over mTLS in viz", lambda: not problems(), timeout=30)
    rows = {r["name"]: r for r in json.loads(p.tether("stat", "deploy", "-n", "emojivoto", "-o", "json",
                                                      "-t", "30s").stdout)}  # the alias
    assert rows["emoji"]["stats"]["tcp_read_bytes"] > 0
    assert 0.5 < rows["web"]["stats"]["success"] <= 1.0
    # The doughnut votes fail on purpose: once vote-bot has seen a 500, web's proxy has counted it.
    uplab.wait_for("a failed vote", lambda: "(500:" in p.logs("emojivoto", bot), timeout=30)
    uplab.wait_for("web's 500s in Prometheus", lambda: prom.query(
        'sum(response_total{deployment="web", direction="inbound", classification="failure", status_code="500"}) > 0'),
        timeout=30)

    # Tap (the pods were created with viz installed, so the tap injector enabled it): web's proxy streams the
    # votes it receives from vote-bot, over mTLS, each with its response.
    # Only /api/ (web's own calls out, to emoji and voting, are gRPC paths: a tap opened while one request is in
    # flight would otherwise start with them).
    lines = uplab.tap_lines(p, "deploy/web", "-n", "emojivoto", "--path", "/api/", want=6)
    req = next(line for line in lines if line.startswith("req "))
    assert "proxy=in" in req and "tls=true" in req and ":path=/api/" in req, lines
    assert " src=0.0.0.0:0 " not in req and " src=" in req, lines  # the client's real address
    assert any(line.startswith("rsp ") for line in lines), lines

    _dashboard_shows_the_demo_live(p)

    # Purge: nothing of this platform is left on the host.
    p.tether("down", "--purge")
    problems = before.leftovers(p.prefix)
    assert not problems, "\n".join(problems)
    assert not any(n.startswith(p.prefix) for n in uplab.netns_names() | uplab.link_names())
