"""Peak-EWMA, power of two choices, failfast and endpoint metadata, on a hand-moved clock."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from tether.api import destination_pb2 as pb
from tether.api.addresses import to_tcp_address
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core.balancer import DEFAULT_RTT, Balancer, Slot
from tether.proxy.io.discovery import WaitingBalancer
from tether.proxy.core.endpoint import Endpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def endpoint(n: int) -> Endpoint:
    return Endpoint(parse_socket_addr(f"10.0.0.{n}:8080"))


def test_peak_ewma_follows_peaks_at_once_and_decays_otherwise() -> None:
    clock = Clock()
    clock.now = 0.0
    slot = Slot(endpoint(1), 0.0, clock)
    assert slot.estimate == DEFAULT_RTT
    slot.connected(0.5)
    assert slot.estimate == 0.5  # a peak is taken as it is
    clock.now = 10.0
    slot.connected(0.1)  # one decay period later, weight exp(-1) on the old estimate
    assert slot.estimate == pytest.approx(0.5 * math.exp(-1) + 0.1 * (1 - math.exp(-1)))
    before = slot.estimate
    slot.in_flight = 2
    assert slot.load(20.0) == pytest.approx(before * math.exp(-1) * 3)  # reading decays towards zero


def test_p2c_prefers_the_less_loaded_of_two() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock, rng=random.Random(7))
    balancer.add([endpoint(1), endpoint(2)])
    slow, fast = balancer.pick(), None
    assert slow is not None
    balancer.connected(slow, 0.5)
    for _ in range(20):
        fast = balancer.pick()
        assert fast is not None and fast.endpoint != slow.endpoint
    # Load is latency x (in flight + 1): enough connections on the fast one tip the balance.
    assert fast is not None
    fast.in_flight = 100
    assert balancer.pick() is slow


def test_p2c_skips_endpoints_in_backoff_unless_none_is_left() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock, rng=random.Random(1), backoff=lambda n: 10.0)
    balancer.add([endpoint(1), endpoint(2), endpoint(3)])
    failing = balancer.pick()
    assert failing is not None
    balancer.failed(failing)
    assert all(balancer.pick() is not failing for _ in range(30))
    for slot in list(balancer._slots.values()):  # every one failing: they are still tried
        balancer.failed(slot)
    assert balancer.pick() is not None
    clock.now += 11
    assert balancer.pick() is not None


def test_updates_replace_metadata_and_keep_statistics() -> None:
    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock)
    balancer.add([endpoint(1)])
    slot = balancer.pick()
    assert slot is not None
    balancer.connected(slot, 0.2)
    balancer.add([Endpoint(endpoint(1).addr, weight=5)])
    again = balancer.pick()
    assert again is slot and again.endpoint.weight == 5 and again.estimate == 0.2
    balancer.remove([endpoint(1).addr])
    assert balancer.pick() is None
    balancer.reset([endpoint(2), endpoint(3)])
    assert {e.addr for e in balancer.endpoints} == {endpoint(2).addr, endpoint(3).addr}
    assert balancer.updates == {"Reset": 1, "Add": 2, "Remove": 1}


def test_failfast_after_the_set_has_been_empty_for_the_timeout() -> None:
    async def scenario() -> None:
        clock = Clock()
        balancer = WaitingBalancer(failfast=3.0, clock=clock)
        assert not balancer.in_failfast()
        clock.now += 3.0
        assert balancer.in_failfast()
        assert await balancer.wait(timeout=3.0) is None  # at once: no waiting in failfast
        balancer.add([endpoint(1)])
        assert balancer.in_failfast() is False  # recovered as soon as an endpoint is there
        slot = await balancer.wait(timeout=10.0)
        assert slot is not None and slot.endpoint == endpoint(1)

    asyncio.run(scenario())


def test_waiting_for_the_first_endpoint() -> None:
    async def scenario() -> None:
        balancer = WaitingBalancer(failfast=30.0, clock=asyncio.get_running_loop().time)
        waiting = asyncio.ensure_future(balancer.wait(timeout=30.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        balancer.add([endpoint(4)])
        slot = await waiting
        assert slot is not None and slot.endpoint == endpoint(4)

    asyncio.run(scenario())


def test_the_queue_figures_count_each_request_once_its_wait_and_the_failfast_gate() -> None:
    async def scenario() -> None:
        clock = Clock()
        balancer = WaitingBalancer(failfast=3.0, clock=clock)
        assert balancer.pick() is None  # an HTTP request's own pick finds nothing, then it waits
        waiting = asyncio.ensure_future(balancer.wait(timeout=10.0))
        tcp = asyncio.ensure_future(balancer.wait(timeout=10.0))  # a connection waits without picking first
        await asyncio.sleep(0)
        queue = balancer.gate()
        assert (queue.requests, queue.waiting, queue.shut) == (2, 2, False)
        clock.now += 3.5  # empty for longer than the failfast timeout: the gate shut at 1003
        queue = balancer.gate()
        assert (queue.shut, queue.shuts, queue.shut_at) == (True, 1, 1003.0)
        clock.now += 0.5
        balancer.add([endpoint(1)])  # the gate opens; both waiters go, after 4 s in the queue
        assert (await waiting) is not None and (await tcp) is not None
        assert (queue.shut, queue.opens, queue.opened_at, queue.waiting) == (False, 1, 1004.0, 0)
        assert balancer.pick() is not None  # one more request, served at once
        assert queue.requests == 3
        hist = queue.latency()  # buckets 0.0005 ... 3, +Inf, then sum and count
        assert hist[0] == 1 and hist[6] == 2 and hist[-2] == 8.0 and hist[-1] == 3

    asyncio.run(scenario())


def test_endpoint_from_the_destination_api() -> None:
    weighted = pb.WeightedAddr(addr=to_tcp_address("10.1.0.5", 8080), weight=10000,
                               metric_labels={"pod": "web-0", "zone": "a"})
    weighted.tls_identity.dns_like_identity.name = "web.ns.serviceaccount.identity.linkerd.cluster.local"
    weighted.protocol_hint.opaque_transport.inbound_port = 4143
    weighted.protocol_hint.h2.SetInParent()
    e = Endpoint.from_proto(weighted, {"service": "web", "zone": "set-level"})
    assert e.addr == parse_socket_addr("10.1.0.5:8080")
    assert (e.server_id, e.sni) == ("web.ns.serviceaccount.identity.linkerd.cluster.local",) * 2
    assert (e.opaque_transport_port, e.h2, e.opaque) == (4143, True, False)
    assert e.dst_labels == 'dst_pod="web-0",dst_service="web",dst_zone="a"'  # the address's own labels win
    weighted.tls_identity.server_name.name = "sni.example"
    assert Endpoint.from_proto(weighted).sni == "sni.example"
    uri = pb.WeightedAddr(addr=to_tcp_address("10.1.0.5", 8080))
    uri.tls_identity.uri_like_identity.uri = "spiffe://cluster.local/ns/x/sa/y"
    assert Endpoint.from_proto(uri).server_id is None  # a URI identity without a server name: no TLS


def test_an_endpoints_http2_keep_alive_from_the_destination_api_reaches_its_connect() -> None:
    from tether.proxy.core.endpoint import plan

    weighted = pb.WeightedAddr(addr=to_tcp_address("10.1.0.5", 8080))
    weighted.tls_identity.dns_like_identity.name = "web.ns.serviceaccount.identity.linkerd.cluster.local"
    assert Endpoint.from_proto(weighted).h2_keep_alive is None  # none given: no PINGs
    weighted.http2.keep_alive.interval.FromSeconds(10)
    weighted.http2.keep_alive.timeout.FromMilliseconds(3500)
    weighted.http2.keep_alive.while_idle = True
    endpoint = Endpoint.from_proto(weighted)
    assert endpoint.h2_keep_alive == (10.0, 3.5, True)
    connect = plan(endpoint, local_ips=frozenset(), protocol=None, timeout=1.0).connect
    assert connect.h2_keep_alive == (10.0, 3.5, True)
    weighted.http2.keep_alive.timeout.FromSeconds(0)
    assert Endpoint.from_proto(weighted).h2_keep_alive is None  # a zero duration: none


def test_pooled_connections_to_one_pods_inbound_port_are_kept_per_target_port() -> None:
    """Two ports of one pod reached through its inbound port: a pooled connection's transport header names its
    own target port, so a request for the other port never reuses it (nor a plain connection to that port)."""
    from tether.proxy.codec.transport_header import SessionProtocol
    from tether.proxy.core.endpoint import plan

    def key(port: int, transport: int | None) -> str:
        endpoint = Endpoint(parse_socket_addr(f"10.0.0.5:{port}"), server_id="web.ns.serviceaccount.identity.linkerd.cluster.local",
                            sni="web.ns.serviceaccount.identity.linkerd.cluster.local", opaque_transport_port=transport)
        return plan(endpoint, local_ips=frozenset(), protocol=SessionProtocol.HTTP1, timeout=1.0).connect.pool_key

    assert key(8080, 4143) != key(9090, 4143)
    assert key(8080, 4143) == key(8080, 4143)
    assert key(8080, None) != key(8080, 4143)


def test_two_draws_every_pair_of_distinct_endpoints_alike() -> None:
    from collections import Counter

    from tether.proxy.core.balancer import _two

    for n in (2, 3, 5):
        slots = [Slot(endpoint(i + 1), 0.0, Clock()) for i in range(n)]
        steps = [(k + 0.5) / (n * (n - 1)) for k in range(n * (n - 1))]  # a grid over [0, 1)
        pairs: Counter[tuple[int, int]] = Counter()
        for x in steps:
            for y in steps:
                values = iter((x, y))
                a, b = _two(lambda: next(values), slots)
                assert a is not b
                pairs[(slots.index(a), slots.index(b))] += 1
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1  # each ordered pair, as often


def test_a_request_picked_by_the_router_feeds_its_slot_and_is_counted_in_flight_until_released() -> None:
    from tether.proxy.codec.http1 import RequestHead
    from tether.proxy.core.http import Pick, no_outcome
    from tether.proxy.core.resolution import Resolution
    from tether.proxy.core.routes import outbound_router

    clock = Clock()
    balancer = Balancer(failfast=3.0, clock=clock)
    balancer.add([endpoint(1)])
    route = outbound_router(endpoint(9).addr, Resolution(balancer=balancer, authority="web:80"),
                            local_ips=frozenset(), connect_timeout=1.0, queue=Queue(), loop_addrs=frozenset())
    routing = route(RequestHead(b"GET", b"/"))
    with pytest.raises(StopIteration) as answered:  # answered at once: no wait for discovery
        routing.send(None)
    pick = answered.value.value
    assert isinstance(pick, Pick)
    slot = balancer.pick()
    assert slot is not None and slot.in_flight == 1
    pick.observe(0.25)  # the latency sample goes to the endpoint's estimate
    assert slot.estimate == 0.25
    assert pick.outcome is no_outcome  # no failure accrual: the cores skip the call
    pick.release()
    pick.release()  # released once, however often the layer says so
    assert slot.in_flight == 0
