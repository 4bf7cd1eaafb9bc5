"""The app's ports the inbound proxy could not connect to, reconnected with backoff (``core.inbound_queue``).

When an HTTP/2 connect to an app port fails, ``AppPorts.unreachable`` makes
the port a ``WaitingBalancer`` with no endpoint (its requests wait in its
queue, ``core.balancer_queue``) and starts reconnecting to it, as
linkerd2-proxy's inbound HTTP/2 client does: the n-th try after
``LINKERD2_PROXY_INBOUND_CONNECT_EXP_BACKOFF_*`` (100 ms doubling to 10 s,
jitter 0.1), each within ``LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT``. The
first connect that succeeds puts the endpoint back, which sends the waiting
requests on, and the port leaves the map. The try's connection is closed at
once: linkerd2-proxy keeps it as the HTTP/2 client's, but here HTTP/2
connections to the app belong to the client's connection
(``core.http2_proxy``), so each waiting request's connection opens its own.

A port nobody has asked for during ``LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT``
(linkerd2-proxy evicts its per-target client after that long idle) is let go:
no more tries; the next failed connect starts again.

Caller: ``tether.proxy.app`` (``InboundSettings.app_ports``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core.balancer import Balancer
from tether.proxy.core.config import Backoff
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.io.discovery import WaitingBalancer

log = logging.getLogger(__name__)


async def connects(target: SocketAddr, timeout: float) -> bool:
    """Whether a TCP connection to ``target`` opens within ``timeout`` (closed at once)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(str(target.ip), target.port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


class AppPorts:
    """``core.inbound_queue.AppPorts``: each unreachable app port, reconnected in the background."""

    def __init__(self, *, failfast: float, backoff: Backoff, connect_timeout: float, idle_timeout: float,
                 clock: Callable[[], float], rng: random.Random | None = None,
                 probe: Callable[[SocketAddr, float], Awaitable[bool]] = connects) -> None:
        self.unreachable_ports: dict[SocketAddr, Balancer] = {}
        self._failfast = failfast
        self._backoff = backoff
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._rng = rng or random.Random()
        self._probe = probe
        self._tasks: dict[SocketAddr, asyncio.Task[None]] = {}

    def unreachable(self, target: SocketAddr) -> None:
        if target in self.unreachable_ports:
            return  # already reconnecting: its failfast runs from the first failure
        log.info("app port %s unreachable: HTTP/2 requests wait for it while it is reconnected", target)
        balancer = WaitingBalancer(failfast=self._failfast, clock=self._clock)  # empty from now on
        self.unreachable_ports[target] = balancer
        self._tasks[target] = asyncio.get_running_loop().create_task(self._reconnect(target, balancer))

    async def _reconnect(self, target: SocketAddr, balancer: Balancer) -> None:
        failures = 0
        asked, asked_at = balancer.queue.requests, self._clock()
        try:
            while True:
                failures += 1
                await asyncio.sleep(self._backoff.delay(failures, self._rng.random()))
                if await self._probe(target, self._connect_timeout):
                    log.info("app port %s reconnected", target)
                    balancer.add([Endpoint(target)])  # wakes the waiting requests
                    return
                now = self._clock()
                if balancer.queue.requests != asked:
                    asked, asked_at = balancer.queue.requests, now
                elif now - asked_at >= self._idle_timeout:
                    return  # nobody waits for it: let it go
        finally:
            self.unreachable_ports.pop(target, None)
            self._tasks.pop(target, None)

    def close(self) -> None:
        """Stop reconnecting (the proxy is stopping)."""
        for task in list(self._tasks.values()):
            task.cancel()
