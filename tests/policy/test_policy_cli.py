"""The commands: ``tether policy serve`` as a real process (mTLS), ``tether diagnostics policy`` and ``tether authz``."""

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
from policy_helpers import (
    NS,
    Pki,
    external_workload,
    http_route,
    mesh_tls,
    namespace,
    pod,
    policy,
    sa_id,
    server,
    server_authz,
)
from executables import TETHER

from tether.store import Store

P = "policy.linkerd.io"


def deployment(name: str = "web", app: str = "web") -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app}},
                                  "spec": {"containers": [{"name": app, "image": "x",
                                                           "ports": [{"name": "http", "containerPort": 8080}]}]}}}}


OBJECTS = [
    namespace(), pod(), deployment(), deployment("idle", "idle"),
    server("web-http", port="http"), mesh_tls("voters", identities=[sa_id("vote")]),
    server_authz("probes", {"unauthenticated": True, "networks": [{"cidr": "10.0.0.0/8"}]}, server_name="web-http"),
    http_route("api", "web-http"),
    policy("api-voters", (P, "HTTPRoute", "api"), [(P, "MeshTLSAuthentication", "voters")]),
    # A VM: an ExternalWorkload and a Server selecting it, voters only.
    external_workload(), {**server("billing", port="http", app="billing"), "spec": {
        "externalWorkloadSelector": {"matchLabels": {"app": "billing"}}, "port": "http"}},
    policy("billing-voters", (P, "Server", "billing"), [(P, "MeshTLSAuthentication", "voters")]),
    # Outbound: a Service and a route splitting its traffic.
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
     "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}},
    {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute", "metadata": {"name": "split", "namespace": NS},
     "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
              "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                         "backendRefs": [{"name": "web", "port": 80, "weight": 3}],
                         "timeouts": {"request": "5s"}}]}},
]


@dataclass
class Running:
    addr: str
    admin_port: int
    pki: Pki
    home: Path
    pid: int  # the controller process

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TETHER_HOME": str(self.home), "NO_COLOR": "1", "COLUMNS": "200"}
        proc = subprocess.run([TETHER, *args], capture_output=True, text=True, env=env, timeout=60)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def diagnose(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("diagnostics", "policy", *args, "--policy-addr", self.addr, "--trust-anchors",
                        str(self.pki.ca), "--tls-cert", str(self.pki.client_cert), "--tls-key",
                        str(self.pki.client_key))


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Running]:
    tmp_path = tmp_path_factory.mktemp("policy-cli")
    home = tmp_path / "home"
    home.mkdir()
    store = Store(home / "store.db")
    store.apply_many(OBJECTS)
    store.close()
    log_path = tmp_path / "policy.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [TETHER, "policy", "serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
             "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--trust-anchors", str(pki.ca),
             "--default-policy", "cluster-authenticated", "--patch-timeout-ms", "2500"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TETHER_HOME": str(home)},
        )
    try:
        deadline = time.monotonic() + 30
        while (match := re.search(r"serving gRPC on port (\d+), admin on port (\d+)", log_path.read_text())) is None:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the policy controller did not start"
            time.sleep(0.05)
        yield Running(f"127.0.0.1:{match[1]}", int(match[2]), pki, home, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()


def test_on_the_local_platform_the_controller_does_not_load_the_kubernetes_client(running: Running) -> None:
    # kubernetes_asyncio brings aiohttp (compiled, so in the process's mappings) and ~45 MiB resident with it.
    assert "/aiohttp/" not in Path(f"/proc/{running.pid}/maps").read_text()


def test_a_patch_timeout_that_is_not_a_positive_number_is_refused_by_name(running: Running) -> None:
    proc = running.run("policy", "serve", "--patch-timeout-ms", "0")
    assert proc.returncode == 2 and "--patch-timeout-ms" in proc.stderr, proc.stderr


def test_diagnostics_policy_of_a_pod_port(running: Running) -> None:
    out = running.diagnose("po/web-0", "8080", "-n", NS)
    assert out.returncode == 0, out.stderr
    assert "server:         server/web-http" in out.stdout
    assert "serverauthorization/probes: unauthenticated from 10.0.0.0/8" in out.stdout
    assert f"authorizationpolicy/api-voters: {sa_id('vote')} from 0.0.0.0/0, ::/0" in out.stdout
    doc = json.loads(running.diagnose("po/web-0", "8080", "-n", NS, "-o", "json").stdout)
    assert doc["labels"] == {"group": P, "kind": "server", "name": "web-http"}
    assert [r["ref"] for r in doc["http_routes"]] == ["HTTPRoute/api"]
    default = json.loads(running.diagnose("po/web-0", "9999", "-n", NS, "-o", "json").stdout)
    assert default["labels"]["name"] == "cluster-authenticated"


def test_diagnostics_policy_errors_are_clear(running: Running) -> None:
    missing = running.diagnose("po/nope", "8080", "-n", NS)
    assert missing.returncode == 1 and "unknown pod emojivoto/nope" in missing.stderr
    bad = running.diagnose("deploy/web", "8080")
    assert bad.returncode == 2 and "expected po/NAME, externalworkload/NAME or svc/NAME" in bad.stderr
    no_cert = running.run("diagnostics", "policy", "po/web-0", "8080", "-n", NS, "--policy-addr", running.addr,
                          "--trust-anchors", str(running.pki.ca))
    assert no_cert.returncode == 1 and "cannot reach the policy controller" in no_cert.stderr


def test_authz_lists_what_applies_to_a_deployment(running: Running) -> None:
    out = running.run("authz", "deploy/web", "-n", NS)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.strip().splitlines()
    assert header.split() == ["PORT", "SERVER", "ROUTE", "AUTHORIZATION", "CLIENTS"]
    assert any("web-http" in r and "serverauthorization/probes" in r and "any client from 10.0.0.0/8" in r
               for r in rows)
    assert any("HTTPRoute/api" in r and "authorizationpolicy/api-voters" in r and sa_id("vote") in r for r in rows)
    doc = json.loads(running.run("authz", "deploy/idle", "-n", NS, "-o", "json").stdout)
    assert doc["authorizations"] == [] and doc["default_policy"] == "all-unauthenticated"
    missing = running.run("authz", "deploy/nope", "-n", NS)
    assert missing.returncode == 1 and "deployment emojivoto/nope not found" in missing.stderr


def test_diagnostics_policy_of_an_external_workload_port(running: Running) -> None:
    out = running.diagnose("externalworkload/vm-1", "8080", "-n", NS)
    assert out.returncode == 0, out.stderr
    assert "server:         server/billing" in out.stdout
    assert f"authorizationpolicy/billing-voters: {sa_id('vote')} from 0.0.0.0/0, ::/0" in out.stdout
    missing = running.diagnose("externalworkload/web-0", "8080", "-n", NS)  # a pod's name is no workload's
    assert missing.returncode == 1 and "unknown external workload emojivoto/web-0" in missing.stderr


def test_authz_lists_what_applies_to_an_external_workload(running: Running) -> None:
    doc = json.loads(running.run("authz", "externalworkload/vm-1", "-n", NS, "-o", "json").stdout)
    assert [(r["port"], r["server"], r["authorization"]) for r in doc["authorizations"]] == [
        (8080, "billing", "authorizationpolicy/billing-voters")]
    missing = running.run("authz", "externalworkload/nope", "-n", NS)
    assert missing.returncode == 1 and "external workload emojivoto/nope not found" in missing.stderr
    bad = running.run("authz", "svc/web", "-n", NS)
    assert bad.returncode == 2 and "deploy/NAME, po/NAME or externalworkload/NAME" in bad.stderr


def test_diagnostics_policy_of_a_service_port(running: Running) -> None:
    out = running.diagnose("svc/web", "80", "-n", NS)
    assert out.returncode == 0, out.stderr
    assert "target:   service/emojivoto/web:80" in out.stdout
    assert "http route httproute/emojivoto/split" in out.stdout
    assert "backends: web.emojivoto.svc.cluster.local:80 weight 3" in out.stdout
    assert "timeouts: request 5s" in out.stdout
    doc = json.loads(running.diagnose("svc/web", "80", "-n", NS, "-o", "json").stdout)
    assert doc["metadata"]["resource"]["name"] == "web"
    assert doc["protocol"]["detect"]["http1"]["routes"][0]["metadata"]["resource"]["name"] == "split"
    # Another port of the same Service has no route: the default route, as the proxy falls back to the profile.
    bare = json.loads(running.diagnose("svc/web", "8080", "-n", NS, "-o", "json").stdout)
    assert bare["protocol"]["detect"]["http1"]["routes"][0]["metadata"] == {"default": "http"}
