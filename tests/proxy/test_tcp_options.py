"""TCP keep-alive, user timeout and listen backlog from ``LINKERD2_PROXY_{INBOUND,OUTBOUND}_{ACCEPT,CONNECT}_*``
and ``_TCP_LISTEN_BACKLOG`` (proxy.md §2.2, §2.5, §2.6; Linkerd's chart sets the keep-alives and user timeouts
on every injected proxy). The admin and tap listeners take the inbound ones, as linkerd2-proxy's
(``linkerd/app/src/env.rs`` builds their ``ServerConfig`` from the inbound server's).

Both proxies run in this process, so the test reads the options the kernel holds for every TCP socket of the
process (through a duplicate of each descriptor) and finds each of the four connections a request makes by
its addresses; a listening socket's backlog is ``TCP_INFO``'s ``tcpi_sacked`` (the kernel's
``sk_max_ack_backlog`` for a socket in ``LISTEN``).
"""

from __future__ import annotations

import os
import socket
import struct
from datetime import timedelta
from pathlib import Path

import pytest
from proxy_harness import EchoServer, Mesh, connection, identity_of, run

from tether.proxy.core.config import ConfigError, ProxyConfig, TcpOptions

Addr = tuple[str, int]
TCP_LISTEN = 10  # include/net/tcp_states.h


def _tcp_sockets() -> dict[tuple[Addr, Addr], tuple[int | None, int]]:
    """(local, peer) of every connected TCP socket of this process: (TCP_KEEPIDLE if keep-alive is on, else
    None; TCP_USER_TIMEOUT in ms)."""
    found = {}
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # not a socket (or gone)
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            local, peer = sock.getsockname()[:2], sock.getpeername()[:2]
            keepalive = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) if keepalive else None
            found[(local, peer)] = (idle, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        except OSError:
            continue  # a listener (no peer), or closed meanwhile
        finally:
            sock.close()
    return found


def _listen_backlog(addr: Addr) -> int:
    """The backlog of this process' listening TCP socket on ``addr``."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            if info[0] == TCP_LISTEN and sock.getsockname()[:2] == addr:
                return int(struct.unpack_from("=I", info, 28)[0])  # tcpi_sacked, after 8 bytes and 5 u32
        except OSError:
            continue
        finally:
            sock.close()
    raise AssertionError(f"no listening socket on {addr}")


def _one(sockets: dict[tuple[Addr, Addr], tuple[int | None, int]], *, local: Addr | None = None,
         peer: Addr | None = None) -> tuple[int | None, int]:
    matches = [v for (lo, pe), v in sockets.items() if local in (None, lo) and peer in (None, pe)]
    assert len(matches) == 1, (local, peer, sockets)
    return matches[0]


def test_each_side_sets_its_own_options_on_the_sockets_it_accepts_and_opens(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, _, _ = await mesh.two_proxies(
                "echo", 7000,
                server_env={"LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE": "7s",
                            "LINKERD2_PROXY_INBOUND_CONNECT_KEEPALIVE": "9000ms",
                            "LINKERD2_PROXY_INBOUND_CONNECT_USER_TIMEOUT": "4s"},
                client_env={"LINKERD2_PROXY_OUTBOUND_ACCEPT_KEEPALIVE": "11s",
                            "LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE": "13s",
                            "LINKERD2_PROXY_OUTBOUND_CONNECT_USER_TIMEOUT": "30s"})
            async with EchoServer(server.ip, 7000), connection(svc, 7000) as (reader, writer):
                writer.write(b"hello")
                assert await reader.readexactly(5) == b"hello"
                sockets = _tcp_sockets()
                assert _one(sockets, peer=(svc, 7000)) == (None, 0)  # the test's own client: untouched
                assert _one(sockets, local=(svc, 7000)) == (11, 0)  # the client proxy accepted it
                assert _one(sockets, peer=(server.ip, 4143)) == (13, 30_000)  # the client proxy's to the peer
                assert _one(sockets, local=(server.ip, 4143)) == (7, 0)  # the server proxy accepted it
                assert _one(sockets, peer=(server.ip, 7000)) == (9, 4_000)  # the server proxy's to the app

    run(scenario())


def test_the_options_and_the_backlog_are_parsed_as_linkerd_spells_them(minimal_env: dict[str, str]) -> None:
    config = ProxyConfig.from_env(dict(minimal_env, LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE="10000ms",
                                       LINKERD2_PROXY_INBOUND_ACCEPT_USER_TIMEOUT="30s",
                                       LINKERD2_PROXY_OUTBOUND_TCP_LISTEN_BACKLOG="64"))
    assert config.inbound.accept == TcpOptions(timedelta(seconds=10), timedelta(seconds=30))
    assert config.inbound.connect == config.outbound.accept == config.outbound.connect == TcpOptions()
    assert (config.inbound.listen_backlog, config.outbound.listen_backlog) == (1024, 64)
    with pytest.raises(ConfigError, match="LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE"):
        ProxyConfig.from_env(dict(minimal_env, LINKERD2_PROXY_OUTBOUND_CONNECT_KEEPALIVE="0s"))
    with pytest.raises(ConfigError, match="LINKERD2_PROXY_INBOUND_TCP_LISTEN_BACKLOG"):
        ProxyConfig.from_env(dict(minimal_env, LINKERD2_PROXY_INBOUND_TCP_LISTEN_BACKLOG="-1"))


def test_the_admin_and_tap_listeners_take_the_inbound_accept_options_and_backlog(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web")
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_INBOUND_ACCEPT_KEEPALIVE="7s",
                                           LINKERD2_PROXY_INBOUND_ACCEPT_USER_TIMEOUT="3s",
                                           LINKERD2_PROXY_INBOUND_TCP_LISTEN_BACKLOG="77",
                                           LINKERD2_PROXY_OUTBOUND_TCP_LISTEN_BACKLOG="66",
                                           LINKERD2_PROXY_TAP_SVC_NAME=identity_of("tap", "linkerd-viz"),
                                           LINKERD2_PROXY_CONTROL_LISTEN_ADDR=f"{pod.ip}:4190")
            assert proxy.tap is not None
            await proxy.tap.serving.wait()
            backlogs = {port: _listen_backlog((pod.ip, port)) for port in (4143, 4191, 4190, 4140)}
            assert backlogs == {4143: 77, 4191: 77, 4190: 77, 4140: 66}  # inbound, admin, tap; outbound
            async with connection(pod.ip, 4191) as (reader, writer):
                writer.write(b"GET /live HTTP/1.1\r\nhost: admin\r\n\r\n")
                await reader.readuntil(b"live\n")  # answered: accepted, its options set
                tap_client = mesh.ca.client_context(identity_of("tap", "linkerd-viz"), alpn=["h2"])
                async with connection(pod.ip, 4190, ssl=tap_client, server_hostname=pod.identity):
                    sockets = _tcp_sockets()  # the TLS handshake is over: the tap server accepted it
                    assert _one(sockets, local=(pod.ip, 4191)) == (7, 3_000)
                    assert _one(sockets, local=(pod.ip, 4190)) == (7, 3_000)
                    assert _one(sockets, peer=(pod.ip, 4191)) == (None, 0)  # the test's own clients: untouched
                    assert _one(sockets, peer=(pod.ip, 4190)) == (None, 0)

    run(scenario())
