"""Inbound policy discovery: one ``WatchPort`` stream per inbound port (proxy.md §8.1, proxy-api.md §3.3).

``PolicyClient.policy(port)`` answers the port's current ``ServerPolicy`` at
once, never waiting: every watch starts from the default policy (its opaque
variant on the ports without protocol detection) and the controller's first
``Server`` message replaces it. A stream that ends or fails is opened again
with exponential backoff while the last policy keeps applying -- so with the
controller slow or down the default policy applies; only
``INVALID_ARGUMENT`` and ``FAILED_PRECONDITION`` end a watch. A message the
proxy cannot use is replaced by the built-in invalid policy (every request
403, every opaque connection refused), and logged.

The ports of ``LINKERD2_PROXY_INBOUND_PORTS`` (and the admin port) are watched
from ``start`` and kept; any other port is watched from its first connection
and dropped after ``idle_timeout`` (``LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT``,
90 s) without a lookup or a subscriber. ``subscribe`` is how an open
connection follows its port's policy: it is called back after every update
(``core.inbound_authz.TcpAuthzWatch`` re-checks the connection then).

Callers: ``tether.proxy.app`` (one client; ``set_channel`` on every identity
refresh, as for discovery).
"""

from __future__ import annotations

import asyncio
import logging
import itertools
from collections.abc import Callable

from tether.ports import PortSet

from tether.api import inbound_pb2 as pb
from tether.proxy.core.policy_translation import InvalidPolicy, translate
from tether.proxy.core.server_policy import INVALID, ServerPolicy
from tether.proxy.io.grpc_client import Channel, Code, RpcError, method_path

log = logging.getLogger(__name__)

WATCH_PORT = method_path(pb.DESCRIPTOR.services_by_name["InboundServerPolicies"], "WatchPort")
OLD_CHANNEL_GRACE = 60.0  # seconds a replaced channel's streams go on before they move to the new one
MAX_EAGER = 1024  # ports of LINKERD2_PROXY_INBOUND_PORTS watched from the start (a range may hold 65,535)
_FINAL_CODES = frozenset({Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION})


class _PortWatch:
    def __init__(self, client: PolicyClient, port: int, kept: bool) -> None:
        self.client = client
        self.port = port
        self.kept = kept
        self.policy = client.default(port)
        self.last_used = client.clock()
        self.updates = 0  # messages applied (tests wait on it through PolicyClient.updated)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"policy watch {port}")
        self._expiry: asyncio.TimerHandle | None = None
        if not kept:
            self._schedule_expiry(client.idle_timeout)

    def _schedule_expiry(self, delay: float) -> None:
        self._expiry = asyncio.get_running_loop().call_later(delay, self._maybe_expire)

    def _maybe_expire(self) -> None:
        idle = self.client.clock() - self.last_used
        if self.client.subscribed(self.port):  # an open connection still follows this port's policy
            self.last_used, idle = self.client.clock(), 0.0
        if idle >= self.client.idle_timeout:
            self.client.forget(self.port)
        else:
            self._schedule_expiry(self.client.idle_timeout - idle)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self.task.cancel()

    async def _run(self) -> None:
        failures = 0
        request = pb.PortSpec(workload=self.client.workload, port=self.port)
        while True:
            channel = self.client.channel
            if channel is None:  # not certified yet
                await self.client.has_channel.wait()
                continue
            try:
                async for message in channel.server_stream(WATCH_PORT, request, pb.Server):
                    self._apply(message)
                    failures = 0
                log.debug("policy: the watch of port %d ended; reconnecting", self.port)
            except RpcError as exc:
                if exc.code in _FINAL_CODES:
                    log.warning("policy: port %d: %s: %s; keeping the current policy",
                                self.port, exc.code.name, exc.details)
                    return
                log.info("policy: the watch of port %d failed (%s: %s); retrying",
                         self.port, exc.code.name, exc.details)
            failures += 1
            await asyncio.sleep(self.client.backoff_delay(failures))

    def _apply(self, message: pb.Server) -> None:
        try:
            self.policy = translate(message)
        except InvalidPolicy as exc:
            log.warning("policy: port %d: invalid policy from the controller (%s); every request is denied",
                        self.port, exc)
            self.policy = INVALID
        self.updates += 1
        self.client.changed(self.port)
        self.client.notify()


class PolicyClient:
    """The per-port policy cache, fed by the policy controller."""

    def __init__(self, *, workload: str, default: Callable[[int], ServerPolicy], idle_timeout: float,
                 backoff_delay: Callable[[int], float], clock: Callable[[], float]) -> None:
        self.workload = workload
        self.default = default
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.backoff_delay = backoff_delay  # seconds before the n-th retry (the discovery's backoff)
        self._closing: dict[asyncio.Task[None], Channel] = {}  # replaced channels, closed after a grace period
        self._kept = PortSet()
        self.channel: Channel | None = None
        self.has_channel = asyncio.Event()
        self._watches: dict[int, _PortWatch] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._subscribers: dict[int, set[Callable[[], None]]] = {}

    def start(self, ports: PortSet) -> None:
        """Watch ``ports`` from now on, for good (past ``MAX_EAGER`` of them, from their first use, for good too)."""
        self._kept = ports
        for port in itertools.islice(ports, MAX_EAGER):
            if port not in self._watches:
                self._watches[port] = _PortWatch(self, port, kept=True)

    def policy(self, port: int) -> ServerPolicy:
        """The current policy of ``port``; watched from now on if it was not."""
        watch = self._watches.get(port)
        if watch is None:
            watch = self._watches[port] = _PortWatch(self, port, kept=port in self._kept)
        else:
            watch.last_used = self.clock()
        return watch.policy

    def subscribe(self, port: int, changed: Callable[[], None]) -> Callable[[], None]:
        """Call ``changed`` after each update of ``port``'s policy (an open connection re-checks itself), and
        keep the port watched meanwhile; the result unsubscribes."""
        callbacks = self._subscribers.setdefault(port, set())
        callbacks.add(changed)

        def unsubscribe() -> None:
            callbacks.discard(changed)
            if not callbacks and self._subscribers.get(port) is callbacks:
                del self._subscribers[port]
        return unsubscribe

    def subscribed(self, port: int) -> bool:
        return port in self._subscribers

    def changed(self, port: int) -> None:
        for callback in list(self._subscribers.get(port, ())):
            try:
                callback()
            except Exception:  # one connection's failure must not stop the others' re-checks
                log.exception("policy: re-checking a connection on port %d failed", port)

    def watched(self) -> frozenset[int]:
        return frozenset(self._watches)

    def forget(self, port: int) -> None:
        watch = self._watches.pop(port, None)
        if watch is not None:
            watch.close()
            log.debug("policy: port %d idle for %.0fs; no longer watched", port, self.idle_timeout)
            self.notify()

    def set_channel(self, channel: Channel) -> None:
        """Streams opened from now on use ``channel`` (a new certificate); open streams go on on the old one."""
        old, self.channel = self.channel, channel
        self.has_channel.set()
        if old is not None and old is not channel:
            task = asyncio.get_running_loop().create_task(_close_later(old))
            self._closing[task] = old
            task.add_done_callback(lambda done: self._closing.pop(done, None))

    def updated(self) -> asyncio.Future[None]:
        """Done at the next policy update or watch change (tests wait on it)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        watches = list(self._watches.values())
        self._watches.clear()
        for watch in watches:
            watch.close()
        closing, self._closing = dict(self._closing), {}
        for task in closing:
            task.cancel()
        await asyncio.gather(*(w.task for w in watches), *closing, return_exceptions=True)
        for channel in (*closing.values(), self.channel):
            if channel is not None:
                await channel.close()
        self.channel = None


async def _close_later(channel: Channel) -> None:
    """An old channel's streams are re-opened on the new one when they end; close it once they had the time."""
    await asyncio.sleep(OLD_CHANNEL_GRACE)
    await channel.close()
