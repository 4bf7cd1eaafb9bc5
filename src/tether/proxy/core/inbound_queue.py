"""Inbound HTTP/2 requests waiting for an app port that could not be connected (proxy.md §8.4 step 5).

linkerd2-proxy puts a queue (``LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY``,
10,000; failfast ``_INBOUND_HTTP_FAILFAST_TIMEOUT``, 1 s) in front of its
HTTP client to the app, and reconnects that client with backoff
(``_INBOUND_CONNECT_EXP_BACKOFF_*``, 100 ms to 10 s). Only an HTTP/2 client
is ever not ready: its connection is made before it takes a request, so a
refused or timed-out connect keeps the requests queued while it reconnects
(served if the app comes up within the failfast timeout, else 504 ``service
in fail-fast``; one over the capacity: 503); once the failfast has fired, the
queue's gate is shut and its load shedding answers new requests 503 at once,
until the client is ready again. An HTTP/1 client is always ready
and connects per request: its failed connect is the request's own error, 502
(refused) or 504 (connect timeout), at once -- and so it is here (an
``l5d-orig-proto`` request downgraded to HTTP/1 too).

Here an app port is *unreachable* from the moment an HTTP/2 connect to it
fails (``Pick.unreachable``, called by ``core.http2_proxy``) until a
reconnect, with that backoff, succeeds (``io.inbound_ports.AppPorts``). It is
then a balancer with no endpoint, and the requests that come for it wait in
its queue by the outbound queue's rule (``core.balancer_queue.queued``: the
capacity, the failfast timeout from the moment it became unreachable, the
503 and 504, and the 503 for those that come after the failfast fired); once
reconnected, the endpoint is back and they go on.

Pure: the reconnecting is ``io.inbound_ports``. Caller: ``core.routes.inbound_router``
(requests of an HTTP/2 connection).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.balancer import Balancer
from tether.proxy.core.balancer_queue import Queue, queued
from tether.proxy.core.commands import Command
from tether.proxy.core.errors import ProxyError

L5D_ORIG_PROTO = b"l5d-orig-proto"


class AppPorts(Protocol):
    """The app's ports the inbound proxy could not connect to (``io.inbound_ports.AppPorts``)."""

    # Each unreachable port's balancer: no endpoint until a reconnect succeeds (then it leaves this map).
    unreachable_ports: dict[SocketAddr, Balancer]

    def unreachable(self, target: SocketAddr) -> None:
        """An HTTP/2 connect to ``target`` failed: requests wait for it until a reconnect succeeds."""


@dataclass(frozen=True, slots=True)
class InboundQueue:
    """What an inbound HTTP/2 connection's router needs to make requests wait for an unreachable app port."""

    ports: AppPorts
    queue: Queue  # LINKERD2_PROXY_INBOUND_HTTP_QUEUE_CAPACITY and _FAILFAST_TIMEOUT


def wait_for_app(balancer: Balancer, waits: InboundQueue, target: SocketAddr,
                 request: RequestHead) -> Generator[Command, Any, ProxyError | None]:
    """None once ``target`` (unreachable: ``balancer``) is reachable again, or at once for a request that goes
    to the app as HTTP/1 (``l5d-orig-proto``); else the queue's error (503 full, 504 failfast)."""
    if any(name == L5D_ORIG_PROTO for name, _ in request.headers):
        return None
    slot = yield from queued(balancer, waits.queue, str(target), shed_in_failfast=True)
    return slot if isinstance(slot, ProxyError) else None
