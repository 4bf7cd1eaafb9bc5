"""The reconnecting of an unreachable app port (io/inbound_ports.py), with a fake connect: tried after each
backoff step until one connects, which puts the app back as the port's one endpoint and wakes what waits; let go
when nobody waited for the idle timeout."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from proxy_harness import run

from tether.proxy.codec.addrs import SocketAddr, parse_socket_addr
from tether.proxy.core.balancer import Slot
from tether.proxy.core.config import Backoff
from tether.proxy.io.inbound_ports import AppPorts

APP = parse_socket_addr("127.0.0.1:8080")
QUICK = Backoff(timedelta(milliseconds=1), timedelta(milliseconds=2), 0.0)


class Probe:
    """Refuses the first ``refusals`` tries, then connects; remembers each try's target and timeout."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.tries: list[tuple[SocketAddr, float]] = []
        self.tried = asyncio.Event()

    async def __call__(self, target: SocketAddr, timeout: float) -> bool:
        self.tries.append((target, timeout))
        self.tried.set()
        return len(self.tries) > self.refusals


def test_a_port_is_retried_until_it_connects_and_its_waiters_go_on() -> None:
    async def scenario() -> None:
        probe = Probe(refusals=2)
        ports = AppPorts(failfast=3600.0, backoff=QUICK, connect_timeout=0.3, idle_timeout=3600.0,
                         clock=time.monotonic, probe=probe)
        ports.unreachable(APP)
        balancer = ports.unreachable_ports[APP]
        ports.unreachable(APP)  # already reconnecting: the same balancer, one reconnect loop
        assert ports.unreachable_ports[APP] is balancer and not balancer.has_endpoints
        slot = await balancer.wait(3600.0, capacity=10)  # woken by the reconnect
        assert isinstance(slot, Slot) and slot.endpoint.addr == APP
        assert probe.tries == [(APP, 0.3)] * 3
        assert APP not in ports.unreachable_ports  # reachable again: the next failure starts over
        ports.close()

    run(scenario())


def test_a_port_nobody_waits_for_is_let_go_after_the_idle_timeout() -> None:
    async def scenario() -> None:
        probe = Probe(refusals=1_000_000)
        ports = AppPorts(failfast=1.0, backoff=QUICK, connect_timeout=0.3, idle_timeout=0.0, clock=time.monotonic,
                         probe=probe)
        ports.unreachable(APP)
        balancer = ports.unreachable_ports[APP]
        while APP in ports.unreachable_ports:  # no event says so: yield to the reconnect loop
            await asyncio.sleep(0)
        assert len(probe.tries) == 1 and not balancer.has_endpoints
        ports.close()

    run(scenario())


def test_close_stops_reconnecting() -> None:
    async def scenario() -> None:
        probe = Probe(refusals=1_000_000)
        ports = AppPorts(failfast=1.0, backoff=QUICK, connect_timeout=0.3, idle_timeout=3600.0,
                         clock=time.monotonic, probe=probe)
        ports.unreachable(APP)
        await probe.tried.wait()
        ports.close()
        while APP in ports.unreachable_ports:  # the loop's end lets the port go (its finally)
            await asyncio.sleep(0)

    run(scenario())
