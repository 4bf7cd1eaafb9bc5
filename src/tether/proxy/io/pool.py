"""Idle upstream HTTP/1 connections, kept per endpoint for the next request (the driver's, like its sockets).

A connection goes back in the pool after a request when both ends allow
keep-alive; ``take`` hands out the most recently used one still open with
nothing unread (a server that closed or spoke out of turn is dropped). An
idle connection is closed after ``idle_timeout`` (the driver keeps one pool
per direction, each with its configured timeout) and each key keeps at most
``max_idle``. The key is the ``Connect`` command's address and TLS, so two
endpoints, or one reached with and without mTLS, never share a connection.

Caller: ``tether.proxy.io.driver`` (``Checkout``/``Checkin``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tether.proxy.core.http_commands import Upstream

IDLE_TIMEOUT = 3.0  # seconds: Linkerd's default (LINKERD2_PROXY_*_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT)
MAX_IDLE = 100  # per key


class Pool:
    def __init__(self, idle_timeout: float = IDLE_TIMEOUT, max_idle: int = MAX_IDLE) -> None:
        # key -> idle connections with the loop time they went idle, oldest first
        self._idle: dict[object, list[tuple[Upstream, float]]] = {}
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle
        self._sweeper: asyncio.TimerHandle | None = None  # one timer for the pool, not one per check-in

    def take(self, key: object) -> Upstream | None:
        entries = self._idle.get(key)
        while entries:
            up, _ = entries.pop()
            if _usable(up.io):
                up.reused = True
                up.elapsed = 0.0
                return up
            up.io.transport.close()
        return None

    def put(self, up: Upstream) -> None:
        stream = up.io
        if not _usable(stream):
            stream.transport.close()
            return
        entries = self._idle.setdefault(up.key, [])
        if len(entries) >= self._max_idle:
            old, _ = entries.pop(0)
            old.io.transport.close()
        loop = asyncio.get_running_loop()
        entries.append((up, loop.time()))
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._idle_timeout, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_timeout``; come back while any are left."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        horizon = loop.time() - self._idle_timeout
        left = False
        for key in list(self._idle):
            entries = self._idle[key]
            while entries and entries[0][1] <= horizon:
                entries.pop(0)[0].io.transport.close()
            if entries:
                left = True
            else:
                del self._idle[key]
        if left:
            self._sweeper = loop.call_later(self._idle_timeout / 2, self._sweep)

    def close(self) -> None:
        """Close every idle connection (shutdown, or a test settling its metrics)."""
        idle, self._idle = self._idle, {}
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for entries in idle.values():
            for up, _ in entries:
                up.io.transport.close()


def _usable(stream: Any) -> bool:
    return not (stream.lost or stream.eof or stream.buffer or stream.transport.is_closing())
