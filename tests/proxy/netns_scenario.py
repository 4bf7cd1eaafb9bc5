"""Run inside a fresh network namespace (``unshare --net``, as root) by test_proxy_netns.py.

Real iptables redirection, so the proxies read real ``SO_ORIGINAL_DST`` records:

1. ``original_dst`` itself: IPv4 (also through a dual-stack ``[::]`` listener,
   where the peer is IPv4-mapped) and IPv6.
2. A mesh in one namespace: pods' addresses on ``lo``, services routed but
   owned by nobody. nat OUTPUT rules play proxy-init: connections to the
   service go to the client proxy's outbound port; connections to the server
   pod's application ports go to its inbound port -- except those the server
   proxy makes from its own pod IP (to its app). The destination runs without
   transport-header mode, so meshed traffic reaches the server on the app's
   port and goes through inbound TLS detection there. Last, a rule that also
   catches the proxy's own connection: the proxy must refuse the loop.

Exits 0 on success, 77 when the namespace cannot be set up (no privileges, no
iptables), anything else on failure.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from proxy_harness import (  # noqa: E402
    BannerServer,
    Ca,
    EchoServer,
    Mesh,
    closed_without_answer,
    connection,
    identity_of,
    run,
    samples,
    scrape,
)

from tether.proxy.codec.addrs import parse_socket_addr  # noqa: E402
from tether.proxy.io.listeners import bind, local_addr, original_dst  # noqa: E402

SKIP = 77


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class PodAddresses:
    """Pods on 10.77.0.x (added to lo as they are handed out)."""

    def __init__(self) -> None:
        self._next = 1

    def ip(self) -> str:
        ip = f"10.77.0.{self._next}"
        self._next += 1
        sh("ip", "addr", "add", f"{ip}/32", "dev", "lo")
        return ip


def check_original_dst() -> None:
    for family, listen, target, rule in (
        (socket.AF_INET, "127.0.0.1:0", ("10.96.1.1", 80), ["iptables"]),
        (socket.AF_INET6, "[::]:0", ("10.96.1.2", 81), ["iptables"]),  # IPv4-mapped peer on a dual-stack socket
        (socket.AF_INET6, "[::1]:0", ("fd00:96::1", 82), ["ip6tables"]),
    ):
        listener = bind(parse_socket_addr(listen))
        port = listener.getsockname()[1]
        sh(*rule, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", target[0], "-j", "REDIRECT", "--to-ports", str(port))
        client = socket.socket(socket.AF_INET6 if ":" in target[0] else socket.AF_INET)
        client.connect(target)
        listener.setblocking(True)
        accepted, _ = listener.accept()
        got = original_dst(accepted)
        want = parse_socket_addr(f"[{target[0]}]:{target[1]}" if ":" in target[0] else f"{target[0]}:{target[1]}")
        assert got == want, (family, got, want)
        # A connection that was not redirected: no record, or (conntrack keeps one) the address it was sent to.
        direct = socket.create_connection(accepted.getsockname()[:2])
        other, _ = listener.accept()
        assert original_dst(other) in (None, local_addr(other))
        for s in (client, accepted, direct, other, listener):
            s.close()


async def mesh_scenario(tmp: Path) -> None:
    async with Mesh(tmp, addresses=PodAddresses(), transport_header=False) as mesh:
        server = mesh.pod("web-0", app="web", ports=[7000, 7001, 7443])
        client = mesh.pod("client-0", app="client")
        outsider = mesh.addresses.ip()  # an unmeshed client's address
        svc = mesh.service("web", [(7000, 7000)], ip="10.96.0.10")
        # proxy-init, in nat OUTPUT: the client pod's outbound, the server pod's inbound (its proxy exempt).
        sh("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", svc, "!", "-s", client.ip, "-j", "DNAT",
           "--to-destination", f"{client.ip}:4140")
        sh("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", server.ip, "-m", "multiport",
           "--dports", "7000,7001,7443", "!", "-s", server.ip, "-j", "DNAT", "--to-destination", f"{server.ip}:4143")
        b = await mesh.start_proxy(server, LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION="7001")
        # No extra listeners: only the kernel's redirection brings traffic to the client proxy.
        a = await mesh.start_proxy(client, LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS="10.0.0.0/8")
        app_ca = Ca.create(tmp / "app-ca")
        app_tls = app_ca.server_context("app.example")
        tls_server = await asyncio.start_server(_tls_echo, server.ip, 7443, ssl=app_tls)
        async with EchoServer(server.ip, 7000, "web-0"), BannerServer(server.ip, 7001):
            # 1. Meshed: app -> service address -> (DNAT) outbound -> mTLS to the pod's port -> (DNAT) inbound.
            async with connection(svc, 7000, local_addr=(outsider, 0)) as (reader, writer):
                writer.write(b"meshed")
                assert await reader.readline() == b"web-0\n"
                assert await reader.readexactly(6) == b"meshed"
            # 2. An unmeshed client, in plaintext, through the inbound proxy.
            async with connection(server.ip, 7000, local_addr=(outsider, 0)) as (reader, writer):
                writer.write(b"plain")
                assert await reader.readline() == b"web-0\n"
            # 3. An opaque port: a server-speaks-first protocol gets its banner out without any detection.
            async with connection(server.ip, 7001, local_addr=(outsider, 0)) as (reader, writer):
                assert await reader.readline() == b"220 tether.test ESMTP ready\r\n"
            # 4. TLS for another name passes through to the app untouched.
            try:
                ctx = ssl.create_default_context(cafile=str(app_ca.anchors_path))
                async with connection(server.ip, 7443, local_addr=(outsider, 0), ssl=ctx,
                                      server_hostname="app.example") as (reader, writer):
                    writer.write(b"app tls")
                    assert await reader.readexactly(7) == b"app tls"
            finally:
                tls_server.close()
            # 5. A client certificate from another CA, for our name: refused.
            stranger = Ca.create(tmp / "other-ca").client_context(identity_of("client"))
            stranger.load_verify_locations(cadata=mesh.ca.anchors_pem.decode())
            try:
                async with connection(server.ip, 7000, local_addr=(outsider, 0), ssl=stranger,
                                      server_hostname=server.identity) as (reader, writer):
                    writer.write(b"let me in")
                    assert await closed_without_answer(reader)
            except (ssl.SSLError, ConnectionError):
                pass
            # 6. A redirection that also catches the proxy's own connection (no UID exemption): the proxy
            #    recognises its own connection coming back and refuses it, instead of looping.
            sh("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "10.96.0.20", "-j", "DNAT",
               "--to-destination", f"{client.ip}:4140")
            async with connection("10.96.0.20", 7000, local_addr=(outsider, 0)) as (reader, writer):
                writer.write(b"round and round")
                assert await closed_without_answer(reader)
            await a.idle()
            await b.idle()
        inbound, outbound = await scrape(b), await scrape(a)
        assert samples(outbound, "outbound_tcp_errors_total", error="loop") == [
            ({"error": "loop", "target_addr": "10.96.0.20:7000", "target_ip": "10.96.0.20", "target_port": "7000"},
             1.0)]
        target = f"{server.ip}:7000"
        assert samples(outbound, "tcp_open_total", direction="outbound", peer="src", target_addr=f"{svc}:7000")
        assert samples(outbound, "tcp_open_total", direction="outbound", peer="dst", target_addr=target, tls="true",
                       server_id=server.identity)
        assert samples(inbound, "tcp_open_total", peer="src", target_addr=target, tls="true",
                       client_id=client.identity)
        assert samples(inbound, "tcp_open_total", peer="src", target_addr=target, tls="no_identity",
                       no_tls_reason="no_tls_from_remote")
        assert samples(inbound, "tcp_open_total", peer="src", target_addr=f"{server.ip}:7001",
                       no_tls_reason="port_skipped")
        assert samples(inbound, "tcp_open_total", peer="src", target_addr=f"{server.ip}:7443", tls="opaque",
                       sni="app.example")
        assert samples(inbound, "inbound_tcp_errors_total", error="untrusted client certificate")
        assert not samples(inbound, "inbound_tcp_transport_header_connections_total")


async def _tls_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


def main() -> int:
    tmp = Path(sys.argv[1])
    try:
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "route", "add", "10.96.0.0/16", "dev", "lo")
        sh("ip", "-6", "route", "add", "fd00:96::/64", "dev", "lo")
        sh("iptables", "-t", "nat", "-L", "-n")
        sh("ip6tables", "-t", "nat", "-L", "-n")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot set up the namespace: {exc}", file=sys.stderr)
        return SKIP
    check_original_dst()
    run(mesh_scenario(tmp))
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as exc:
        if exc.errno == errno.EPERM:
            sys.exit(SKIP)
        raise
