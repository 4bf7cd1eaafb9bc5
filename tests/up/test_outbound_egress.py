"""Egress control end to end on the local platform (Linkerd's "managing egress traffic" how-to, shrunk): the real
policy controller and a real proxy in front of a meshed client calling a server outside the cluster networks.

The server runs in the test, on the host's own address outside the pod and
service ranges. An EgressNetwork in the global egress namespace first denies
that traffic: the client's proxy answers 403 itself and the server sees
nothing; then the EgressNetwork allows it and the requests reach the server,
counted by the client's proxy under the EgressNetwork's name
(``outbound_http_route_request_statuses_total{parent_kind="EgressNetwork"}``).
Then the how-to's last step: the network denies again but an HTTPRoute on it
(the tutorial's ``httpbin-get``, its path matching the server's) lets that
path out while the client's other path is refused, counted under the route.

Egress by hostname (the how-to's ``tls-egress`` TLSRoute): on the denied
network, a TLSRoute naming one hostname lets TLS connections with that SNI out
to the original destination (a TLS server in the test, verified by the client
against its CA: the proxy did not terminate it), while another SNI's
connections are closed.
"""

from __future__ import annotations

import http.server
import importlib.util
import ipaddress
import socket
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path
from collections.abc import Iterator

import pytest

from up import uplab
from up.test_outbound_stream_routes import CLIENT as TLS_CLIENT
from up.test_outbound_stream_routes import _certificates
from up.uplab import ready, wait_for


pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "egress-client"
EGRESS_NS = "linkerd-egress"


def _outside_address() -> str | None:
    """One of the host's own IPv4 addresses outside 10.0.0.0/8 (the platforms' pod and service ranges)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        ip = ipaddress.ip_interface(line.split()[3]).ip
        if ip not in ipaddress.ip_network("10.0.0.0/8"):
            return str(ip)
    return None


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        _Handler.seen.append(self.path)
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def outside() -> Iterator[tuple[str, int]]:
    ip = _outside_address()
    if ip is None:
        pytest.skip("the host has no address outside 10.0.0.0/8 to stand for the outside world")
    server = http.server.ThreadingHTTPServer((ip, 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ip, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def egress(policy: str, ip: str) -> str:
    return f"""
apiVersion: policy.linkerd.io/v1alpha1
kind: EgressNetwork
metadata: {{name: outside, namespace: {EGRESS_NS}}}
spec:
  trafficPolicy: {policy}
  networks: [{{cidr: {ip}/32}}]
"""


def egress_route(api: str, kind: str, name: str, port: int, rest: str) -> str:
    """A route of the how-to's on the ``outside`` EgressNetwork, on the server's port; ``rest``: its spec's rules
    (and hostnames)."""
    return f"""
apiVersion: gateway.networking.k8s.io/{api}
kind: {kind}
metadata: {{name: {name}, namespace: {EGRESS_NS}}}
spec:
  parentRefs: [{{name: outside, kind: EgressNetwork, group: policy.linkerd.io, namespace: {EGRESS_NS}, port: {port}}}]
{rest}
"""


def get_route(port: int) -> str:
    """The how-to's ``httpbin-get`` HTTPRoute: one path let out of the EgressNetwork."""
    return egress_route("v1", "HTTPRoute", "httpbin-get", port, "  rules: [{matches: [{path: {value: /out}}]}]")


# Each path once every 0.3 s: "<path> <status>" (the status of an HTTPError too).
TWO_PATHS_SCRIPT = """
import sys, time, urllib.error, urllib.request
while True:
    for path in ("/out", "/other"):
        try:
            with urllib.request.urlopen(sys.argv[1] + path, timeout=2) as r:
                print(path, r.status, flush=True)
        except urllib.error.HTTPError as e:
            print(path, e.code, flush=True)
        except Exception as e:
            print(path, "error", e, flush=True)
    time.sleep(0.3)
"""


def test_an_egress_network_denies_then_allows_traffic_and_meters_it(running: uplab.Platform,
                                                                    outside: tuple[str, int]) -> None:
    p = running
    ip, port = outside
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {EGRESS_NS}}}\n")
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    p.apply(egress("Deny", ip))
    p.apply(uplab.script_deployment("caller", NS, TWO_PATHS_SCRIPT, f"http://{ip}:{port}"))
    (caller,) = wait_for("the caller ready", lambda: [x for x in p.pods(NS) if ready(x)], timeout=90)

    def log() -> str:
        return p.logs(NS, caller["metadata"]["name"])

    wait_for("the caller refused with 403", lambda: log().count("/out 403") >= 3, timeout=60)
    assert " 200" not in log() and _Handler.seen == []

    p.apply(egress("Allow", ip))
    wait_for("the caller let out", lambda: "/out 200" in log() and "/other 200" in log(), timeout=60)
    assert "/out" in _Handler.seen and "/other" in _Handler.seen

    metrics = p.proxy_metrics(caller)
    statuses = [line for line in metrics.splitlines()
                if line.startswith("outbound_http_route_request_statuses_total{")
                and 'parent_kind="EgressNetwork"' in line and 'parent_name="outside"' in line]
    assert any('http_status="403"' in line for line in statuses), statuses
    assert any('http_status="200"' in line for line in statuses), statuses

    # Denied again, with the how-to's HTTPRoute on the network: its path goes out, the other is refused.
    p.apply(egress("Deny", ip) + "---" + get_route(port))
    mark = len(log())
    wait_for("/out let out by the route while /other is refused",
             lambda: "/out 200" in log()[mark:] and "/other 403" in log()[mark:], timeout=60)
    since = log()[mark:]
    last_other = since.rindex("/other ")
    assert since[last_other:].startswith("/other 403"), since[-300:]
    routed = [line for line in p.proxy_metrics(caller).splitlines()
              if line.startswith("outbound_http_route_request_statuses_total{")
              and 'route_name="httpbin-get"' in line and 'parent_name="outside"' in line]
    assert any('http_status="200"' in line for line in routed), routed
    assert not any('http_status="403"' in line for line in routed), routed


@pytest.fixture
def outside_tls() -> Iterator[tuple[str, int, str, list[str]]]:
    """A TLS server on the host's outside address (a.example.com and *.example.org): its address, its CA and the
    SNIs of the handshakes it saw."""
    ip = _outside_address()
    if ip is None:
        pytest.skip("the host has no address outside 10.0.0.0/8 to stand for the outside world")
    ca, cert, key = _certificates()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "cert.pem").write_text(cert)
        (Path(folder) / "key.pem").write_text(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(Path(folder) / "cert.pem", Path(folder) / "key.pem")
    served: list[str] = []  # the SNI of each handshake
    context.sni_callback = lambda _sock, name, _ctx: served.append(name or "")
    listener = socket.create_server((ip, 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                if tls.recv(64):
                    tls.sendall(b"outside\n")
        except (OSError, ssl.SSLError):
            pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield ip, listener.getsockname()[1], ca, served
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=10)


def tls_route(port: int) -> str:
    """The how-to's ``tls-egress`` TLSRoute: one hostname let out of the EgressNetwork."""
    return egress_route("v1alpha2", "TLSRoute", "tls-egress", port, "  hostnames: [a.example.com]\n  rules:\n"
                        "  - backendRefs: [{kind: EgressNetwork, group: policy.linkerd.io, name: outside}]")


def test_a_tlsroute_lets_one_hostname_out_of_a_denied_egress_network(
        running: uplab.Platform, outside_tls: tuple[str, int, str, list[str]]) -> None:
    p = running
    ip, port, ca, served = outside_tls
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {EGRESS_NS}}}\n")
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    p.apply(egress("Deny", ip) + "---" + tls_route(port))
    for name, sni in (("named", "a.example.com"), ("unnamed", "www.example.org")):
        p.apply(uplab.script_deployment(name, NS, TLS_CLIENT, "tls", ip, str(port), sni, ca))

    def log(prefix: str) -> str:
        pods = [x for x in p.pods(NS, prefix) if ready(x)]
        return p.logs(NS, pods[0]["metadata"]["name"]) if pods else ""

    wait_for("the named host let out", lambda: log("named-").count("got outside") >= 3, timeout=90)
    wait_for("the other host's connections closed", lambda: log("unnamed-").count("error ") >= 3, timeout=60)
    assert "got outside" not in log("unnamed-")
    assert set(served) == {"a.example.com"}, served
    (named,) = p.pods(NS, "named-")
    opened = [line for line in p.proxy_metrics(named).splitlines()
              if line.startswith("outbound_tls_route_open_total{") and 'route_name="tls-egress"' in line]
    assert any('parent_kind="EgressNetwork"' in line and 'parent_name="outside"' in line for line in opened), opened
