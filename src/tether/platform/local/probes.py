"""Readiness, liveness and startup probes of local pods: TCP connects and HTTP GETs from inside the pod.

Each probe opens its socket inside the pod's network namespace (``setns(2)`` on the calling
thread only, then back), so it reaches the pod's address the way a process of the pod would:
through ``lo``, which proxy-init's rules leave alone, so probing an app port of a meshed pod
tests the app itself, and probing the proxy's admin port tests the proxy.  Blocking, with a
timeout; the sandbox runs them on a thread pool.  Caller: ``tether.platform.local.sandbox``.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ProbeSpec:
    """What to check: ``path`` None means a TCP connect, else an HTTP GET of that path."""

    port: int
    path: str | None = None
    timeout: float = 1.0
    host_header: str | None = None


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def socket_in(netns: str) -> socket.socket:
    """A TCP socket that lives in ``netns`` (made there by this thread, which then returns home)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                _setns(home)
        finally:
            os.close(target)
    finally:
        os.close(home)


def run(netns: str, address: str, probe: ProbeSpec) -> bool:
    """Whether ``probe`` succeeds against ``address`` in ``netns`` (HTTP: a 2xx or 3xx status)."""
    try:
        sock = socket_in(netns)
    except OSError:
        return False
    with sock:
        sock.settimeout(probe.timeout)
        try:
            sock.connect((address, probe.port))
            if probe.path is None:
                return True
            host = probe.host_header or f"{address}:{probe.port}"
            sock.sendall(
                f"GET {probe.path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tether-probe/1.0\r\n"
                "Accept: */*\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            head = b""
            while b"\r\n" not in head and len(head) < 1024:
                chunk = sock.recv(1024)
                if not chunk:
                    break
                head += chunk
        except OSError:
            return False
    parts = head.split(b"\r\n", 1)[0].split()
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() and 200 <= int(parts[1]) < 400
