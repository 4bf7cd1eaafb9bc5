"""A Service the destination does not know yet is asked for again (``io.discovery.ServiceWatch``).

A client policy or profile can name a Service a moment before the destination has seen it (each
control-plane component follows the cluster on its own watch). ``Destination.Get`` then answers
``NOT_FOUND``; were that final, the service's balancer would stay empty -- every request failing fast --
for as long as traffic keeps the watch leased. Against a real gRPC server standing in for the destination
(grpcio, plaintext loopback) that answers ``NOT_FOUND`` until the test "creates" the Service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc

from tether.api import destination_pb2 as pb
from tether.api.addresses import to_tcp_address
from tether.proxy.core.config import Backoff
from tether.proxy.io.discovery import Discovery
from tether.proxy.io.grpc_client import Channel

AUTHORITY = "foreign.tf.svc.cluster.local:80"


class Destination:
    """Destination.Get: ``NOT_FOUND`` until ``exists`` is set, then one endpoint with an identity, held open."""

    def __init__(self) -> None:
        self.exists = False
        self.calls = 0
        self.not_found = asyncio.Event()

    async def get(self, request: pb.GetDestination,
                  context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Update]:
        self.calls += 1
        if not self.exists:
            self.not_found.set()
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Service {request.path} not found")
        addr = pb.WeightedAddr(addr=to_tcp_address("10.1.0.4", 8080), weight=10000)
        addr.tls_identity.dns_like_identity.name = "default.tf.serviceaccount.identity.linkerd.cluster.local"
        yield pb.Update(add=pb.WeightedAddrSet(addrs=[addr]))
        await asyncio.Event().wait()

    async def serve(self) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "io.linkerd.proxy.destination.Destination", {"Get": grpc.unary_stream_rpc_method_handler(
                self.get, request_deserializer=pb.GetDestination.FromString,
                response_serializer=pb.Update.SerializeToString)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port


def test_a_service_not_found_is_asked_for_again_until_it_exists() -> None:
    async def scenario() -> None:
        destination = Destination()
        server, port = await destination.serve()
        discovery = Discovery(context_token="", idle_timeout=60.0,
                              backoff=Backoff(timedelta(milliseconds=10), timedelta(milliseconds=10), 0.0),
                              failfast=3.0, clock=lambda: 0.0)
        discovery.set_channel(Channel(f"127.0.0.1:{port}"))
        try:
            watch = discovery.service(AUTHORITY)
            await asyncio.wait_for(destination.not_found.wait(), 10.0)
            assert not watch.balancer.has_endpoints and not watch.closed
            destination.exists = True  # the destination has seen the Service now
            while not watch.balancer.has_endpoints:
                await asyncio.wait_for(watch.balancer.updated(), 10.0)
            (endpoint,) = watch.balancer.endpoints
            assert str(endpoint.addr) == "10.1.0.4:8080"
            assert endpoint.server_id == "default.tf.serviceaccount.identity.linkerd.cluster.local"
            assert destination.calls >= 2
            watch.release()
        finally:
            await discovery.close()
            await server.stop(None)

    asyncio.run(scenario())
