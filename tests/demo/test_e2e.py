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
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from demo.conftest import DEMO_DIR
from tether.viz.exposition import parse
from tether.viz.scrape import fetch
from up import uplab

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "iptables", "setpriv")),
                       reason="needs root, iproute2, iptables and setpriv"),
    pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None, reason="no proxy in the tree"),
]

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tether_demo_{name}", DEMO_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        p.teardown()
        problems = before.leftovers(p.prefix)
        assert not problems, "\n".join(problems)


def _inbound_tls_bytes(ip: str) -> float:
    """Bytes the pod's proxy read on inbound mTLS connections from web (tcp_read_bytes_total, peer="src")."""
    total = 0.0
    for s in parse(fetch(ip, timeout=5)).named("tcp_read_bytes_total"):
        labels = s.labels
        if (labels.get("direction"), labels.get("peer"), labels.get("tls"), labels.get("client_id")) == (
                "inbound", "src", "true", WEB_ID):
            total += s.value
    return total


def test_the_demo_runs_meshed_and_leaves_nothing_behind(platform: uplab.Platform) -> None:
    p = platform
    before = uplab.Snapshot.take()
    p.tether("up", *p.up_args, "--restart-backoff", "0.5")
    render = _load("render")
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
    emoji_ip = pods["emoji"]["status"]["podIP"]
    first = uplab.wait_for("mTLS traffic from web at emoji's proxy", lambda: _inbound_tls_bytes(emoji_ip),
                           timeout=30)
    uplab.wait_for("more mTLS traffic from web at emoji's proxy", lambda: _inbound_tls_bytes(emoji_ip) > first,
                   timeout=30)

    bot = pods["vote-bot"]["metadata"]["name"]
    tally = uplab.wait_for("a tally from vote-bot",
                           lambda: [line for line in p.tether("logs", "-n", "emojivoto", bot).stdout.splitlines()
                                    if " requests in " in line], timeout=20)
    assert " 0 ok" not in tally[-1], tally

    # tether stat sees every workload meshed and every edge over mTLS.
    result = p.tether("stat", "deploy", "-n", "emojivoto", "-o", "json", "-t", "2s")
    rows = json.loads(result.stdout)
    problems = _load("checks").traffic(rows)
    assert not problems, (problems, rows)
    by_name = {r["name"]: r for r in rows}
    assert by_name["emoji"]["tcp_read_bytes_rate"] > 0
    if by_name["web"]["rps"] is not None:  # once the proxy exports request metrics
        assert 0.5 < by_name["web"]["success"] <= 1.0  # HTTP/1 per request; gRPC (HTTP/2) is still per connection
        # The doughnut votes fail on purpose: once vote-bot has seen a 500, web's proxy has counted it.
        uplab.wait_for("a failed vote", lambda: "(500:" in p.tether("logs", "-n", "emojivoto", bot).stdout,
                       timeout=30)
        web_ip = pods["web"]["status"]["podIP"]
        failures = [s for s in parse(fetch(web_ip, timeout=5)).named("response_total")
                    if s.labels.get("direction") == "inbound" and s.labels.get("classification") == "failure"
                    and s.labels.get("status_code") == "500"]
        assert failures and sum(s.value for s in failures) > 0, failures

    # Purge: nothing of this platform is left on the host.
    p.tether("down", "--purge")
    problems = before.leftovers(p.prefix)
    assert not problems, "\n".join(problems)
    assert not any(n.startswith(p.prefix) for n in uplab.netns_names() | uplab.link_names())
