"""Outbound discovery against the real destination service: shared cached streams, endpoint churn, failfast,
and serving from the cache while the destination is down."""

from __future__ import annotations

from pathlib import Path

from proxy_harness import (
    NS,
    EchoServer,
    Mesh,
    closed_without_answer,
    connection,
    ip_addr,
    run,
    samples,
    scrape,
    until,
)

from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.app import Proxy

AUTHORITY = "web.emojivoto.svc.cluster.local:7000"


async def who_answers(svc: str) -> bytes:
    """Open a connection to the service and return the name of the pod that answered."""
    async with connection(svc, 7000) as (reader, writer):
        writer.write(b"ping")
        name = await reader.readline()
        assert await reader.readexactly(4) == b"ping"
        return name.strip()


def endpoints(proxy: Proxy) -> set[SocketAddr]:
    watch = proxy.discovery.services.get(AUTHORITY)
    return set() if watch is None else {e.addr for e in watch.balancer.endpoints}


async def endpoints_become(proxy: Proxy, *ips: str) -> None:
    want = {SocketAddr(ip_addr(ip), 7000) for ip in ips}
    balancer = proxy.discovery.services[AUTHORITY].balancer
    await until(lambda: endpoints(proxy) == want, balancer.updated)


def test_endpoints_added_and_removed_while_connections_flow(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web0 = mesh.pod("web-0", app="web", ports=[7000])
            web1 = mesh.pod("web-1", app="web", ports=[7000], apply=False)
            client = mesh.pod("client-0", app="client")
            svc = mesh.service("web", [(7000, 7000)])
            for pod in (web0, web1):
                await mesh.start_proxy(pod)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:7000"],
                                       LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT="300ms")
            async with EchoServer(web0.ip, 7000, "web-0"), EchoServer(web1.ip, 7000, "web-1"), \
                    connection(svc, 7000) as (reader, writer):
                # A long-lived connection to web-0, the only endpoint.
                writer.write(b"first")
                assert await reader.readline() == b"web-0\n"
                assert await reader.readexactly(5) == b"first"

                # web-1 arrives and web-0 goes: new connections go to web-1, the open one keeps flowing.
                mesh.store.apply_many([web1.manifest()])
                mesh.store.delete("Pod", NS, "web-0")
                await endpoints_become(a, web1.ip)
                assert {await who_answers(svc) for _ in range(5)} == {b"web-1"}
                writer.write(b"still here")
                assert await reader.readexactly(10) == b"still here"

                # No endpoints at all: after the failfast timeout, new connections are closed at once.
                mesh.store.delete("Pod", NS, "web-1")
                await endpoints_become(a)
                async with connection(svc, 7000) as (r2, w2):
                    w2.write(b"anyone?")
                    assert await closed_without_answer(r2)
                metrics = await scrape(a)
                assert samples(metrics, "outbound_tcp_errors_total", error="failfast", target_addr=f"{svc}:7000")

                # An endpoint is back: connections work again straight away.
                mesh.store.apply_many([web0.manifest()])
                await endpoints_become(a, web0.ip)
                assert await who_answers(svc) == b"web-0"
                writer.write(b"and still")
                assert await reader.readexactly(9) == b"and still"

    run(scenario())


def test_one_shared_discovery_per_target_closed_when_idle(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web0, client, svc, _, a = await mesh.two_proxies(
                "web", 7000, client_env={"LINKERD2_PROXY_OUTBOUND_DISCOVERY_IDLE_TIMEOUT": "100ms"})
            async with EchoServer(web0.ip, 7000, "web-0"), connection(svc, 7000) as (r1, w1), \
                    connection(svc, 7000) as (r2, w2):
                for reader, writer in ((r1, w1), (r2, w2)):
                    writer.write(b"x")
                    assert await reader.readline() == b"web-0\n"
                assert list(a.discovery.profiles) == [f"{svc}:7000"]
                assert list(a.discovery.services) == [AUTHORITY]
            # Both connections are gone; after the idle timeout both streams are closed.
            await until(lambda: not a.discovery.profiles and not a.discovery.services, a.discovery.changed)

    run(scenario())


def test_cached_discovery_keeps_serving_while_the_destination_is_down(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            web0, client, svc = mesh.one_served_pod("web", 7000)
            other = mesh.service("other", [(7000, 7000)], app="web")
            await mesh.start_proxy(web0)
            a = await mesh.start_proxy(client, outbound_to=[f"{svc}:7000", f"{other}:7000"],
                                       LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT="300ms")
            async with EchoServer(web0.ip, 7000, "web-0"), connection(svc, 7000) as (reader, writer):
                writer.write(b"x")
                assert await reader.readline() == b"web-0\n"
                await mesh.destination.stop()
                # The target's streams are cached (this connection holds them): new connections still work.
                assert await who_answers(svc) == b"web-0"
                assert await who_answers(svc) == b"web-0"
                # A target never looked up cannot be resolved now: refused after the failfast timeout.
                async with connection(other, 7000) as (r2, w2):
                    w2.write(b"x")
                    assert await closed_without_answer(r2)
                metrics = await scrape(a)
                assert samples(metrics, "outbound_tcp_errors_total", error="discovery unavailable",
                               target_addr=f"{other}:7000")

    run(scenario())
