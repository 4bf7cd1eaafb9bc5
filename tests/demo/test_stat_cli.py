"""``tether stat`` end to end without root: a store in a temporary TETHER_HOME, a fake proxy on loopback.

The pod's IP is 127.0.0.1 and ``--admin-port`` points at a small HTTP server
that serves a proxy's ``/metrics``, its counters growing on every scrape.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from demo.samples import proxy_text
from tether.cli.main import cli
from tether.store import Store

OBJECTS = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "emojivoto"}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "emojivoto"},
     "spec": {"selector": {"matchLabels": {"app": "web"}},
              "template": {"metadata": {"labels": {"app": "web"}},
                           "spec": {"containers": [{"name": "web", "image": "web"}]}}}},
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": "web-abc12-xyz", "namespace": "emojivoto",
                  "labels": {"app": "web", "pod-template-hash": "abc12", "linkerd.io/control-plane-ns": "linkerd"},
                  "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc12",
                                       "uid": "u1", "controller": True}]},
     "spec": {"containers": [{"name": "web", "image": "web"}]},
     "status": {"phase": "Running", "podIP": "127.0.0.1"}},
]


class _Proxy:
    """Serves ``/metrics``; every scrape adds 10 successes and 2 failures."""

    def __init__(self) -> None:
        self.scrapes = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                n = proxy.scrapes
                proxy.scrapes += 1
                body = proxy_text(ip="127.0.0.1", ok=10 * n, failed=2 * n, latencies_ms=[3.0] * (12 * n),
                                  open_mtls=2, written=1000 * n).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    with Store(tmp_path / "store.db") as store:
        for obj in OBJECTS:
            store.apply(obj)
    return tmp_path


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    p = _Proxy()
    yield p
    p.server.shutdown()
    p.server.server_close()


def _stat(home: Path, *args: str) -> object:
    return CliRunner().invoke(cli, ["stat", *args], env={"TETHER_HOME": str(home)}, catch_exceptions=False)


def test_stat_json_reads_the_proxy_twice_and_computes_rates(home: Path, proxy: _Proxy) -> None:
    result = _stat(home, "deploy", "-n", "emojivoto", "--admin-port", str(proxy.port), "-t", "300ms", "-o", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert proxy.scrapes == 2
    assert row["name"] == "web" and row["kind"] == "deployment" and row["meshed"] == "1/1"
    assert row["success"] == pytest.approx(10 / 12)
    assert 12 / 0.6 < row["rps"] < 12 / 0.25  # 12 responses over about 300 ms
    assert 2 < row["latency_ms_p50"] <= 3
    assert row["tcp_open_connections"] == 2 and row["mtls"] == 1.0
    assert row["errors"] == []


def test_stat_table_and_names(home: Path, proxy: _Proxy) -> None:
    result = _stat(home, "deploy/web", "-n", "emojivoto", "--admin-port", str(proxy.port), "-t", "100ms")
    assert result.exit_code == 0, result.output
    header, line = result.output.splitlines()
    assert header.split()[:3] == ["NAME", "MESHED", "SUCCESS"]
    cells = line.split()
    assert cells[:3] == ["web", "1/1", "83.33%"] and cells[-2:] == ["2", "100%"]
    missing = _stat(home, "deploy", "nope", "-n", "emojivoto", "--admin-port", str(proxy.port))
    assert missing.exit_code == 0 and "No resources found in emojivoto namespace." in missing.output


def test_stat_several_kinds_and_all_namespaces(home: Path, proxy: _Proxy) -> None:
    result = _stat(home, "po,ns", "-A", "--admin-port", str(proxy.port), "-t", "100ms")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "==> pod <==" in text and "==> namespace <==" in text
    assert "emojivoto   web-abc12-xyz   1/1" in text


def test_stat_reports_a_proxy_it_cannot_reach(home: Path) -> None:
    result = CliRunner().invoke(
        cli, ["stat", "deploy", "-n", "emojivoto", "--admin-port", "1", "-t", "100ms"],
        env={"TETHER_HOME": str(home)})
    assert result.exit_code == 0
    assert "cannot read metrics of web-abc12-xyz" in result.stderr
    assert result.stdout.splitlines()[1].split() == ["web", "1/1", "-", "-", "-", "-", "-", "-", "-"]


def test_stat_watch_prints_refreshes_until_interrupted(home: Path, proxy: _Proxy,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import tether.cli.stat_cmd as stat_cmd

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(stat_cmd.time, "sleep", sleep)
    result = _stat(home, "deploy", "-n", "emojivoto", "--admin-port", str(proxy.port), "-w", "--interval", "2s")
    assert result.exit_code == 0, result.output
    assert sleeps == [1.0, 2.0, 2.0, 2.0]  # a baseline scrape, then a frame every interval
    assert result.output.count("NAME") == 3 and "rates over the last 10s" in result.output
    assert proxy.scrapes == 4
    first_frame = result.output.split("NAME")[1]
    assert "83.33%" in first_frame  # rates from the first frame on


@pytest.mark.parametrize(("args", "message"), [
    (["svc"], "stat shows deployments, pods and namespaces, not services"),
    (["widgets"], "unknown resource type 'widgets'"),
    (["deploy", "-t", "soon"], "not a duration"),
])
def test_stat_usage_errors(home: Path, args: list[str], message: str) -> None:
    result = _stat(home, *args)
    assert result.exit_code == 2 and message in result.output


def test_stat_without_a_platform(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["stat", "deploy"], env={"TETHER_HOME": str(tmp_path / "none")})
    assert result.exit_code == 1 and "no store here" in result.output
