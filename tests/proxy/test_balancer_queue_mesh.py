"""The outbound HTTP queue through a real proxy (in-process, loopback; the Kubernetes API is kmock, as in every
proxy_harness test): with LINKERD2_PROXY_OUTBOUND_HTTP_QUEUE_CAPACITY=N, N requests wait for an endpoint of a
Service that has none and request N+1 is answered as linkerd2-proxy answers a full queue (503, ``l5d-proxy-error:
logical service ...: service unavailable``, ``loadshed`` in the error metrics); the waiting ones then fail at
LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT, HTTP's own (the TCP one is left at an hour: were it used, the test
would hang)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy_harness import Mesh, run, samples, scrape
from test_http1_mesh import header, request

from tether.proxy.io.discovery import WaitingBalancer

CAPACITY = 2


def test_request_n_plus_1_is_shed_and_the_waiting_ones_fail_at_the_http_failfast(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            empty, a = await mesh.proxy_to_nowhere(LINKERD2_PROXY_OUTBOUND_HTTP_QUEUE_CAPACITY=str(CAPACITY),
                                                   LINKERD2_PROXY_OUTBOUND_HTTP_FAILFAST_TIMEOUT="1s",
                                                   LINKERD2_PROXY_OUTBOUND_TCP_FAILFAST_TIMEOUT="1h")
            connections = [await asyncio.open_connection(empty, 80) for _ in range(CAPACITY + 1)]
            try:
                waiting = [asyncio.ensure_future(request(reader, writer, "GET", f"/{n}"))
                           for n, (reader, writer) in enumerate(connections[:CAPACITY])]
                balancer = None
                while balancer is None or balancer.queue.waiting < CAPACITY:  # no event says so: yield to the proxy
                    await asyncio.sleep(0)
                    watch = next((w for k, w in a.discovery.services.items() if k.startswith("nobody.")), None)
                    balancer = watch.balancer if watch is not None else None
                assert isinstance(balancer, WaitingBalancer)
                reader, writer = connections[CAPACITY]
                head, _ = await request(reader, writer, "GET", "/one-too-many")
                assert head.status == 503
                error = header(head, b"l5d-proxy-error") or b""
                assert error.startswith(b"logical service nobody.") and error.endswith(b": service unavailable")
                assert header(head, b"connection") == b"close"
                assert not any(w.done() for w in waiting)  # the queue keeps its N
                for answer in await asyncio.gather(*waiting):
                    head, _ = answer
                    assert head.status == 504 and b"service in fail-fast" in (header(head, b"l5d-proxy-error") or b"")
            finally:
                for _, writer in connections:
                    writer.close()
            await a.idle()
            out = await scrape(a)
            assert [n for _, n in samples(out, "outbound_http_errors_total", error="loadshed")] == [1]
            assert [n for _, n in samples(out, "outbound_http_errors_total", error="failfast")] == [CAPACITY]

    run(scenario())
