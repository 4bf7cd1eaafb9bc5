"""The proxy's per-port WatchPort cache (``io.policy_client``) against a real gRPC server (grpcio, plaintext loopback).

The server stands in for the policy controller: it streams the ``Server``
messages a test queues for each port, so each step can be awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from tether.api import inbound_pb2 as pb
from tether.ports import PortSet
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.server_policy import INVALID, default_policy
from tether.proxy.io.grpc_client import Channel
from tether.proxy.io.policy_client import PolicyClient



class FakeController:
    def __init__(self) -> None:
        self.queues: dict[int, asyncio.Queue[pb.Server]] = {}
        self.requests: list[pb.PortSpec] = []

    def queue(self, port: int) -> asyncio.Queue[pb.Server]:
        return self.queues.setdefault(port, asyncio.Queue())

    async def watch(self, spec: pb.PortSpec, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Server]:
        self.requests.append(spec)
        queue = self.queue(spec.port)
        while True:
            yield await queue.get()

    async def serve(self) -> tuple[grpc.aio.Server, int]:
        """A started gRPC server (plaintext, loopback) serving this controller, and its port."""
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("io.linkerd.proxy.inbound.InboundServerPolicies", {
            "WatchPort": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=pb.PortSpec.FromString,
                response_serializer=pb.Server.SerializeToString),
        })


def default(port: int) -> object:
    return default_policy(DefaultPolicy.ALL_UNAUTHENTICATED, (), opaque=False)


def named(name: str) -> pb.Server:
    message = pb.Server(labels={"group": "policy.linkerd.io", "kind": "server", "name": name})
    message.protocol.opaque.SetInParent()
    return message


async def settled(client: PolicyClient, port: int, name: str) -> None:
    while client.policy(port).meta.name != name:
        await client.updated()


def test_watches_start_from_the_default_and_follow_the_controller() -> None:
    async def scenario() -> None:
        controller = FakeController()
        server, port = await controller.serve()
        client = PolicyClient(workload='{"ns":"emojivoto","pod":"voting"}', default=default,  # type: ignore[arg-type]
                              idle_timeout=90.0, backoff_delay=lambda n: 0.05, clock=asyncio.get_running_loop().time)
        try:
            client.start(PortSet.of([8080]))
            assert client.policy(8080).meta.name == "all-unauthenticated"  # before any channel
            client.set_channel(Channel(f"127.0.0.1:{port}"))
            controller.queue(8080).put_nowait(named("voting"))
            await settled(client, 8080, "voting")
            assert controller.requests[0].workload == '{"ns":"emojivoto","pod":"voting"}'
            # An unlisted port: the default at once, watched from its first use.
            assert client.policy(9090).meta.name == "all-unauthenticated"
            assert client.watched() == {8080, 9090}
            controller.queue(9090).put_nowait(named("other"))
            await settled(client, 9090, "other")
            # A message the proxy cannot use: the invalid policy.
            controller.queue(8080).put_nowait(pb.Server(labels={"name": "broken"}))
            while client.policy(8080) is not INVALID:
                await client.updated()
            # The controller goes away: the last policy stays.
            await server.stop(None)
            await asyncio.sleep(0.2)
            assert client.policy(9090).meta.name == "other"
        finally:
            await client.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_unlisted_ports_expire_when_idle() -> None:
    async def scenario() -> None:
        now = [0.0]
        client = PolicyClient(workload="w", default=default, idle_timeout=0.05,  # type: ignore[arg-type]
                              backoff_delay=lambda n: 0.05, clock=lambda: now[0])
        try:
            client.start(PortSet.of([8080]))
            client.policy(7000)
            assert 7000 in client.watched()
            now[0] = 1.0
            while 7000 in client.watched():
                await client.updated()
            assert client.watched() == {8080}  # listed ports are kept
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_new_channel_takes_over_and_the_old_one_is_closed() -> None:
    async def scenario() -> None:
        controller = FakeController()
        server, port = await controller.serve()
        client = PolicyClient(workload="w", default=default, idle_timeout=90.0,  # type: ignore[arg-type]
                              backoff_delay=lambda n: 0.05, clock=asyncio.get_running_loop().time)
        old, new = Channel(f"127.0.0.1:{port}"), Channel(f"127.0.0.1:{port}")
        try:
            client.set_channel(old)
            client.start(PortSet.of([8080]))
            controller.queue(8080).put_nowait(named("first"))
            await settled(client, 8080, "first")
            client.set_channel(new)  # a certificate refresh
            assert client.channel is new
        finally:
            await client.close()
            await server.stop(None)
        assert old._closed and new._closed  # noqa: SLF001 - nothing else says whether a channel was closed

    asyncio.run(scenario())
