"""``python -m bench.dataplane.no_policy HOST:PORT``: a gRPC server without services (plaintext); ``start`` runs
one in the caller's event loop.

The variants run without the policy controller point their proxies here: every
policy call is answered UNIMPLEMENTED, as an older control plane answers, so a
proxy keeps its default inbound policy and serves targets by their profiles.
With no server at all, a proxy's outbound connections would wait for the
controller's first answer and then be refused, as Linkerd's do (proxy.md §7.1).
"""

from __future__ import annotations

import asyncio
import sys

import grpc


async def start(addr: str = "127.0.0.1:0") -> tuple[grpc.aio.Server, int]:
    """The server, serving on ``addr``, and its port (the one bound when ``addr`` asks for port 0)."""
    server = grpc.aio.server()
    port = server.add_insecure_port(addr)
    await server.start()
    return server, port


async def _serve(addr: str) -> None:
    server, _ = await start(addr)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1]))
