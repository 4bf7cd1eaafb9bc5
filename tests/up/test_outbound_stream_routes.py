"""TCPRoute and TLSRoute end to end on the local platform: the real policy controller, real proxies, real mTLS
between them, and the application's own TLS (Python's ssl) passed through by SNI.

- **TCPRoute**: a client opens TCP connections to the ``db`` Service (``appProtocol: linkerd.io/tcp``); a
  TCPRoute on it sends them all to ``db-b`` (weights 0/1), then, switched, all to ``db-a``. Each server answers
  a connection with its own name, so the client's log says where every connection went, and the parent's own
  pod takes none.
- **TLSRoute**: clients speak TLS to the ``tls`` Service (no ``appProtocol``: detect) with SNI
  ``a.example.com`` or ``www.example.org``; two TLSRoutes (an exact name to ``tls-a``, ``*.example.org`` to
  ``tls-b``) send each to its backend, whose certificate the client verifies: the client's proxy read the SNI
  from the ClientHello without terminating the TLS. A client whose SNI no route takes has its connections
  closed (Linkerd's ``NoRoute``).

Both are counted under the route's name in ``outbound_tcp_route_*`` / ``outbound_tls_route_*``.
"""

from __future__ import annotations

import datetime
import importlib.util
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from up import uplab
from up.uplab import ready, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "stream-routes"

SERVER = '''
import socket, ssl, sys, tempfile, threading
mode, name = sys.argv[1], sys.argv[2]
context = None
if mode == "tls":
    folder = tempfile.mkdtemp()
    with open(folder + "/cert.pem", "w") as f:
        f.write(sys.argv[3])
    with open(folder + "/key.pem", "w") as f:
        f.write(sys.argv[4])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder + "/cert.pem", folder + "/key.pem")
server = socket.create_server(("0.0.0.0", 8080))
def serve(conn):
    try:
        if context is not None:
            conn = context.wrap_socket(conn, server_side=True)
        data = conn.recv(64)
        if data:
            conn.sendall(name.encode() + b"\\n")
            print("served", data.decode().strip(), flush=True)
    except Exception as e:
        print("failed", type(e).__name__, flush=True)
    finally:
        conn.close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''

CLIENT = '''
import socket, ssl, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
context = None
if mode == "tls":
    sni, ca = sys.argv[4], sys.argv[5]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=ca)
while True:
    try:
        conn = socket.create_connection((host, port), timeout=5)
        if context is not None:
            conn = context.wrap_socket(conn, server_hostname=sni)
        conn.sendall(b"hello\\n")
        print("got", conn.recv(64).decode().strip() or "nothing", flush=True)
        conn.close()
    except Exception as e:
        print("error", type(e).__name__, flush=True)
    time.sleep(0.2)
'''


def _service(name: str, port: int, app_protocol: str | None = None) -> str:
    protocol = f", appProtocol: {app_protocol}" if app_protocol else ""
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{app: {name}}}
  ports: [{{port: {port}, targetPort: 8080{protocol}}}]
"""


def _tcp_route(a: int, b: int) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {{name: db-split, namespace: {NS}}}
spec:
  parentRefs: [{{name: db, kind: Service, group: core, port: 5432}}]
  rules:
  - backendRefs: [{{name: db-a, port: 5432, weight: {a}}}, {{name: db-b, port: 5432, weight: {b}}}]
"""


TLS_ROUTES = f"""
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: exact-a, namespace: {NS}}}
spec:
  hostnames: [a.example.com]
  parentRefs: [{{name: tls, kind: Service, group: core, port: 443}}]
  rules:
  - backendRefs: [{{name: tls-a, port: 443}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: wildcard-b, namespace: {NS}}}
spec:
  hostnames: ["*.example.org"]
  parentRefs: [{{name: tls, kind: Service, group: core, port: 443}}]
  rules:
  - backendRefs: [{{name: tls-b, port: 443}}]
"""


def _certificates() -> tuple[str, str, str]:
    """A CA, and a server certificate it signed for a.example.com and *.example.org: (ca, cert, key) in PEM."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stream-routes test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(hours=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tls")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("a.example.com"),
                                                        x509.DNSName("*.example.org")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem).decode(), cert.public_bytes(pem).decode(), key_pem.decode()


def _pods(p: uplab.Platform, name: str) -> list[dict]:
    return [x for x in p.pods(NS) if x["metadata"]["name"].rsplit("-", 2)[0] == name]


def _log(p: uplab.Platform, name: str) -> list[str]:
    (pod,) = _pods(p, name)
    return str(p.tether("logs", "-n", NS, pod["metadata"]["name"], ok=None).stdout).splitlines()  # none yet: []


def _metrics(p: uplab.Platform, name: str) -> list[str]:
    (pod,) = _pods(p, name)
    return p.proxy_metrics(pod).splitlines()


def _all_ready(p: uplab.Platform, *names: str) -> None:
    for name in names:
        try:
            wait_for(f"the {name} pod ready", lambda n=name: [x for x in _pods(p, n) if ready(x)], timeout=90)
        except AssertionError as exc:
            pods = p.tether("get", "pods", "-n", NS, ok=None).stdout
            logs = [p.tether("logs", "-n", NS, x["metadata"]["name"], ok=None).stdout for x in _pods(p, name)]
            raise AssertionError(f"{exc}\n{pods}\n{logs}") from None


def _only(p: uplab.Platform, client: str, backend: str, runs: int = 10) -> Callable[[], bool]:
    """True once the client's last ``runs`` connections all reached ``backend``."""
    def check() -> bool:
        got = [line for line in _log(p, client) if line.startswith(("got ", "error "))]
        return len(got) >= runs and all(line == f"got {backend}" for line in got[-runs:])
    return check


def test_a_tcproute_sends_connections_by_weight_and_follows_a_switch(running: uplab.Platform) -> None:
    p = running
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    for name in ("db", "db-a", "db-b"):
        p.apply(_service(name, 5432, "linkerd.io/tcp") + "---" + uplab.script_deployment(name, NS, SERVER, "tcp", name, port=8080))
    _all_ready(p, "db", "db-a", "db-b")
    p.apply(_tcp_route(0, 1))  # before the client's first connection
    p.apply(uplab.script_deployment("tcp-client", NS, CLIENT, "tcp", f"db.{NS}.svc.cluster.local", "5432"))
    _all_ready(p, "tcp-client")
    wait_for("connections at db-b", _only(p, "tcp-client", "db-b"), timeout=90)
    p.apply(_tcp_route(1, 0))
    wait_for("connections switched to db-a", _only(p, "tcp-client", "db-a"), timeout=60)
    served = {name: sum(line.startswith("served hello") for line in _log(p, name)) for name in ("db", "db-a", "db-b")}
    assert served["db"] == 0 and served["db-a"] >= 10 and served["db-b"] >= 10, served
    metrics = _metrics(p, "tcp-client")
    opened = [line for line in metrics if line.startswith("outbound_tcp_route_open_total{")
              and 'route_kind="TCPRoute"' in line and 'route_name="db-split"' in line]
    assert opened and 'parent_name="db"' in opened[0] and 'target_port="5432"' in opened[0], opened
    closed = [line for line in metrics if line.startswith("outbound_tcp_route_close_total{")
              and 'route_name="db-split"' in line and 'error=""' in line]
    assert closed, [line for line in metrics if "tcp_route" in line]


def test_tlsroutes_send_tls_by_sni_to_the_right_backend(running: uplab.Platform) -> None:
    p = running
    ca, cert, key = _certificates()
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    for name in ("tls", "tls-a", "tls-b"):
        p.apply(_service(name, 443) + "---" + uplab.script_deployment(name, NS, SERVER, "tls", name, cert, key, port=8080))
    _all_ready(p, "tls", "tls-a", "tls-b")
    p.apply(TLS_ROUTES)
    host = f"tls.{NS}.svc.cluster.local"
    for client, sni in (("sni-a", "a.example.com"), ("sni-b", "www.example.org"), ("sni-none", "c.example.net")):
        p.apply(uplab.script_deployment(client, NS, CLIENT, "tls", host, "443", sni, ca))
    _all_ready(p, "sni-a", "sni-b", "sni-none")
    wait_for("a.example.com at tls-a", _only(p, "sni-a", "tls-a"), timeout=90)
    wait_for("www.example.org at tls-b", _only(p, "sni-b", "tls-b"), timeout=60)
    refused = _log(p, "sni-none")
    assert refused and not any(line.startswith("got ") for line in refused), refused[-5:]
    assert not any(line.startswith("served") for line in _log(p, "tls")), "the parent's pod took a connection"
    opened = [line for line in _metrics(p, "sni-a") if line.startswith("outbound_tls_route_open_total{")]
    assert any('route_kind="TLSRoute"' in line and 'route_name="exact-a"' in line and 'parent_name="tls"' in line
               for line in opened), opened
