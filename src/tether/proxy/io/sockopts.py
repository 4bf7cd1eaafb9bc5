"""TCP socket options the proxy's configuration asks for (``core.config.TcpOptions``), as linkerd2-proxy sets them
through socket2: keep-alive probing after an idle time, and the user timeout (Linux)."""

from __future__ import annotations

import socket

from tether.proxy.core.config import TcpOptions


def apply(sock: socket.socket, options: TcpOptions) -> None:
    """Set ``options`` on ``sock``; a socket already dead is left to fail where it is used."""
    try:
        if options.keepalive is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            # Whole seconds, at least one: the kernel's unit for TCP_KEEPIDLE.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, round(options.keepalive.total_seconds())))
        if options.user_timeout is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            max(1, round(options.user_timeout.total_seconds() * 1000)))
    except OSError:
        pass
