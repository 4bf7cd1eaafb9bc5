"""Shared, cached discovery per target: ``GetProfile`` per original destination, ``Get`` per service.

``Discovery.profile(addr)`` hands out a lease on the one ``ProfileWatch`` of
``ip:port``; the watch keeps a ``GetProfile`` stream open while leased and for
``idle_timeout`` (``LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT``, 5 s) after
the last lease is released, then closes it. When the profile names a service
(``fully_qualified_name``), the watch holds a lease on that service's
``ServiceWatch``, whose ``Get`` stream feeds one shared ``Balancer``.

Streams that end or fail are opened again with exponential backoff; until the
new stream's first message, the last answer keeps serving -- so cached targets
keep working while the destination service is down (proxy-api.md §4.1).

A ``ProfileWatch`` is what the outbound layer waits on (``Wait``): it answers a
``Resolution`` once the first profile is in (or the destination said it has
none), or ``Failed`` when nothing came within the timeout.

A service's profile routes, retry budget and traffic split are translated once
per update (``profile_translation``) into ``Resolution.profile``; each
``dst_overrides`` backend is a service too, resolved by its own shared
``ServiceWatch``, held by the profile watch for as long as the profile names it.
A resolution keeps a reference to its watch, so the per-request router can
follow later updates on a connection opened before them.

Callers: ``tether.proxy.app`` (one ``Discovery``; ``set_channel`` on every
identity refresh) and ``core.outbound``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable

from tether.api import destination_pb2 as pb
from tether.api import outbound_pb2 as outbound_pb
from tether.api.addresses import InvalidAddress, from_tcp_address, to_tcp_address
from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.core.commands import Failed
from tether.proxy.core.config import Backoff
from tether.proxy.core.metrics import samples
from tether.proxy.core.profiles import Profile
from tether.proxy.core.balancer import FULL, QUEUE_BUCKETS, Balancer, Full, Slot
from tether.proxy.core.http_metrics import render_histogram
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.core.client_policy import ClientPolicy
from tether.proxy.core.client_policy_translation import invalid_policy
from tether.proxy.core.client_policy_translation import translate as translate_policy
from tether.proxy.core.policy_translation import InvalidPolicy
from tether.proxy.core.profile_translation import translate
from tether.proxy.core.resolution import FORWARD, Resolution
from tether.proxy.io.grpc_client import Channel, Code, RpcError, method_path

log = logging.getLogger(__name__)

# Answers that will not change by asking again (Linkerd does not retry these).
_FINAL_CODES = frozenset({Code.NOT_FOUND, Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.UNIMPLEMENTED})
_SERVICE = pb.DESCRIPTOR.services_by_name["Destination"]
GET, GET_PROFILE = method_path(_SERVICE, "Get"), method_path(_SERVICE, "GetProfile")
WATCH_POLICY = method_path(outbound_pb.DESCRIPTOR.services_by_name["OutboundPolicies"], "Watch")
FAMILIES = ("http", "tcp", "tls")  # the outbound balancer metric families (proxy.md §9.5)


class WaitingBalancer(Balancer):
    """A service's balancer as discovery feeds it: ``core.balancer.Balancer`` plus waiting for endpoints."""

    def __init__(self, *, failfast: float, clock: Callable[[], float], rng: random.Random | None = None,
                 backoff: Callable[[int], float] | None = None) -> None:
        if backoff is None:
            super().__init__(failfast=failfast, clock=clock, rng=rng)
        else:
            super().__init__(failfast=failfast, clock=clock, rng=rng, backoff=backoff)
        self._changed = asyncio.Event()
        self._watchers: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        watchers, self._watchers = self._watchers, []
        for waiter in watchers:
            if not waiter.done():
                waiter.set_result(None)
        if self.has_endpoints:
            self._changed.set()

    def updated(self) -> asyncio.Future[None]:
        """Done at the next update from discovery (whether or not it changed anything)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append(waiter)
        return waiter

    async def wait(self, timeout: float, capacity: int | None = None) -> Slot | Full | None:
        """An endpoint, waiting for one while the set has been empty for less than ``timeout`` (the waiter's
        failfast), and for ``timeout`` at most; ``FULL`` at once, not waiting, when ``capacity`` others wait
        already. The request's time in the queue is counted in it once: by the caller's ``pick`` that found
        nothing, else here; a refused one is not counted (it never entered the queue)."""
        queue = self.queue
        if capacity is not None and queue.waiting >= capacity:
            if queue.missed:  # its pick counted it
                queue.missed -= 1
                queue.requests -= 1
            return FULL
        began = self._clock()
        deadline = began + timeout
        if queue.missed:
            queue.missed -= 1
        else:
            queue.requests += 1
        queue.waiting += 1
        try:
            while True:
                slot = self.pick(count=False)
                if slot is not None:
                    return slot
                failfast = self.failfast_left(timeout)
                if failfast is None:  # pragma: no cover - pick() answers whenever there are endpoints
                    return None
                left = min(deadline - self._clock(), failfast)
                if left <= 0:
                    return None
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    pass
        finally:
            queue.waiting -= 1
            queue.observe_wait(self._clock() - began)


class _Watch:
    """One control-plane stream kept open while leased, re-opened with backoff when it ends."""

    def __init__(self, discovery: Discovery, key: str) -> None:
        self._discovery = discovery
        self.key = key
        self._refs = 0
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self.answered = asyncio.Event()
        self.closed = False

    def acquire(self) -> None:
        self._refs += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"discovery {self.key}")
            self._discovery.notify()

    def release(self) -> None:
        self._refs -= 1
        if self._refs == 0 and not self.closed:
            self._idle = asyncio.get_running_loop().call_later(self._discovery.idle_timeout, self.close)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()
        self._forget()
        self._closed()
        self._discovery.notify()

    def _forget(self) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """Subclasses release what they hold."""

    async def _run(self) -> None:
        failures = 0
        while not self.closed:
            channel = self._lease()
            try:
                if channel is None:
                    raise _NoChannel
                call = self._open(channel)
                first = True
                async for message in call:
                    self._apply(message, first)
                    first = False
                    failures = 0
                    self.answered.set()
                log.debug("discovery: stream %s ended; reconnecting", self.key)
            except RpcError as exc:
                code = exc.code
                if code in self.final_codes:
                    log.debug("discovery: %s answered %s: %s", self.key, code.name, exc.details)
                    self._final(code)
                    self.answered.set()
                    return
                if code is Code.NOT_FOUND:  # where it is not final: asked again, as a stream that failed
                    log.debug("discovery: %s answered %s: %s; asking again", self.key, code.name, exc.details)
                    self._not_found()
                else:
                    log.info("discovery: stream %s failed (%s: %s); retrying", self.key, code.name, exc.details)
                    self._failed()
            except _NoChannel:
                pass
            finally:
                self._give_back(channel)
            failures += 1
            await asyncio.sleep(self._discovery.backoff_delay(failures))

    final_codes = _FINAL_CODES  # the answers that end the watch (it is not asked again while leased)

    def _failed(self) -> None:
        """The stream failed and is retried; what was answered keeps serving."""

    def _not_found(self) -> None:  # pragma: no cover - only watches for which NOT_FOUND is not final
        """The target does not exist now; it is asked again with backoff."""

    def _lease(self) -> Channel | None:
        return self._discovery.lease_channel()

    def _give_back(self, channel: Channel | None) -> None:
        self._discovery.return_channel(channel)

    def _destination(self) -> pb.GetDestination:
        return pb.GetDestination(path=self.key, context_token=self._discovery.context_token)

    def _open(self, channel: Channel) -> AsyncIterator[object]:
        raise NotImplementedError

    def _apply(self, message: object, first: bool) -> None:
        raise NotImplementedError

    def _final(self, code: Code) -> None:
        raise NotImplementedError


class _NoChannel(Exception):
    """No destination channel yet (the proxy is not certified)."""


class ServiceWatch(_Watch):
    """``Destination.Get`` for ``name:port``, feeding one balancer.

    ``NOT_FOUND`` (the destination knows no such Service) is not final here: the balancer is emptied and the
    Service asked for again with backoff. A client policy or profile may name a Service before the destination
    has seen it (each control-plane component follows the cluster on its own watch; a Service created a moment
    ago is known to one before the other): a final answer would leave the balancer empty -- every request
    failing fast -- for as long as traffic keeps the watch leased.
    """

    final_codes = _FINAL_CODES - {Code.NOT_FOUND}

    def __init__(self, discovery: Discovery, key: str) -> None:
        super().__init__(discovery, key)
        self.balancer = discovery.new_balancer()

    def _open(self, channel: Channel) -> AsyncIterator[object]:
        return channel.server_stream(GET, self._destination(), pb.Update)

    def _apply(self, message: object, first: bool) -> None:
        assert isinstance(message, pb.Update)
        kind = message.WhichOneof("update")
        if kind == "add":
            endpoints = []
            for weighted in message.add.addrs:
                try:
                    endpoints.append(Endpoint.from_proto(weighted, message.add.metric_labels))
                except (InvalidAddress, ValueError) as exc:
                    log.warning("discovery: %s: skipping an endpoint: %s", self.key, exc)
            # The first message of a stream starts the state afresh (proxy-api.md §4.1).
            (self.balancer.reset if first else self.balancer.add)(endpoints)
        elif kind == "remove":
            addrs = []
            for tcp in message.remove.addrs:
                try:
                    ip, port = from_tcp_address(tcp)
                    addrs.append(SocketAddr(parse_ip(ip), port))
                except (InvalidAddress, ValueError):
                    continue
            if first:
                self.balancer.reset()
            else:
                self.balancer.remove(addrs)
        elif kind == "no_endpoints":
            self.balancer.reset()

    def _final(self, code: Code) -> None:
        self.balancer.reset()

    def _not_found(self) -> None:
        self.balancer.reset()

    def _forget(self) -> None:
        self._discovery.services.pop(self.key, None)


class ProfileWatch(_Watch):
    """``Destination.GetProfile`` for ``ip:port``; what the outbound layer waits on."""

    def __init__(self, discovery: Discovery, key: str, port: int) -> None:
        super().__init__(discovery, key)
        self._port = port
        self.resolution: Resolution = FORWARD
        self._service: ServiceWatch | None = None
        self._backends: list[ServiceWatch] = []  # the traffic split's services, leased
        self._update_waiters: list[asyncio.Future[None]] = []

    def _open(self, channel: Channel) -> AsyncIterator[object]:
        return channel.server_stream(GET_PROFILE, self._destination(), pb.DestinationProfile)

    def updated(self) -> asyncio.Future[None]:
        """Done at the next profile update (tests wait on it)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._update_waiters.append(waiter)
        return waiter

    @property
    def ready(self) -> bool:
        return self.answered.is_set()

    def _updated_now(self) -> None:
        waiters, self._update_waiters = self._update_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _apply(self, message: object, first: bool) -> None:
        assert isinstance(message, pb.DestinationProfile)
        try:
            self._resolve(message)
        finally:
            self._updated_now()

    def _resolve(self, message: pb.DestinationProfile) -> None:
        opaque = message.opaque_protocol
        if message.HasField("endpoint"):
            try:
                endpoint = Endpoint.from_proto(message.endpoint)
            except (InvalidAddress, ValueError) as exc:
                log.warning("discovery: %s: unusable profile endpoint: %s", self.key, exc)
                self._use_service(None)
                self._use_backends(None, "")
                self.resolution = Resolution(opaque=opaque, watch=self)
                return
            self._use_service(None)
            self._use_backends(None, "")
            self.resolution = Resolution(opaque=opaque or endpoint.opaque, endpoint=endpoint, watch=self)
        elif message.fully_qualified_name:
            authority = f"{message.fully_qualified_name.rstrip('.')}:{self._port}"
            service = self._use_service(authority)
            # Opaque: HTTP routes are ignored (proxy-api.md §4.2).
            profile = self._use_backends(None if opaque else message, authority)
            self.resolution = Resolution(opaque=opaque, balancer=service.balancer, authority=authority,
                                         profile=profile, watch=self)
        else:
            self._use_service(None)
            self._use_backends(None, "")
            self.resolution = Resolution(opaque=opaque, watch=self)

    def _use_service(self, authority: str | None) -> ServiceWatch:
        current = self._service
        if current is not None and current.key == authority:
            return current
        if authority is not None:
            self._service = self._discovery.service(authority)
        else:
            self._service = None
        if current is not None:
            current.release()
        return self._service  # type: ignore[return-value]

    def _use_backends(self, message: pb.DestinationProfile | None, authority: str) -> Profile | None:
        """Translate the profile; lease the services its traffic split names, then let the previous ones go."""
        held: list[ServiceWatch] = []

        def balancer_for(backend: str) -> Balancer:
            watch = self._discovery.service(backend)
            held.append(watch)
            return watch.balancer

        profile = None
        if message is not None:
            profile = translate(message, authority, self._discovery.clock, balancer_for)
        previous, self._backends = self._backends, held
        for watch in previous:
            watch.release()
        return profile

    def _final(self, code: Code) -> None:
        self._use_service(None)
        self._use_backends(None, "")
        self.resolution = FORWARD
        self._updated_now()

    def _forget(self) -> None:
        self._discovery.profiles.pop(self.key, None)

    def _closed(self) -> None:
        self._use_service(None)
        self._use_backends(None, "")

    async def wait(self, timeout: float) -> Resolution | Failed:
        """The resolution once known; ``Failed`` if discovery gave no answer within ``timeout``."""
        if not self.answered.is_set():
            try:
                await asyncio.wait_for(self.answered.wait(), timeout)
            except TimeoutError:
                return Failed("discovery unavailable")
        return self.resolution


class PolicyWatch(_Watch):
    """``OutboundPolicies.Watch`` for ``ip:port`` (proxy.md §7.1), on the policy controller's channel.

    ``policy`` is None until the first message, and after ``NOT_FOUND`` /
    ``UNIMPLEMENTED`` (the target has no policy: the profile alone applies, as
    Linkerd synthesizes one from it). Until the first answer a connection waits
    (Linkerd blocks on it; other errors are retried with backoff meanwhile, and
    the connection is refused when none came within the failfast timeout);
    ``INVALID_ARGUMENT`` / ``FAILED_PRECONDITION`` are final and fail the
    target's connections (``failed``). A message the proxy cannot use becomes
    Linkerd's invalid policy (every request 500). Each balanced backend is a ``ServiceWatch`` leased for as
    long as the policy names it (shared with the profiles naming the same
    service).
    """

    def __init__(self, discovery: Discovery, key: str, addr: SocketAddr) -> None:
        super().__init__(discovery, key)
        self._addr = addr
        self.policy: ClientPolicy | None = None
        self.failed: Failed | None = None  # the controller refused the lookup for good
        self._backends: list[ServiceWatch] = []
        self._update_waiters: list[asyncio.Future[None]] = []

    @property
    def ready(self) -> bool:
        return self.answered.is_set()

    def _lease(self) -> Channel | None:
        return self._discovery.policy_channel()

    def _give_back(self, channel: Channel | None) -> None:
        """The policy channel is the inbound policy client's: it closes it."""

    def _open(self, channel: Channel) -> AsyncIterator[object]:
        spec = outbound_pb.TrafficSpec(source_workload=self._discovery.policy_workload,
                                       addr=to_tcp_address(str(self._addr.ip), self._addr.port))
        return channel.server_stream(WATCH_POLICY, spec, outbound_pb.OutboundPolicy)

    def updated(self) -> asyncio.Future[None]:
        """Done at the next policy update (tests wait on it)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._update_waiters.append(waiter)
        return waiter

    def _apply(self, message: object, first: bool) -> None:
        assert isinstance(message, outbound_pb.OutboundPolicy)
        held: list[ServiceWatch] = []

        def balancer_for(path: str) -> Balancer:
            watch = self._discovery.service(path)
            held.append(watch)
            return watch.balancer

        try:
            policy = translate_policy(message, balancer_for)
        except InvalidPolicy as exc:
            log.warning("client policy: %s: invalid policy from the controller (%s); every request fails",
                        self.key, exc)
            policy = invalid_policy()
        if policy.unapplied:
            log.warning("client policy: %s: not applied by this proxy: %s", self.key, ", ".join(policy.unapplied))
        for backend in policy.backends():
            if backend.balancer is not None:
                backend.balancer.configure_accrual(policy.accrual)
        self._hold(held)
        self.policy = policy
        self._updated_now()

    def _hold(self, held: list[ServiceWatch]) -> None:
        previous, self._backends = self._backends, held
        for watch in previous:
            watch.release()

    def _updated_now(self) -> None:
        waiters, self._update_waiters = self._update_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _final(self, code: Code) -> None:
        self._hold([])
        self.policy = None
        if code not in (Code.NOT_FOUND, Code.UNIMPLEMENTED):  # not "no policy": Linkerd fails the connection
            log.warning("client policy: %s: the policy controller refused the lookup (%s)", self.key, code.name)
            self.failed = Failed("discovery rejected")
        self._updated_now()

    def _forget(self) -> None:
        self._discovery.policies.pop(self.key, None)

    def _closed(self) -> None:
        self._hold([])

    async def wait(self, timeout: float) -> ClientPolicy | Failed | None:
        """The policy once the controller answered (None: it has none); ``Failed`` when it gave no answer
        within ``timeout`` or refused the lookup."""
        if not self.answered.is_set():
            try:
                await asyncio.wait_for(self.answered.wait(), timeout)
            except TimeoutError:
                return Failed("discovery unavailable")
        return self.failed or self.policy


class Discovery:
    """The cache of watches, and the destination channel they use."""

    def __init__(
        self,
        *,
        context_token: str,
        idle_timeout: float,
        backoff: Backoff,
        failfast: float,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        http_failfast: float | None = None,
    ) -> None:
        """``failfast``: connections' (LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT), the balancers' own;
        ``http_failfast``: HTTP requests' (_OUTBOUND_HTTP_FAILFAST_TIMEOUT; None: the same), for the gate of the
        ``http`` family's queue metrics (the requests themselves wait under ``core.balancer_queue.Queue``)."""
        self.context_token = context_token
        self.idle_timeout = idle_timeout
        self._backoff = backoff
        self._failfast = failfast
        self._family_failfast = {"http": failfast if http_failfast is None else http_failfast,
                                 "tcp": failfast, "tls": failfast}
        self._clock = clock
        self._rng = rng or random.Random()
        self.profiles: dict[str, ProfileWatch] = {}
        self.policies: dict[str, PolicyWatch] = {}
        # OutboundPolicies (enable_client_policy): the policy controller's channel (the inbound policy client's).
        self.policy_workload = ""
        self.policy_channel: Callable[[], Channel | None] = lambda: None
        self.services: dict[str, ServiceWatch] = {}
        self._channel: Channel | None = None
        self._channel_users: dict[Channel, int] = {}
        self._watchers: list[asyncio.Future[None]] = []

    # -- leases -------------------------------------------------------------------------------------------------

    def changed(self) -> asyncio.Future[None]:
        """Done when a watch is next opened or closed (tests wait on it)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append(waiter)
        return waiter

    def notify(self) -> None:
        watchers, self._watchers = self._watchers, []
        for waiter in watchers:
            if not waiter.done():
                waiter.set_result(None)

    def profile(self, addr: SocketAddr) -> ProfileWatch:
        """A lease on the profile watch of ``addr``; the caller must ``release()`` it."""
        key = str(addr)
        watch = self.profiles.get(key)
        if watch is None:
            watch = self.profiles[key] = ProfileWatch(self, key, addr.port)
        watch.acquire()
        return watch

    def profile_named(self, authority: str, port: int) -> ProfileWatch:
        """A lease on the profile watch of a ``name:port`` (ingress mode's ``l5d-dst-override``)."""
        watch = self.profiles.get(authority)
        if watch is None:
            watch = self.profiles[authority] = ProfileWatch(self, authority, port)
        watch.acquire()
        return watch

    def enable_client_policy(self, workload: str, channel: Callable[[], Channel | None]) -> None:
        """Ask the policy controller for client policy (``LINKERD2_PROXY_POLICY_WORKLOAD``), on ``channel``."""
        self.policy_workload = workload
        self.policy_channel = channel

    def client_policy(self, addr: SocketAddr) -> PolicyWatch:
        """A lease on the client policy watch of ``addr``; the caller must ``release()`` it."""
        key = str(addr)
        watch = self.policies.get(key)
        if watch is None:
            watch = self.policies[key] = PolicyWatch(self, key, addr)
        watch.acquire()
        return watch

    def collect_balancers(self, out: list[str]) -> None:
        """``outbound_{http,tcp,tls}_balancer_endpoints{parent_*,backend_*,state}``,
        ``..._p2c_endpoints{parent_*,backend_*}`` (every endpoint the balancer picks among, ready or not) and
        ``..._p2c_updates_total{parent_*,backend_*,op}`` (discovery's updates applied to it) for the backends of
        the client policies watched now, each in the family of the routes naming it (proxy.md §9.5)."""
        values: dict[str, dict[str, int]] = {family: {} for family in FAMILIES}
        pools: dict[str, dict[str, int]] = {family: {} for family in FAMILIES}
        updates: dict[str, dict[str, int]] = {family: {} for family in FAMILIES}
        balancers: dict[str, dict[str, Balancer]] = {family: {} for family in FAMILIES}
        for watch in self.policies.values():
            policy = watch.policy
            if policy is None:
                continue
            for family, backend in policy.backends_by_family():
                balancer = backend.balancer
                if balancer is None:
                    continue
                ready, pending = balancer.endpoint_states()
                key = f"{policy.parent_labels},{backend.labels}"
                values[family][f'{key},state="ready"'] = ready
                values[family][f'{key},state="pending"'] = pending
                pools[family][key] = ready + pending
                for op, count in balancer.updates.items():
                    updates[family][f'{key},op="{op}"'] = count
                balancers[family][key] = balancer
        self._collect_queues(out, balancers)
        for family in FAMILIES:
            prefix = f"outbound_{family}_balancer"
            samples(out, f"{prefix}_endpoints", "gauge", "The number of endpoints of a backend balancer.",
                    values[family].items())
            samples(out, f"{prefix}_p2c_endpoints", "gauge", "The number of endpoints currently in a P2C balancer.",
                    pools[family].items())
            samples(out, f"{prefix}_p2c_updates_total", "counter",
                    "The total number of service discovery updates received by a P2C balancer.",
                    updates[family].items())

    def _collect_queues(self, out: list[str], balancers: dict[str, dict[str, Balancer]]) -> None:
        """``outbound_{http,tcp,tls}_balancer_queue_*`` of the same backends (``core.balancer.QueueStats``);
        the gate's times as Unix timestamps (0: never)."""
        wall = time.time() - self._clock()  # the balancers' clock to Unix time

        def stamp(at: float | None) -> float:
            return 0.0 if at is None else round(wall + at, 3)

        for family in FAMILIES:
            prefix = f"outbound_{family}_balancer_queue"
            failfast = self._family_failfast[family]
            queues = {key: balancer.gate(failfast) for key, balancer in balancers[family].items()}
            samples(out, f"{prefix}_length", "gauge", "The number of requests in the queue.",
                    ((k, q.waiting) for k, q in queues.items()))
            samples(out, f"{prefix}_requests_total", "counter", "The total number of requests enqueued.",
                    ((k, q.requests) for k, q in queues.items()))
            out.append(f"# HELP {prefix}_latency_seconds The time requests spent in the queue.")
            out.append(f"# TYPE {prefix}_latency_seconds histogram")
            for key, queue in queues.items():
                render_histogram(out, f"{prefix}_latency_seconds", key, queue.latency(), QUEUE_BUCKETS)
            samples(out, f"{prefix}_gate_open_total", "counter", "The number of times the gate opened.",
                    ((k, q.opens) for k, q in queues.items()))
            samples(out, f"{prefix}_gate_shut_total", "counter", "The number of times the gate shut.",
                    ((k, q.shuts) for k, q in queues.items()))
            samples(out, f"{prefix}_gate_open_time_seconds", "gauge", "When the gate last opened (Unix time).",
                    ((k, stamp(q.opened_at)) for k, q in queues.items()))
            samples(out, f"{prefix}_gate_shut_time_seconds", "gauge", "When the gate last shut (Unix time).",
                    ((k, stamp(q.shut_at)) for k, q in queues.items()))
            samples(out, f"{prefix}_gate_timeout_seconds", "gauge", "The failfast timeout of the gate.",
                    ((k, failfast) for k in queues))

    def service(self, authority: str) -> ServiceWatch:
        watch = self.services.get(authority)
        if watch is None:
            watch = self.services[authority] = ServiceWatch(self, authority)
        watch.acquire()
        return watch

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def new_balancer(self) -> WaitingBalancer:
        return WaitingBalancer(failfast=self._failfast, clock=self._clock, rng=self._rng,
                               backoff=lambda n: self.backoff_delay(n))

    def backoff_delay(self, failures: int) -> float:
        return self._backoff.delay(failures, self._rng.random())

    # -- the channel --------------------------------------------------------------------------------------------

    @property
    def channel(self) -> Channel | None:
        return self._channel

    def set_channel(self, channel: Channel) -> None:
        """Streams opened from now on use ``channel``; the previous one closes when its last stream ends."""
        old = self._channel
        self._channel = channel
        self._channel_users.setdefault(channel, 0)
        if old is not None and old is not channel and self._channel_users.get(old, 0) == 0:
            self._close_channel(old)

    def lease_channel(self) -> Channel | None:
        channel = self._channel
        if channel is not None:
            self._channel_users[channel] = self._channel_users.get(channel, 0) + 1
        return channel

    def return_channel(self, channel: Channel | None) -> None:
        if channel is None:
            return
        users = self._channel_users.get(channel, 1) - 1
        self._channel_users[channel] = users
        if users == 0 and channel is not self._channel:
            self._close_channel(channel)

    def _close_channel(self, channel: Channel) -> None:
        self._channel_users.pop(channel, None)
        asyncio.get_running_loop().create_task(channel.close())

    async def close(self) -> None:
        for watch in [*self.profiles.values(), *self.policies.values(), *self.services.values()]:
            watch.close()
        await asyncio.sleep(0)
        channels = list(self._channel_users)
        if self._channel is not None and self._channel not in channels:
            channels.append(self._channel)
        self._channel = None
        self._channel_users.clear()
        for channel in channels:
            await channel.close()
