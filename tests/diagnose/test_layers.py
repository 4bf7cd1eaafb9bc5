"""``tether diagnose`` on a running local platform: one real fault per layer, each named at its layer.

One platform for the module; every workload is deployed at once by a module fixture.  The faults are
real: an annotation that disables injection, a redirect rule deleted from a pod's namespace, an expired
issuer, a Service with no endpoints, a deny default policy, an app that speaks first on a port that is
not opaque, an app answering 500 and a Service whose target port nothing listens on.  The healthy call
is reported ok.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from tether.diagnose import proxies
from tether.identity import pem, pki
from up import uplab
from up.uplab import PYTHON, client, ready, wait_for, web_server

NS = "dg"

BANNER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 2525)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"220 banner ready\\r\\n"); c.close()
"""

# A gRPC server with no service: every call is answered UNIMPLEMENTED. Its first bytes on a connection are
# HTTP/2's server preface (SETTINGS), which is not a protocol that speaks first.
GRPC = """
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2)); server.add_insecure_port("0.0.0.0:8080")
server.start(); server.wait_for_termination()
"""

FAILING = """
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500); self.send_header("Content-Length", "4"); self.end_headers(); self.wfile.write(b"boom")
HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def _script_app(name: str, script: str, port: int, service_port: int, target: int | None = None) -> str:
    return uplab.script_deployment(name, NS, script.strip(), container="app", port=port) + f"""---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: {service_port}, targetPort: {target or port}}}]
"""


MANIFESTS = [
    f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n",
    web_server("web", NS, 1),
    client("client", NS, f"http://web.{NS}.svc.cluster.local/"),
    client("plain", NS, f"http://web.{NS}.svc.cluster.local/", annotations="linkerd.io/inject: disabled"),
    web_server("locked", NS, 1, annotations="config.linkerd.io/default-inbound-policy: deny"),
    web_server("bare", NS, 1, annotations="linkerd.io/inject: disabled"),
    _script_app("banner", BANNER, 2525, 2525),
    _script_app("failing", FAILING, 8080, 80),
    _script_app("rpc", GRPC, 8080, 8080),
    web_server("refusing", NS, 1).replace("targetPort: http", "targetPort: 9090"),
    f"apiVersion: v1\nkind: Service\nmetadata: {{name: nobody, namespace: {NS}}}\n"
    "spec: {selector: {app: nobody}, ports: [{port: 80, targetPort: 8080}]}\n",
    # web under another name, called by nobody before the discovery fault below (so no proxy has resolved it)
    f"apiVersion: v1\nkind: Service\nmetadata: {{name: alias, namespace: {NS}}}\n"
    "spec: {selector: {app: web}, ports: [{port: 80, targetPort: http}]}\n",
]

CALL = """
import http.client, json, sys
conn = http.client.HTTPConnection(sys.argv[1], 80, timeout=20)
try:
    conn.request("GET", "/")
    answer = conn.getresponse()
    print(json.dumps({"status": answer.status, "headers": {k.lower(): v for k, v in answer.getheaders()}}))
except OSError as exc:
    print(json.dumps({"status": None, "error": str(exc)}))
"""


@pytest.fixture(scope="module")
def mesh(running: uplab.Platform) -> uplab.Platform:
    for manifest in MANIFESTS:
        running.apply(manifest)

    def all_ready() -> bool:
        pods = running.pods(NS)
        return len(pods) == 9 and all(ready(p) for p in pods)

    wait_for("every workload of the module ready", all_ready, timeout=120)
    return running


def diagnose(p: uplab.Platform, target: str, to: str | None = None) -> dict:
    args = ["diagnose", target, "-n", NS, "-o", "json"] + (["--to", to] if to else [])
    proc = p.tether(*args, ok=None)
    doc = json.loads(proc.stdout)
    assert set(doc) == {"target", "to", "ok", "layer", "reason", "evidence", "next"}
    assert proc.returncode == (0 if doc["ok"] else 1)
    assert all(set(e) == {"source", "detail"} for e in doc["evidence"])
    return doc


def details(doc: dict) -> str:
    return "\n".join(f"{e['source']}: {e['detail']}" for e in doc["evidence"])


def test_a_healthy_call_is_ok(mesh: uplab.Platform) -> None:
    doc = diagnose(mesh, "deploy/client", f"web.{NS}:80")
    assert doc["ok"] is True and doc["layer"] is None, doc
    evidence = details(doc)
    assert "HTTP/1.1 200" in evidence
    assert 'tls="true"' in evidence and "client_id=\"default.dg.serviceaccount" in evidence
    assert "destination Get web.dg.svc.cluster.local:80" in evidence
    text = mesh.tether("diagnose", "deploy/client", "-n", NS, "--to", f"web.{NS}.svc.cluster.local:80").stdout
    assert text.startswith("ok: deploy/client -> web.dg.svc.cluster.local:80")


def test_a_healthy_grpc_call_is_ok(mesh: uplab.Platform) -> None:
    # Regression: the gRPC server's SETTINGS frame was taken for a server-speaks-first banner (layer proxy),
    # and then an HTTP/1 GET for the app's answer (a 502, layer application).
    doc = diagnose(mesh, "deploy/client", f"rpc.{NS}:8080")
    assert doc["ok"] is True and doc["layer"] is None, doc
    evidence = details(doc)
    assert "opens with an HTTP/2 SETTINGS frame" in evidence
    assert "HTTP/2 200 grpc-status: 12" in evidence and 'tls="true"' in evidence


def test_an_unmeshed_client_fails_at_injection(mesh: uplab.Platform) -> None:
    doc = diagnose(mesh, "deploy/plain", f"web.{NS}:80")
    assert doc["layer"] == "injection" and doc["ok"] is False
    assert "not meshed" in doc["reason"] and "injection_disable_annotation_present" in doc["reason"]
    assert "linkerd.io/inject=disabled" in details(doc)
    text = mesh.tether("diagnose", "deploy/plain", "-n", NS, ok=False).stdout
    assert text.startswith("injection: FAILED: deploy/plain")


def test_an_unmeshed_server_fails_at_injection_and_is_not_ok(mesh: uplab.Platform) -> None:
    doc = diagnose(mesh, "deploy/client", f"bare.{NS}:80")
    assert doc["layer"] == "injection" and doc["ok"] is False
    assert doc["reason"].startswith("the target pod dg/bare-") and "injection_disable_annotation_present" in doc["reason"]


def test_a_deleted_redirect_rule_fails_at_redirection(mesh: uplab.Platform) -> None:
    (pod,) = [p for p in mesh.pods(NS) if p["metadata"]["name"].startswith("client-")]
    iptables = ["ip", "netns", "exec", mesh.netns_of(pod), "iptables", "-t", "nat"]
    nat = subprocess.run([*iptables, "-S"], check=True, capture_output=True, text=True).stdout.splitlines()
    rule = shlex.split(next(r for r in nat if r.startswith("-A OUTPUT") and "PROXY_INIT_OUTPUT" in r))
    subprocess.run([*iptables, "-D", *rule[1:]], check=True, capture_output=True)
    try:
        doc = diagnose(mesh, "deploy/client", f"web.{NS}:80")
    finally:
        subprocess.run([*iptables, "-I", "OUTPUT", "1", *rule[2:]], check=True, capture_output=True)
    assert doc["layer"] == "redirection", doc
    assert "OUTPUT does not jump to PROXY_INIT_OUTPUT" in doc["reason"]
    assert diagnose(mesh, "deploy/client", f"web.{NS}:80")["ok"] is True


def test_an_expired_issuer_fails_at_identity(mesh: uplab.Platform) -> None:
    pki_dir = mesh.home / "pki"
    saved = {n: (pki_dir / n).read_bytes() for n in ("issuer.crt", "issuer.key")}
    anchor, key = pem.read_certificates(pki_dir / "ca.crt")[0], pem.read_private_key(pki_dir / "ca.key")
    cert, issuer_key = pki.create_issuer(anchor, key, control_plane_ns="linkerd", trust_domain="cluster.local",
                                         valid_for=timedelta(hours=1), now=datetime.now(UTC) - timedelta(hours=2))
    pem.write_file(pki_dir / "issuer.crt", pem.certificate_pem(cert), private=False)
    pem.write_file(pki_dir / "issuer.key", pem.private_key_pem(issuer_key), private=True)
    try:
        doc = diagnose(mesh, "deploy/client", f"web.{NS}:80")
    finally:
        for name, data in saved.items():
            (pki_dir / name).write_bytes(data)
    assert doc["layer"] == "identity", doc
    assert "issuer certificate is outside its validity period" in doc["reason"]


def test_a_service_without_endpoints_fails_at_discovery(mesh: uplab.Platform) -> None:
    doc = diagnose(mesh, "deploy/client", f"nobody.{NS}:80")
    assert doc["layer"] == "discovery", doc
    assert "has no ready endpoints" in doc["reason"]
    assert "matches 0 running pod(s)" in details(doc)
    wrong_port = diagnose(mesh, "deploy/client", f"web.{NS}:81")
    assert wrong_port["layer"] == "discovery" and "does not declare port 81" in wrong_port["reason"]


@pytest.mark.parametrize("authority, layer, reason, evidence", [
    # a server with the deny default policy (judged on the policy controller's answer: `tether up` runs it)
    ("locked.dg:80", "policy",
     "admits default.dg.serviceaccount.identity.linkerd.cluster.local", "server default/deny"),
    # a server that speaks first on a port that is not opaque
    ("banner.dg:2525", "proxy", "speaks first", "220 banner ready"),
    # an app answering 500, and a Service whose target port nothing listens on
    ("failing.dg:80", "application", "answered 500", "HTTP/1.1 500"),
    ("refusing.dg:80", "application", "refuses connections on port 9090", "Connection refused"),
])
def test_later_layers(mesh: uplab.Platform, authority: str, layer: str, reason: str, evidence: str) -> None:
    doc = diagnose(mesh, "deploy/client", authority)
    assert doc["layer"] == layer, doc
    assert reason in doc["reason"] and evidence in details(doc)
    if layer == "proxy":
        assert "config.linkerd.io/opaque-ports" in doc["next"]


def pod_of(mesh: uplab.Platform, deployment: str) -> dict:
    (pod,) = [p for p in mesh.pods(NS) if p["metadata"]["name"].startswith(f"{deployment}-")]
    return pod


def call_from(mesh: uplab.Platform, pod: dict, host: str) -> dict:
    """One GET from inside ``pod``'s network namespace, as its app makes it (through its proxy)."""
    proc = subprocess.run(["ip", "netns", "exec", mesh.netns_of(pod), PYTHON, "-c", CALL, host],
                          capture_output=True, text=True, check=True, timeout=60)
    return json.loads(proc.stdout)


def test_no_endpoints_the_proxy_fails_fast_and_diagnose_names_discovery(mesh: uplab.Platform) -> None:
    answer = call_from(mesh, pod_of(mesh, "client"), f"nobody.{NS}.svc.cluster.local")
    # Linkerd's answer for a balancer in fail-fast (proxy.md §7.9): 504, the error in l5d-proxy-error.
    assert answer["status"] == 504, answer
    assert answer["headers"]["l5d-proxy-error"] == \
        f"logical service nobody.{NS}.svc.cluster.local:80: service in fail-fast"
    doc = diagnose(mesh, "deploy/client", f"nobody.{NS}:80")
    assert doc["layer"] == "discovery" and "has no ready endpoints" in doc["reason"], doc
    assert 'outbound_http_errors_total{error="failfast"}' in details(doc)


def test_discovery_unreachable_from_the_client_proxy_is_named_at_the_proxy_layer(mesh: uplab.Platform) -> None:
    """The destination answers (diagnose asks it from the host), but the client pod cannot reach it."""
    pod = pod_of(mesh, "client")
    port = proxies.proxy_env(pod, "LINKERD2_PROXY_DESTINATION_SVC_ADDR").rsplit(":", 1)[1]
    iptables = ["ip", "netns", "exec", mesh.netns_of(pod), "iptables"]
    rule = ["OUTPUT", "-p", "tcp", "--dport", port, "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run([*iptables, "-I", *rule[:1], "1", *rule[1:]], check=True, capture_output=True)
    try:
        doc = diagnose(mesh, "deploy/client", f"alias.{NS}:80")
    finally:
        subprocess.run([*iptables, "-D", *rule], check=True, capture_output=True)
    assert doc["layer"] == "proxy", doc
    assert 'error="discovery unavailable"' in doc["reason"] and "own path to it is broken" in doc["reason"]
    evidence = details(doc)
    assert "destination Get alias.dg.svc.cluster.local:80" in evidence  # diagnose's own answer: endpoints
    assert 'outbound_tcp_errors_total{error="discovery unavailable"' in evidence
    assert "during diagnose's call" in evidence
    assert "discovery: stream" in evidence and "cannot connect" in evidence  # the client proxy's log
    wait_for("the client's proxy to reach the destination again",
             lambda: diagnose(mesh, "deploy/client", f"alias.{NS}:80")["ok"], timeout=60)


def test_bad_questions_are_errors_not_diagnoses(mesh: uplab.Platform) -> None:
    for args, message in [
        (["deploy/ghost"], 'deployments "ghost" not found'),
        (["svc/web"], "deploy/NAME or po/NAME"),
        (["deploy/client", "--to", "web"], "is not SVC.NS:PORT"),
    ]:
        proc = mesh.tether("diagnose", *args, "-n", NS, ok=False)
        assert message in proc.stderr and proc.returncode == 1



def test_proxy_metrics_controller_metrics_identity_and_version(mesh: uplab.Platform) -> None:
    out = mesh.tether("diagnostics", "proxy-metrics", "deploy/web", "-n", NS).stdout
    (web,) = [p for p in mesh.pods(NS) if p["metadata"]["name"].startswith("web-")]
    assert out.startswith(f"#\n# POD {web['metadata']['name']} (1 of 1)\n#\n")
    assert 'proxy_build_info{vendor="tether"' in out and "request_total{" in out
    # A deny pod's proxy refuses the host on its admin port, yet answers diagnostics, which ask from the pod's
    # loopback as a port-forward reaches Linkerd's (default:localhost).
    (locked,) = [p for p in mesh.pods(NS) if p["metadata"]["name"].startswith("locked-")]
    assert proxies.admin_get(locked["status"]["podIP"], "/metrics").status == 403
    assert 'proxy_build_info{vendor="tether"' in mesh.tether("diagnostics", "proxy-metrics", "deploy/locked",
                                                             "-n", NS).stdout
    plain = mesh.tether("diagnostics", "proxy-metrics", "deploy/plain", "-n", NS, ok=False)
    assert "has no linkerd-proxy container" in plain.stderr
    components = mesh.tether("diagnostics", "controller-metrics").stdout
    for name in ("identity", "destination", "platform"):
        assert f"# COMPONENT {name} (" in components
    ident = mesh.tether("identity", f"po/{web['metadata']['name']}", "-n", NS).stdout
    assert "subject:    CN=default.dg.serviceaccount.identity.linkerd.cluster.local" in ident
    assert "SANs:       DNS:default.dg.serviceaccount.identity.linkerd.cluster.local" in ident
    assert "issuer:     CN=identity.linkerd.cluster.local" in ident
    # The leaf's 24 h lifetime plus the clock-skew allowance (20 s), less the time since it was issued: shown as
    # "1.0 days" within the allowance of issuance, as "23.9 hours" after it.
    left = re.search(r"(\d+\.\d) (hours|days) left", ident)
    assert left is not None and 23.0 <= float(left[1]) * (24 if left[2] == "days" else 1) <= 24.1
    version = mesh.tether("version", "--proxy", "-n", NS).stdout
    assert "Server version: 0.1.0" in version and "\t0.1.0 (7 pods)" in version
    assert mesh.tether("version", "--client", "--short").stdout == "0.1.0\n"


def test_diagnostics_find_the_controllers_tether_up_runs(mesh: uplab.Platform) -> None:
    # No address, anchors or client certificate: those of the platform in $TETHER_HOME, as `tether up` ran it
    # (the default localhost addresses reach nothing there: the controllers listen on the bridge).
    web = pod_of(mesh, "web")["metadata"]["name"]
    inbound = json.loads(mesh.tether("diagnostics", "policy", f"po/{web}", "8080", "-n", NS, "-o", "json").stdout)
    assert inbound["labels"]["kind"] == "default"
    outbound = mesh.tether("diagnostics", "policy", "svc/web", "80", "-n", NS).stdout
    assert outbound.startswith(f"target:   service/{NS}/web:80")
    endpoints = mesh.tether("diagnostics", "endpoints", f"web.{NS}.svc.cluster.local:80", "-o", "json").stdout
    assert web in endpoints
    profile = mesh.tether("diagnostics", "profile", f"web.{NS}.svc.cluster.local:80").stdout
    assert f"fully qualified name: web.{NS}.svc.cluster.local" in profile


POLICY = """
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: web-http, namespace: dg}
spec:
  podSelector: {matchLabels: {app: web}}
  port: http
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: callers, namespace: dg}
spec:
  identities: [IDENTITY]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-callers, namespace: dg}
spec:
  targetRef: {group: policy.linkerd.io, kind: Server, name: web-http}
  requiredAuthenticationRefs:
  - {group: policy.linkerd.io, kind: MeshTLSAuthentication, name: callers}
"""


def test_with_the_policy_controller_its_answer_decides(mesh: uplab.Platform) -> None:
    """Last in the module (it leaves an AuthorizationPolicy): the policy controller `tether up` runs decides."""
    mesh.apply(POLICY.replace("IDENTITY", "someone-else.dg.serviceaccount.identity.linkerd.cluster.local"))
    doc = wait_for("the controller to refuse the client",
                   lambda: (d := diagnose(mesh, "deploy/client", f"web.{NS}:80"))["layer"] == "policy" and d)
    assert "no authorization of server/web-http" in doc["reason"]
    assert "admits default.dg.serviceaccount.identity.linkerd.cluster.local" in doc["reason"]
    assert "authorization authorizationpolicy/web-callers" in details(doc).lower()
    mesh.apply(POLICY.replace("IDENTITY", "default.dg.serviceaccount.identity.linkerd.cluster.local"))
    doc = wait_for("the controller to admit the client",
                   lambda: (d := diagnose(mesh, "deploy/client", f"web.{NS}:80"))["layer"] != "policy" and d)
    assert doc["ok"] is True, doc
