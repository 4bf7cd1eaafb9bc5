"""``python -m bench.dataplane.no_policy HOST:PORT``: a gRPC server without services (plaintext).

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


async def _serve(addr: str) -> None:
    server = grpc.aio.server()
    server.add_insecure_port(addr)
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1]))
