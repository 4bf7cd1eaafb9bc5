"""Open TCP/opaque connections follow their port's policy (proxy.md §8.3): re-checked on every change.

Socket-free for the decision (``core.inbound_authz.TcpAuthzWatch`` and the
inbound layer's ``Forward``); ``io.policy_client``'s subscriptions against a
real gRPC server standing in for the policy controller (as in
test_policy_client.py). The end-to-end case -- a real connection closed by a
real proxy when a real controller's policy changes -- is in
tests/up/test_inbound_policy.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections.abc import Callable

from layer_helpers import drive, replies
from test_inbound_authz import VOTE, WEB, identities_authz, request, server_message
from test_inbound_layer import CLIENT, settings
from test_policy_client import FakeController, default

import pytest

from tether.api import inbound_pb2 as pb
from tether.ports import PortSet
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core import commands as cmd
from tether.proxy.core.inbound import inbound
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy, TcpAuthzWatch
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.server_policy import ServerPolicy, default_policy
from tether.proxy.io.grpc_client import Channel
from tether.proxy.io.policy_client import PolicyClient

OPAQUE = parse_socket_addr("10.1.0.5:3306")  # an opaque port of test_inbound_layer.settings()


def opaque_server(*identities: str, name: str = "db") -> pb.Server:
    message = pb.Server(labels={"group": "policy.linkerd.io", "kind": "server", "name": name})
    message.protocol.opaque.SetInParent()
    message.authorizations.append(identities_authz("db-clients", *identities))
    return message


class Changes:
    """The policy client's ``subscribe``, by hand: the test says when a port's policy changed."""

    def __init__(self) -> None:
        self.subscribers: dict[int, list[Callable[[], None]]] = {}

    def __call__(self, port: int, changed: Callable[[], None]) -> Callable[[], None]:
        self.subscribers.setdefault(port, []).append(changed)
        return lambda: self.subscribers[port].remove(changed)

    def fire(self, port: int) -> None:
        for changed in list(self.subscribers.get(port, ())):
            changed()


def watch_for(current: list[ServerPolicy], changes: Changes, registry: Registry, client_id: str) -> TcpAuthzWatch:
    facts = ConnectionFacts(port=3306, client_ip=ipaddress.ip_address("10.1.0.9"), mesh_tls=True, client_id=client_id,
                            target_labels='target_port="3306"', tls_labels=f'tls="true",client_id="{client_id}"',
                            registry=registry)
    return TcpAuthzWatch(lambda: current[0], changes, facts)


def test_one_connections_facts_decide_alike_for_the_request_check_and_the_tcp_watch() -> None:
    """``ConnectionFacts`` is the one home of the connection's side of a decision: both checks read it."""
    facts = ConnectionFacts(port=3306, client_ip=ipaddress.ip_address("10.1.0.9"), mesh_tls=True, client_id=VOTE,
                            target_labels='target_port="3306"', tls_labels=f'tls="true",client_id="{VOTE}"',
                            registry=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.client_id = WEB  # type: ignore[misc]
    assert facts.client() == f"10.1.0.9 ({VOTE})"
    for admitted, current in ((True, [translate(opaque_server(VOTE))]), (False, [translate(opaque_server(WEB))])):
        assert (facts.admitting(current[0].authorizations) is not None) is admitted
        assert (TcpAuthzWatch(lambda: current[0], Changes(), facts).allowed() is not None) is admitted
    http = [translate(server_message(route_authz=[identities_authz("vote-only", VOTE)]))]
    assert InboundRequestPolicy(lambda: http[0], facts, clock=lambda: 0.0).check(request(b"/api/vote")) is None
    http[0] = translate(server_message(route_authz=[identities_authz("web-only", WEB)]))
    denied = InboundRequestPolicy(lambda: http[0], facts, clock=lambda: 0.0).check(request(b"/api/vote"))
    assert denied is not None and denied.status == 403


def test_a_connection_no_longer_admitted_is_revoked_once_and_counted() -> None:
    registry, changes = Registry(retain_idle=600), Changes()
    current = [translate(opaque_server(WEB, VOTE))]
    revoked: list[str] = []
    web, vote = watch_for(current, changes, registry, WEB), watch_for(current, changes, registry, VOTE)
    web.watch(lambda: revoked.append("web"))
    stop_vote = vote.watch(lambda: revoked.append("vote"))
    changes.fire(3306)  # an update that still admits both
    assert revoked == []
    current[0] = translate(opaque_server(WEB, name="db-locked"))
    changes.fire(3306)
    changes.fire(3306)
    assert revoked == ["vote"]  # once, however many updates follow
    assert ('inbound_tcp_authz_terminate_total{target_port="3306",srv_group="policy.linkerd.io",srv_kind="server",'
            f'srv_name="db-locked",srv_port="3306",tls="true",client_id="{VOTE}"}} 1') in registry.render()
    stop_vote()
    assert len(changes.subscribers[3306]) == 1  # the web connection's watch is left


def test_a_forwarded_connection_is_cut_when_the_policy_stops_admitting_it() -> None:
    changes, registry = Changes(), Registry(retain_idle=600)
    current = [default_policy(DefaultPolicy.ALL_UNAUTHENTICATED, (), opaque=True)]
    layer_settings = settings(policies=lambda port: current[0], policy_changes=changes, registry=registry)
    seen = drive(inbound(OPAQUE, CLIENT, layer_settings),  # plaintext from 10.1.0.9: admitted by the default
                 replies({cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    forward = seen[-1]
    assert isinstance(forward, cmd.Forward) and forward.authz is not None
    revoked: list[bool] = []
    stop = forward.authz.watch(lambda: revoked.append(True))
    changes.fire(3306)
    assert revoked == []
    current[0] = translate(opaque_server(WEB))  # mesh TLS as web only now
    changes.fire(3306)
    assert revoked == [True]
    assert 'inbound_tcp_authz_terminate_total{target_addr="10.1.0.5:3306"' in registry.render()
    assert 'srv_name="db",srv_port="3306",tls="no_identity",no_tls_reason="port_skipped"} 1' in registry.render()
    stop()
    assert changes.subscribers[3306] == []


def test_without_policy_discovery_nothing_is_watched() -> None:
    seen = drive(inbound(OPAQUE, CLIENT, settings()),
                 replies({cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    assert seen[-1] == cmd.Forward(None)


def test_subscribers_hear_each_update_and_keep_an_unlisted_port_watched() -> None:
    async def scenario() -> None:
        controller = FakeController()
        server, port = await controller.serve()
        now = [0.0]
        client = PolicyClient(workload="w", default=default, idle_timeout=0.05,  # type: ignore[arg-type]
                              backoff_delay=lambda n: 0.05, clock=lambda: now[0])
        try:
            client.set_channel(Channel(f"127.0.0.1:{port}"))
            heard: list[str] = []
            client.policy(3306)
            stop = client.subscribe(3306, lambda: heard.append(client.policy(3306).meta.name))
            controller.queue(3306).put_nowait(opaque_server(WEB, name="first"))
            controller.queue(3306).put_nowait(opaque_server(WEB, name="second"))
            while len(heard) < 2:
                await client.updated()
            assert heard == ["first", "second"]
            now[0] = 10.0  # long past the idle timeout, but a connection still follows the port
            expiry = client.updated()
            await asyncio.sleep(0.2)  # several idle-timeout periods; nothing to await: nothing may happen
            assert not expiry.done() and 3306 in client.watched()
            stop()
            now[0] = 20.0
            while 3306 in client.watched():
                await client.updated()
        finally:
            await client.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_an_http_connection_checks_each_request_against_the_policy_of_the_moment() -> None:
    current = [translate(server_message(route_authz=[identities_authz("web-only", WEB)]))]
    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.0.0.7"), mesh_tls=True, client_id=VOTE,
                            target_labels='target_port="8080"', tls_labels=f'tls="true",client_id="{VOTE}"',
                            registry=None)
    connection = InboundRequestPolicy(lambda: current[0], facts, clock=lambda: 0.0)
    denied = connection.check(request(b"/api/vote"))
    assert denied is not None and denied.status == 403
    current[0] = translate(server_message(route_authz=[identities_authz("both", WEB, VOTE)]))
    assert connection.check(request(b"/api/vote")) is None  # the same connection, the new policy
