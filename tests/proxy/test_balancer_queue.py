"""The bounded queue in front of a balancer (core.balancer_queue, io.discovery.WaitingBalancer.wait): a request
that finds no endpoint waits, unless the queue already holds its capacity (503, ``service unavailable``); it fails
at its own kind's failfast timeout (504, ``service in fail-fast``)."""

from __future__ import annotations

import asyncio

import pytest

from tether.proxy.codec.addrs import SocketAddr, parse_ip
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.balancer import FULL, Balancer
from tether.proxy.core.balancer_queue import Enqueued, Queue, queued
from tether.proxy.core.commands import Wait
from tether.proxy.core.endpoint import Endpoint
from tether.proxy.core.errors import ErrorKind, ProxyError
from tether.proxy.core.http import Pick
from tether.proxy.core.resolution import Resolution
from tether.proxy.core.routes import outbound_router
from tether.proxy.io.discovery import WaitingBalancer

WEB = "web.ns.svc.cluster.local:80"


def endpoint(n: int) -> Endpoint:
    return Endpoint(SocketAddr(parse_ip(f"10.0.0.{n}"), 8080))


def test_with_capacity_n_the_waiter_n_plus_1_is_refused_at_once_and_not_counted() -> None:
    async def scenario() -> None:
        balancer = WaitingBalancer(failfast=30.0, clock=asyncio.get_running_loop().time)
        assert balancer.pick() is None  # an HTTP request's own pick finds nothing, then it waits
        first = asyncio.ensure_future(balancer.wait(30.0, capacity=2))
        second = asyncio.ensure_future(balancer.wait(30.0, capacity=2))
        await asyncio.sleep(0)  # both start waiting
        assert balancer.queue.waiting == 2
        assert balancer.pick() is None
        assert await balancer.wait(30.0, capacity=2) is FULL  # the third: refused, not waiting
        assert (balancer.queue.requests, balancer.queue.missed) == (2, 0)  # the refused one is not counted
        balancer.add([endpoint(1)])
        assert (await first) is not None and (await second) is not None
        assert balancer.queue.waiting == 0

    asyncio.run(scenario())


def test_each_kind_waits_for_its_own_failfast_timeout() -> None:
    async def scenario() -> None:
        clock = [100.0]
        balancer = WaitingBalancer(failfast=3.0, clock=lambda: clock[0])  # the balancer's own: TCP's
        clock[0] += 1.5  # empty for 1.5 s: past a 1 s failfast, not past the 3 s one
        assert await balancer.wait(1.0) is None  # at once: this kind's gate is shut
        balancer.add([endpoint(1)])
        assert await balancer.wait(1.0) is not None

    asyncio.run(scenario())


def answer(routing, reply):  # type: ignore[no-untyped-def]
    with pytest.raises(StopIteration) as answered:
        routing.send(reply)
    return answered.value.value


def test_the_router_queues_under_the_http_queue_and_answers_as_linkerd() -> None:
    balancer = Balancer(failfast=3.0, clock=lambda: 0.0)
    queue = Queue(capacity=5, failfast=0.7)
    route = outbound_router(endpoint(9).addr, Resolution(balancer=balancer, authority=WEB), local_ips=frozenset(),
                            connect_timeout=1.0, queue=queue, loop_addrs=frozenset())
    routing = route(RequestHead(b"GET", b"/"))
    assert routing.send(None) == Wait(Enqueued(balancer, queue), 0.7)  # the HTTP failfast, not the TCP one
    full = answer(routing, FULL)
    assert isinstance(full, ProxyError) and full.kind is ErrorKind.LOAD_SHED and full.status == 503
    assert full.message == f"logical service {WEB}: service unavailable" and full.metric == "loadshed"
    routing = route(RequestHead(b"GET", b"/"))
    routing.send(None)
    failed = answer(routing, None)
    assert isinstance(failed, ProxyError) and failed.status == 504
    assert failed.message == f"logical service {WEB}: service in fail-fast"
    routing = route(RequestHead(b"GET", b"/"))
    routing.send(None)
    balancer.add([endpoint(1)])
    slot = balancer.pick()
    assert isinstance(answer(routing, slot), Pick)  # an endpoint came while it waited
    assert isinstance(answer(route(RequestHead(b"GET", b"/")), None), Pick)  # picked at once: no Wait


def test_queued_maps_the_three_answers() -> None:
    balancer = Balancer(failfast=3.0, clock=lambda: 0.0)
    queue = Queue(capacity=1, failfast=2.0)
    for reply, expected in ((None, ErrorKind.FAILFAST), (FULL, ErrorKind.LOAD_SHED)):
        waiting = queued(balancer, queue, "svc:80")
        assert waiting.send(None) == Wait(Enqueued(balancer, queue), 2.0)
        got = answer(waiting, reply)
        assert isinstance(got, ProxyError) and got.kind is expected
    balancer.add([endpoint(1)])
    waiting = queued(balancer, queue, "svc:80")
    waiting.send(None)
    slot = balancer.pick()
    assert answer(waiting, slot) is slot


def test_shed_in_failfast_answers_503_at_once_once_the_failfast_fired() -> None:
    """linkerd2-proxy's load shedding in front of a queue whose failfast gate is shut (the inbound queue's
    rule): a request that comes once the balancer has been empty for the failfast timeout is shed, not queued;
    one that comes before waits as any."""
    clock = [0.0]
    balancer = Balancer(failfast=1.0, clock=lambda: clock[0])  # empty since 0
    queue = Queue(capacity=5, failfast=1.0)
    clock[0] = 0.5
    assert queued(balancer, queue, "svc:80", shed_in_failfast=True).send(None) == Wait(Enqueued(balancer, queue), 1.0)
    clock[0] = 1.0
    shed = answer(queued(balancer, queue, "svc:80", shed_in_failfast=True), None)
    assert isinstance(shed, ProxyError) and shed.kind is ErrorKind.LOAD_SHED
    assert shed.message == "logical service svc:80: service unavailable"
    # Without it (the outbound queue's rule today), the request waits, and fails fast.
    assert queued(balancer, queue, "svc:80").send(None) == Wait(Enqueued(balancer, queue), 1.0)
    balancer.add([endpoint(1)])  # an endpoint: the gate opens
    assert queued(balancer, queue, "svc:80", shed_in_failfast=True).send(None) == Wait(Enqueued(balancer, queue), 1.0)


def test_a_connection_waits_under_the_tcp_queue_and_is_closed_as_loadshed_when_it_is_full() -> None:
    import ipaddress

    from tether.proxy.codec import detect
    from tether.proxy.core import commands as cmd
    from tether.proxy.core.outbound import OutboundSettings, outbound

    balancer = Balancer(failfast=3.0, clock=lambda: 0.0)

    class Discovery:
        def profile(self, addr: SocketAddr) -> Discovery:
            return self

        def release(self) -> None:
            pass

    settings = OutboundSettings(detect_timeout=10.0, connect_timeout=1.0, failfast=0.4, tcp_queue_capacity=7,
                                profile_networks=(ipaddress.ip_network("10.0.0.0/8"),), local_ips=frozenset(),
                                own_addrs=frozenset(), refuse_loopback=True)
    layer = outbound(SocketAddr(parse_ip("10.96.0.1"), 7000), settings, Discovery())  # type: ignore[arg-type]
    assert isinstance(next(layer), cmd.SetLabels)
    assert isinstance(layer.send(None), cmd.Wait)  # the profile
    assert isinstance(layer.send(Resolution(balancer=balancer, authority=WEB)), cmd.Detect)
    waiting = layer.send(detect.Opaque())
    assert waiting == Wait(Enqueued(balancer, Queue(7, 0.4)), 0.4)  # TCP's capacity and failfast
    assert layer.send(FULL) == cmd.Refuse("loadshed")  # outbound_tcp_errors_total{error="loadshed"}
