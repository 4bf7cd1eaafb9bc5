"""haproxy and haproxy-tcp: the same path through two HAProxy instances from Debian.

haproxy: HTTP mode on both sides, one thread each, keep-alive on every hop and
idle server connections shared between clients (``http-reuse always``) and
kept for an hour as Envoy's are (``pool-purge-delay 1h``), mTLS
TLS 1.3 only between the two with the P-256 certificates, each side checking
the other's identity (client side: the server's SAN via ``verifyhost``; server
side: the client certificate's chain, and its CN once per connection).

haproxy-tcp: TCP mode on both sides, the same TLS in between; every client
connection gets its own TLS connection and backend connection. The stretch
reference for tether-tcp.

haproxy-h2 and haproxy-grpc: HTTP mode with HTTP/2 on every hop: h2c from
the load (``proto h2`` on the client side's bind), HTTP/2 over the mTLS hop
(ALPN ``h2`` on both ends) and h2c to nginx (``proto h2`` on the server line).
"""

from __future__ import annotations

import csv
import io
import socket
import subprocess
from pathlib import Path
from typing import ClassVar

from bench.dataplane.procs import which
from bench.dataplane.variants.base import LOOPBACK, Check, Context, Plan, ProxySpec, Variant, reused, tls13_probe


def haproxy_binary() -> Path | None:
    return which("haproxy")


_SUITES = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"


def _global(sock: Path) -> str:
    return f"""\
global
    nbthread 1
    maxconn 8000
    stats socket {sock} mode 600 level admin
    ssl-server-verify required
    # Prefer AES-128-GCM as BoringSSL (Envoy) does; OpenSSL's default puts AES-256 first.
    ssl-default-bind-ciphersuites {_SUITES}
    ssl-default-server-ciphersuites {_SUITES}

defaults
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout http-keep-alive 1h
    timeout http-request 1h
    maxconn 8000
"""


def haproxy_configs(ctx: Context, mode: str, client_port: int, server_port: int,
                    h2: bool = False) -> tuple[str, str]:
    """The client-side and server-side configs for ``mode`` "http" or "tcp" (pure: tested without HAProxy);
    ``h2``: HTTP/2 on every hop (HTTP mode only)."""
    certs = ctx.certs
    http = mode == "http"
    assert http or not h2, "HTTP/2 needs HTTP mode"
    h2c = " proto h2" if h2 else ""
    alpn = " alpn h2" if h2 else ""
    mode_lines = "    mode http\n    option http-keep-alive\n" if http else "    mode tcp\n"
    reuse = "    http-reuse always\n" if http else ""
    # Idle server connections live as long as Envoy's (idle_timeout 1 h). With HAProxy's default
    # (half of them closed every 5 s) each burst re-opens mTLS connections, and 32 handshakes queued on
    # one CPU stall requests for ~100 ms: p99 at 1,000 req/s went from 30-50 ms to 5-8 ms with this.
    keep = " pool-purge-delay 1h" if http else ""
    client = (
        _global(ctx.workdir / "client.sock")
        + mode_lines
        + f"""
frontend outbound
    bind {LOOPBACK}:{client_port}{h2c}
    default_backend peer

backend peer
{reuse}    server peer {LOOPBACK}:{server_port} ssl crt {certs.client.bundle} ca-file {certs.anchor} verify required \
verifyhost {certs.server.name} sni str({certs.server.name}) ssl-min-ver TLSv1.3 ssl-max-ver TLSv1.3{alpn}{keep}
"""
    )
    backend_host, backend_port = ctx.backend
    server = (
        _global(ctx.workdir / "server.sock")
        + mode_lines
        + f"""
frontend inbound
    bind {LOOPBACK}:{server_port} ssl crt {certs.server.bundle} ca-file {certs.anchor} verify required \
ssl-min-ver TLSv1.3 ssl-max-ver TLSv1.3{alpn}
    tcp-request session reject unless {{ ssl_c_s_dn(CN) -m str {certs.client.name} }}
    default_backend app

backend app
{reuse}    server app {backend_host}:{backend_port}{h2c}{keep}
"""
    )
    return client, server


class _HAProxy(Variant):
    mode: ClassVar[str]

    @classmethod
    def available(cls) -> str | None:
        return None if haproxy_binary() else "haproxy not found: run dev/bench-setup.sh (Debian package haproxy)"

    @classmethod
    def version(cls) -> str:
        binary = haproxy_binary()
        if binary is None:
            return ""
        out = subprocess.run([str(binary), "-v"], capture_output=True, text=True).stdout.split()
        return out[2] if len(out) > 2 else ""

    def plan(self, ctx: Context) -> Plan:
        binary = haproxy_binary()
        assert binary is not None
        client_port, server_port = ctx.port(), ctx.port()
        client, server = haproxy_configs(ctx, self.mode, client_port, server_port, h2=self.load != "http1")

        def spec(role: str, config: str, port: int) -> ProxySpec:
            return ProxySpec(role, [str(binary), "-db", "-f", str(ctx.workdir / f"{role}.cfg")], (LOOPBACK, port),
                             files={f"{role}.cfg": config})

        return Plan(proxies=[spec("server", server, server_port), spec("client", client, client_port)],
                    entry=(LOOPBACK, client_port), meta={"server_port": server_port})

    def verify(self, ctx: Context) -> list[Check]:
        assert self.plan_ is not None
        server_port = int(self.plan_.meta["server_port"])
        checks: list[Check] = []
        try:
            client_stats = show_stat(ctx.workdir / "client.sock")
            server_info = show_info(ctx.workdir / "server.sock")
            peer = client_stats.get(("peer", "BACKEND"), {})
            inbound = show_stat(ctx.workdir / "server.sock").get(("inbound", "FRONTEND"), {})
        except OSError as e:
            return [Check("HAProxy stats socket readable", False, str(e))]
        handshakes = int(server_info.get("CumSslConns", "0") or 0)
        if self.mode == "http":
            connects = int(peer.get("connect", "0") or 0)
            reuses = int(peer.get("reuse", "0") or 0)
            requests = int(inbound.get("req_tot", "0") or 0)
            checks.append(Check("HAProxy reused mTLS connections (client side backend)",
                                reused(connects, requests),
                                f"connect={connects}, reuse={reuses}; server side: {handshakes} TLS handshakes "
                                f"for {requests} requests"))
        else:
            sessions = int(inbound.get("stot", "0") or 0)
            checks.append(Check("HAProxy TCP: one TLS connection per client connection",
                                sessions > 0 and handshakes <= sessions + 8,
                                f"{handshakes} TLS handshakes for {sessions} sessions"))
        return checks + tls13_probe(LOOPBACK, server_port, ctx.certs)


def _admin(sock: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def show_stat(sock: Path) -> dict[tuple[str, str], dict[str, str]]:
    """``show stat`` as ``{(proxy, server-or-FRONTEND/BACKEND): {field: value}}``."""
    text = _admin(sock, "show stat").lstrip("# ")
    return {(row["pxname"], row["svname"]): row for row in csv.DictReader(io.StringIO(text))}


def show_info(sock: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _admin(sock, "show info").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class HAProxyHTTP(_HAProxy):
    name = "haproxy"
    description = "load -> HAProxy -> mTLS (TLS 1.3, P-256) -> HAProxy -> nginx; HTTP mode, one thread each, reuse on"
    mode = "http"


class HAProxyTCP(_HAProxy):
    name = "haproxy-tcp"
    description = "load -> HAProxy -> mTLS (TLS 1.3, P-256) -> HAProxy -> nginx; TCP mode, one thread each"
    mode = "tcp"


class HAProxyH2(_HAProxy):
    name = "haproxy-h2"
    description = ("h2load -> HAProxy -> mTLS (TLS 1.3, ALPN h2) -> HAProxy -> nginx; HTTP mode, HTTP/2 on every "
                   "hop, one thread each")
    mode = "http"
    load = "h2"


class HAProxyGrpc(_HAProxy):
    name = "haproxy-grpc"
    description = ("h2load (gRPC unary) -> HAProxy -> mTLS (TLS 1.3, ALPN h2) -> HAProxy -> nginx; HTTP mode, "
                   "HTTP/2 on every hop")
    mode = "http"
    load = "grpc"
