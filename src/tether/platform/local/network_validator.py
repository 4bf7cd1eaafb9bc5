"""Proving a pod's outbound redirection works, as Linkerd's ``linkerd-network-validator`` does.

Role: listen on the proxy's outbound address (``0.0.0.0:4140``), connect to an address nothing
should answer (``1.1.1.1:20001``), and succeed only if that connection lands on our own listener:
the listener writes a random 63-character token (plus a newline) to every connection and the
client must read back exactly that token within the timeout.  That happens only when the nat
``OUTPUT`` rules (from proxy-init or the CNI plugin) redirect the connection to the listener.
One thread, non-blocking sockets and one selector, so the overall deadline bounds every step.

Caller: ``tether network-validator`` (``tether.cli.network_validator``), the CNI-mode init
container rendered by ``tether.injector``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import secrets
import selectors
import socket
import string
import time
from dataclasses import dataclass

TOKEN_LENGTH = 63
_ALPHANUMERIC = string.ascii_letters + string.digits


class ValidationFailed(Exception):
    """Redirection is not in place (or could not be checked); the message says what happened."""


@dataclass(frozen=True)
class SocketAddr:
    """An ``IP:port`` (``[IPv6]:port``), as Rust's ``SocketAddr`` parses it."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @classmethod
    def parse(cls, text: str) -> SocketAddr:
        host, sep, port = text.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
            number = int(port, 10)
        except ValueError:
            ip, number = None, -1
        if not sep or ip is None or not (0 <= number <= 65535) or bracketed != (ip.version == 6):
            raise ValueError(f"{text!r} is not an IP:port socket address (e.g. 1.1.1.1:20001 or [fd00::1]:20001)")
        return cls(ip, number)

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if self.ip.version == 6 else socket.AF_INET

    @property
    def sockaddr(self) -> tuple[str, int]:
        return (str(self.ip), self.port)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.ip.version == 6 else f"{self.ip}:{self.port}"


def new_token() -> bytes:
    return ("".join(secrets.choice(_ALPHANUMERIC) for _ in range(TOKEN_LENGTH)) + "\n").encode()


def validate(listen: SocketAddr, connect: SocketAddr, timeout: float, log: logging.Logger | None = None) -> None:
    """Return when a connection to ``connect`` reaches our listener on ``listen``; else raise ``ValidationFailed``."""
    log = log or logging.getLogger(__name__)
    deadline = time.monotonic() + timeout
    token = new_token()
    log.debug("token=%s", token.decode().strip())
    with (
        socket.socket(listen.family, socket.SOCK_STREAM) as listener,
        socket.socket(connect.family, socket.SOCK_STREAM) as client,
    ):
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(listen.sockaddr)
            listener.listen(16)
        except OSError as err:
            raise ValidationFailed(f"cannot listen on {listen}: {err.strerror or err}") from None
        listener.setblocking(False)
        log.info("Listening for connections on %s", listen)

        client.setblocking(False)
        log.info("Connecting to %s", connect)
        code = client.connect_ex(connect.sockaddr)
        if code not in (0, errno.EINPROGRESS):
            raise ValidationFailed(_connect_failed(connect, listen, code))
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ, "accept")
            selector.register(client, selectors.EVENT_WRITE, "connected")
            received = b""
            connected = False
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ValidationFailed(_timed_out(connect, listen, timeout, connected, received))
                for key, _ in selector.select(remaining):
                    if key.data == "accept":
                        _answer(listener, token, remaining, log)
                    elif key.data == "connected":
                        code = client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if code:
                            raise ValidationFailed(_connect_failed(connect, listen, code))
                        connected = True
                        log.debug("Connected from %s", _format(client.getsockname()))
                        selector.modify(client, selectors.EVENT_READ, "read")
                    else:
                        try:
                            chunk = client.recv(4096)
                        except BlockingIOError:
                            continue
                        except OSError as err:
                            raise ValidationFailed(f"reading from {connect} failed: {err.strerror or err}") from None
                        received += chunk
                        log.debug("Read %d bytes from server", len(chunk))
                        if len(received) >= len(token) or not chunk:
                            _check(received[: len(token)], token, connect, listen)
                            log.info("Validated")
                            return


def _answer(listener: socket.socket, token: bytes, remaining: float, log: logging.Logger) -> None:
    """Accept one connection, write the token, close it."""
    try:
        conn, peer = listener.accept()
    except BlockingIOError:
        return
    with conn:
        log.debug("Accepted connection from %s", _format(peer))
        conn.settimeout(remaining)
        try:
            conn.sendall(token)
            log.debug("Wrote %d bytes to client", len(token))
        except OSError as err:
            log.error("Failed to write bytes to client: %s", err)


def _check(data: bytes, token: bytes, connect: SocketAddr, listen: SocketAddr) -> None:
    if data != token:
        raise ValidationFailed(
            f"the connection to {connect} reached something other than this validator's listener on {listen} "
            f"(expected its {len(token)}-byte token, got {data!r}): outbound TCP is not redirected to the proxy port"
        )


def _connect_failed(connect: SocketAddr, listen: SocketAddr, code: int) -> str:
    return (
        f"cannot connect to {connect}: {os.strerror(code)}; the connection was not redirected to {listen}, "
        "so the pod's iptables redirection (CNI plugin or proxy-init) is not in place"
    )


def _timed_out(connect: SocketAddr, listen: SocketAddr, timeout: float, connected: bool, received: bytes) -> str:
    if connected:
        what = f"connected to {connect} but got {len(received)} of the token's bytes"
    else:
        what = f"the connection to {connect} was neither established nor refused"
    return (
        f"failed to validate networking configuration within {timeout:g}s: {what}; connections are not being "
        f"redirected to {listen}, so the pod's iptables redirection (CNI plugin or proxy-init) is not in place"
    )


def _format(sockaddr: tuple) -> str:
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
