"""Listening sockets, the accept loop, and each connection's original destination (proxy.md §3).

``bind`` opens a non-blocking listening socket. ``original_dst`` reads
``SO_ORIGINAL_DST`` (``SOL_IP``, option 80, for IPv4 peers -- IPv4-mapped IPv6
ones included -- and ``IP6T_SO_ORIGINAL_DST``, ``SOL_IPV6`` option 80, for
IPv6), which iptables' REDIRECT records. A connection without that record was
not redirected: Linkerd refuses it; with ``TETHER_PROXY_ORIG_DST_FALLBACK=local-addr``
the address the client connected to stands for the original destination
(direct addressing, for running without iptables).

``Listener.serve`` accepts until cancelled, handing each socket (with
``TCP_NODELAY`` set, and the listener's accept options: keep-alive and user
timeout, ``io.sockopts``) to a callback that must not block. As linkerd2-proxy's
listeners (its ``ServerConfig``: keep-alive, user timeout, backlog), the
inbound, admin and tap listeners take ``LINKERD2_PROXY_INBOUND_ACCEPT_*`` and
``_INBOUND_TCP_LISTEN_BACKLOG``, the outbound ones the outbound variables.

Callers: ``tether.proxy.app``, ``io.grpc_server`` (the tap server).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import struct
from collections.abc import Awaitable, Callable

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core.config import TcpOptions
from tether.proxy.io import sockopts

log = logging.getLogger(__name__)

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same number
_SOCKADDR_IN = struct.Struct("!2xH4s8x")  # family (host order, skipped), port, address, zero padding
_SOCKADDR_IN6 = struct.Struct("!2xH4x16s4x")  # family, port, flow info, address, scope id
BACKLOG = 1024


def bind(addr: SocketAddr, backlog: int = BACKLOG) -> socket.socket:
    """A listening, non-blocking socket on ``addr`` (port 0: any free port)."""
    family = socket.AF_INET6 if addr.ip.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and addr.ip == ipaddress.IPv6Address("::"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # [::] takes IPv4 too, as Linkerd's
        sock.bind((str(addr.ip), addr.port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def local_addr(sock: socket.socket) -> SocketAddr:
    host, port = sock.getsockname()[:2]
    return SocketAddr(_unmapped(ipaddress.ip_address(host)), port)


def peer_addr(sock: socket.socket) -> SocketAddr | None:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return None
    return SocketAddr(_unmapped(ipaddress.ip_address(host)), port)


def original_dst(sock: socket.socket) -> SocketAddr | None:
    """The destination the client asked for before iptables redirected it; None if it was not redirected."""
    try:
        if sock.family == socket.AF_INET6:
            peer = peer_addr(sock)
            if peer is not None and peer.ip.version == 6:
                raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, _SOCKADDR_IN6.size)
                port, packed = _SOCKADDR_IN6.unpack(raw[: _SOCKADDR_IN6.size])
                return SocketAddr(ipaddress.IPv6Address(packed), port)
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, _SOCKADDR_IN.size)
        port, packed = _SOCKADDR_IN.unpack(raw[: _SOCKADDR_IN.size])
        return SocketAddr(ipaddress.IPv4Address(packed), port)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOPROTOOPT):
            return None  # no NAT record for this connection: it was not redirected
        raise


def _unmapped(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class Listener:
    """A bound socket and the loop accepting on it."""

    def __init__(self, name: str, sock: socket.socket, accept: TcpOptions = TcpOptions()) -> None:
        self.name = name
        self.sock = sock
        self.accept = accept  # set on every connection accepted (io.sockopts)
        self.addr = local_addr(sock)
        self.failing = False  # the last accept failed for want of descriptors or memory (readiness says so)

    async def serve(self, handle: Callable[[socket.socket], None],
                    room: Callable[[], Awaitable[None]] | None = None) -> None:
        """Accept until cancelled; ``handle`` gets each connection's socket and must return at once.
        ``room``: awaited before each accept (the proxy's bound on open connections)."""
        loop = asyncio.get_running_loop()
        while True:
            if room is not None:
                await room()
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:
                # Out of descriptors, or a connection reset before accept: keep serving the others.
                log.warning("%s listener: accept failed: %s", self.name, exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.failing = True
                    await asyncio.sleep(0.1)
                continue
            self.failing = False
            conn.setblocking(False)
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                conn.close()
                continue
            sockopts.apply(conn, self.accept)
            handle(conn)

    def close(self) -> None:
        self.sock.close()
