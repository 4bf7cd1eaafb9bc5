"""The commands: ``tether destination serve`` as a real process, ``tether diagnostics`` against it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from destination_helpers import Pki, namespace, pod, profile, service, with_slices
from executables import TETHER

from tether.store import Store

AUTHORITY = "web.emojivoto.svc.cluster.local:80"


@dataclass
class Running:
    addr: str
    admin_port: int
    store: Store
    pki: Pki
    home: Path
    pid: int  # the controller process

    def run(self, *args: str, tls: bool = True) -> subprocess.CompletedProcess[str]:
        tls_args = ["--trust-anchors", str(self.pki.ca)] if tls else []
        env = {**os.environ, "TETHER_HOME": str(self.home), "NO_COLOR": "1", "COLUMNS": "200"}
        proc = subprocess.run([TETHER, "diagnostics", *args, "--destination-addr", self.addr, *tls_args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc


@pytest.fixture
def running(tmp_path: Path, pki: Pki) -> Iterator[Running]:
    home = tmp_path / "home"
    home.mkdir()
    store = Store(home / "store.db")
    store.apply_many(with_slices([
        namespace(), service(), service("idle"), pod("web-1", "10.1.0.1"), pod("web-2", "10.1.0.2", meshed=False),
        profile(routes=[{"name": "GET /api", "condition": {"method": "GET", "pathRegex": "/api/.*"},
                         "responseClasses": [{"condition": {"status": {"min": 500, "max": 599}}, "isFailure": True}],
                         "isRetryable": True, "timeout": "300ms"}]),
    ]))
    log_path = tmp_path / "destination.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [TETHER, "destination", "serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
             "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TETHER_HOME": str(home)},
        )
    try:
        deadline = time.monotonic() + 30
        while (match := re.search(r"serving gRPC on port (\d+), admin on port (\d+)", log_path.read_text())) is None:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the destination did not start"
            time.sleep(0.05)
        yield Running(f"127.0.0.1:{match[1]}", int(match[2]), store, pki, home, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
        store.close()


def test_endpoints_table_and_json(running: Running) -> None:
    table = running.run("endpoints", AUTHORITY)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.strip().splitlines()
    assert header.split() == ["NAMESPACE", "IP", "PORT", "POD", "SERVICE", "IDENTITY", "HINT"]
    assert any("web-1" in row and "web.emojivoto.serviceaccount.identity.linkerd.cluster.local" in row
               and row.rstrip().endswith("h2") for row in rows)
    assert any("web-2" in row and " - " in row for row in rows)

    doc = json.loads(running.run("endpoints", AUTHORITY, "-o", "json").stdout)
    endpoints = {a["addr"]: a for a in doc["add"]["addrs"]}
    assert set(endpoints) == {"10.1.0.1:8080", "10.1.0.2:8080"}
    assert endpoints["10.1.0.1:8080"]["tls_identity"].startswith("web.emojivoto.")
    assert "tls_identity" not in endpoints["10.1.0.2:8080"]


def test_no_endpoints_is_not_an_unknown_service(running: Running) -> None:
    idle = running.run("endpoints", "idle.emojivoto.svc.cluster.local:80")
    assert idle.returncode == 0
    assert "No endpoints found" in idle.stdout and "the service exists" in idle.stdout
    idle_json = json.loads(running.run("endpoints", "idle.emojivoto.svc.cluster.local:80", "-o", "json").stdout)
    assert idle_json == {"no_endpoints": {"exists": True}}

    unknown = running.run("endpoints", "nope.emojivoto.svc.cluster.local:80")
    assert unknown.returncode == 1
    assert "unknown service" in unknown.stderr

    bad = running.run("endpoints", "10.1.0.1:8080")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr


def test_profile_table_and_json(running: Running) -> None:
    table = running.run("profile", AUTHORITY)
    assert table.returncode == 0, table.stderr
    assert "fully qualified name: web.emojivoto.svc.cluster.local" in table.stdout
    assert "GET /api" in table.stdout and "all(path_regex=/api/.*, method=GET)" in table.stdout
    assert "0.3s" in table.stdout and "status 500-599" in table.stdout

    doc = json.loads(running.run("profile", AUTHORITY, "-o", "json").stdout)
    assert [r["metrics_labels"]["route"] for r in doc["routes"]] == ["GET /api"]
    assert doc["retry_budget"]["retry_ratio"] == 0.2

    endpoint = json.loads(running.run("profile", "10.1.0.1:8080", "-o", "json").stdout)
    assert endpoint["endpoint"]["metric_labels"]["pod"] == "web-1"
    assert "endpoint:" in running.run("profile", "10.1.0.1:8080").stdout


def test_the_client_verifies_the_destination_identity(running: Running) -> None:
    wrong = running.run("endpoints", AUTHORITY, "--server-name", "someone-else.example.org")
    assert wrong.returncode == 1
    assert "cannot reach the destination" in wrong.stderr
    plaintext = running.run("endpoints", AUTHORITY, "--insecure", tls=False)
    assert plaintext.returncode == 1


def test_on_the_local_platform_the_destination_does_not_load_the_kubernetes_client(running: Running) -> None:
    # kubernetes_asyncio brings aiohttp (compiled, so in the process's mappings) and ~45 MiB resident with it.
    assert "/aiohttp/" not in Path(f"/proc/{running.pid}/maps").read_text()


def test_admin_port_of_the_process(running: Running) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{running.admin_port}/ready", timeout=10) as response:
        assert response.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{running.admin_port}/metrics", timeout=10) as response:
        assert b"pod_cache_size" in response.read()


def test_serve_refuses_to_run_without_tls(tmp_path: Path) -> None:
    proc = subprocess.run([TETHER, "destination", "serve", "--store", str(tmp_path / "s.db")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "--tls-cert" in proc.stderr


def test_watch_prints_every_update(running: Running) -> None:
    env = {**os.environ, "TETHER_HOME": str(running.home)}
    proc = subprocess.Popen(
        [TETHER, "diagnostics", "endpoints", AUTHORITY, "--watch", "-o", "json", "--destination-addr", running.addr,
         "--trust-anchors", str(running.pki.ca)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert len(first["add"]["addrs"]) == 2
        # A pod and its endpoint, as the local platform's EndpointSlice controller would write it.
        running.store.apply_many(with_slices([service(), pod("web-1", "10.1.0.1"),
                                              pod("web-2", "10.1.0.2", meshed=False), pod("web-3", "10.1.0.3")]))
        second = json.loads(proc.stdout.readline())
        assert [a["addr"] for a in second["add"]["addrs"]] == ["10.1.0.3:8080"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
