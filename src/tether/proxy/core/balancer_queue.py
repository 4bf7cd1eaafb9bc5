"""The bounded queue in front of a balancer: requests and connections waiting for an endpoint (proxy.md §7.3).

linkerd2-proxy puts a queue of ``capacity`` waiters in front of each balancer
(``LINKERD2_PROXY_OUTBOUND_HTTP_QUEUE_CAPACITY`` for HTTP requests,
``_OUTBOUND_TCP_QUEUE_CAPACITY`` for connections; 10,000 each) and fails what
waits once the balancer has had no endpoint for the failfast timeout
(``_OUTBOUND_HTTP_FAILFAST_TIMEOUT``, ``_OUTBOUND_TCP_FAILFAST_TIMEOUT``; 3 s
each). Here a request takes its endpoint at once when there is one
(``Balancer.pick``, on the caller's fast path); only when there is none does it
come here (``queued``): refused when ``capacity`` others already wait (the
route's load shed: 503, ``loadshed``), else it waits (``commands.Wait`` on
``Enqueued``) until an endpoint comes or the balancer has been empty for the
failfast timeout (``service in fail-fast``: 504, ``failfast``).

One balancer serves a service's HTTP requests and its connections alike; each
kind waits under its own ``Queue`` (capacity and failfast timeout), counted
together in the balancer's ``QueueStats``.

Pure: the waiting itself is ``io.discovery.WaitingBalancer.wait``. Callers:
``core.routes`` (HTTP requests) and ``core.outbound`` (connections).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from tether.proxy.core import errors
from tether.proxy.core.balancer import FULL, Balancer, Full, Slot
from tether.proxy.core.commands import Command, Wait
from tether.proxy.core.errors import ProxyError

DEFAULT_CAPACITY = 10_000  # linkerd2-proxy's, for each queue
DEFAULT_FAILFAST = 3.0  # seconds, linkerd2-proxy's outbound HTTP and TCP failfast timeouts


@dataclass(frozen=True, slots=True)
class Queue:
    """One kind of waiter's limits: at most ``capacity`` waiting at once, each for at most ``failfast`` seconds
    of the balancer being empty."""

    capacity: int = DEFAULT_CAPACITY
    failfast: float = DEFAULT_FAILFAST


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What ``commands.Wait`` waits on: ``balancer``, with ``queue``'s capacity (the driver passes the timeout)."""

    balancer: Balancer
    queue: Queue

    async def wait(self, timeout: float) -> Slot | Full | None:
        return await self.balancer.wait(timeout, self.queue.capacity)


def queued(balancer: Balancer, queue: Queue, service: str, *,
           shed_in_failfast: bool = False) -> Generator[Command, Any, Slot | ProxyError]:
    """An endpoint of ``balancer`` (of the logical ``service``) once one comes, for a request or connection
    that found none (``Balancer.pick`` answered None): the queue is full, or the failfast fired, or the slot.
    ``shed_in_failfast``: one that comes once the failfast has fired is shed at once (503, ``loadshed``), as
    linkerd2-proxy's load shedding in front of its queue sheds while the queue's failfast gate is shut, until
    an endpoint comes (the inbound queue, ``core.inbound_queue``; the outbound one still waits and fails fast)."""
    if shed_in_failfast:
        left = balancer.failfast_left(queue.failfast)
        if left is not None and left <= 0:
            return errors.queue_full(service)
    slot = yield Wait(Enqueued(balancer, queue), queue.failfast)
    if slot is None:
        return errors.failfast(service)
    if slot is FULL:
        return errors.queue_full(service)
    assert isinstance(slot, Slot)
    return slot
