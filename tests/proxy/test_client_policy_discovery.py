"""A target's first client policy is waited for, as Linkerd waits (proxy.md §7.1).

``OutboundPolicies.Watch`` against a real gRPC server standing in for the
policy controller (grpcio, plaintext loopback): the proxy's watch
(``io.discovery.PolicyWatch``) and what the outbound layer does with each
answer -- a policy (served), ``NOT_FOUND`` / ``UNIMPLEMENTED`` (no policy:
the profile alone), ``INVALID_ARGUMENT`` / ``FAILED_PRECONDITION`` (the
connection fails), nothing within the failfast timeout (the connection fails:
an unreachable controller is retried, never skipped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from layer_helpers import drive, replies

from tether.api import outbound_pb2 as outbound_pb
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.balancer_queue import Queue
from tether.proxy.core import commands as cmd
from tether.proxy.core.config import Backoff
from tether.proxy.core.outbound import OutboundSettings, outbound
from tether.proxy.io.discovery import Discovery
from tether.proxy.io.grpc_client import Channel

TARGET = parse_socket_addr("10.0.0.1:80")


class Controller:
    """OutboundPolicies.Watch answering each call with ``code`` (None: an open stream that sends nothing)."""

    def __init__(self, code: grpc.StatusCode | None) -> None:
        self.code = code
        self.calls = 0
        self.called = asyncio.Event()

    async def watch(self, spec: outbound_pb.TrafficSpec,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[outbound_pb.OutboundPolicy]:
        self.calls += 1
        self.called.set()
        if self.code is not None:
            await context.abort(self.code, "as the test says")
        await asyncio.Event().wait()  # never answers
        yield outbound_pb.OutboundPolicy()

    async def serve(self, port: int = 0) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "io.linkerd.proxy.outbound.OutboundPolicies", {"Watch": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=outbound_pb.TrafficSpec.FromString,
                response_serializer=outbound_pb.OutboundPolicy.SerializeToString)}),))
        port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        return server, port


def discovery_for(port: int) -> Discovery:
    discovery = Discovery(context_token="", idle_timeout=60.0,
                          backoff=Backoff(timedelta(milliseconds=10), timedelta(milliseconds=10), 0.0),
                          failfast=3.0, clock=lambda: 0.0)
    channel = Channel(f"127.0.0.1:{port}")
    discovery.enable_client_policy('{"ns":"emojivoto","pod":"web"}', lambda: channel)
    return discovery


def settings(discovery: Discovery) -> OutboundSettings:
    return OutboundSettings(detect_timeout=10.0, connect_timeout=1.0, failfast=0.3, http_queue=Queue(failfast=0.3), profile_networks=(),
                            local_ips=frozenset(), own_addrs=frozenset(), refuse_loopback=True,
                            client_policies=discovery.client_policy)


async def first_commands(discovery: Discovery) -> list[Any]:
    """The outbound layer's commands for a connection to TARGET, up to its first Detect or Refuse; a Wait is
    answered by the watch itself, as the driver answers it."""
    layer = outbound(TARGET, settings(discovery), None)
    seen: list[Any] = []
    reply: Any = None
    try:
        while True:
            command = layer.send(reply)
            seen.append(command)
            if isinstance(command, (cmd.Detect, cmd.Refuse)):
                return seen
            reply = await command.source.wait(command.timeout) if isinstance(command, cmd.Wait) else None
    finally:
        layer.close()


@pytest.mark.parametrize("code, outcome", [
    (grpc.StatusCode.NOT_FOUND, "served"),  # no policy: the profile alone (here: forwarded as it is)
    (grpc.StatusCode.UNIMPLEMENTED, "served"),  # an older control plane
    (grpc.StatusCode.INVALID_ARGUMENT, cmd.Refuse("discovery rejected")),
    (grpc.StatusCode.FAILED_PRECONDITION, cmd.Refuse("discovery rejected")),
    (grpc.StatusCode.UNAVAILABLE, cmd.Refuse("discovery unavailable")),  # retried, never answered in time
    (None, cmd.Refuse("discovery unavailable")),  # the stream stays silent
])
def test_the_first_policy_answer_decides_the_connection(code: grpc.StatusCode | None, outcome: object) -> None:
    async def scenario() -> None:
        controller = Controller(code)
        server, port = await controller.serve()
        discovery = discovery_for(port)
        try:
            seen = await first_commands(discovery)
            assert isinstance(seen[0], cmd.SetLabels) and isinstance(seen[1], cmd.Wait)
            if outcome == "served":
                assert isinstance(seen[-1], cmd.Detect), seen
            else:
                assert seen[-1] == outcome, seen
            if code is grpc.StatusCode.UNAVAILABLE:
                assert controller.calls > 1  # retried with backoff while the connection waited
        finally:
            for watch in list(discovery.policies.values()):
                watch.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_a_connection_waits_for_a_controller_that_is_down_and_goes_on_when_it_answers() -> None:
    async def scenario() -> None:
        controller = Controller(grpc.StatusCode.NOT_FOUND)
        server, port = await controller.serve()
        await server.stop(None)  # down: connections refused, the watch retries
        discovery = discovery_for(port)
        try:
            watch = discovery.client_policy(TARGET)
            waiting = asyncio.ensure_future(watch.wait(30.0))
            await asyncio.sleep(0.1)  # several backoff periods; nothing to await: nothing may happen
            assert not waiting.done() and not watch.ready
            restarted, _ = await controller.serve(port)
            try:
                assert await waiting is None  # NOT_FOUND: no policy, the profile alone
            finally:
                await restarted.stop(None)
            watch.release()
        finally:
            for watch in list(discovery.policies.values()):
                watch.close()

    asyncio.run(scenario())


def test_the_layer_refuses_what_the_watch_failed() -> None:
    class Refused:
        policy = None
        ready = True
        failed = cmd.Failed("discovery rejected")

        def release(self) -> None:
            pass

    layer_settings = OutboundSettings(detect_timeout=10.0, connect_timeout=1.0, failfast=3.0, profile_networks=(),
                                      local_ips=frozenset(), own_addrs=frozenset(), refuse_loopback=True,
                                      client_policies=lambda addr: Refused())  # type: ignore[arg-type,return-value]
    seen = drive(outbound(TARGET, layer_settings, None), replies({}))
    assert seen[-1] == cmd.Refuse("discovery rejected")
