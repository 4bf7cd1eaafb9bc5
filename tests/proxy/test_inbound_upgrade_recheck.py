"""An HTTP connection switched to another protocol (101) follows its port's policy like a TCP connection
(proxy.md §8.3): when a policy change stops admitting the request that switched it, it is torn down and counted
in ``inbound_tcp_authz_terminate_total``.

Socket-free: the watch's decision (``core.inbound_authz``) and the HTTP/1 core handing it to the sink with the
tunnel (a playbook). End to end: two real proxies (tests/proxy/proxy_harness.py) and a real gRPC server standing
in for the policy controller (grpcio, plaintext loopback, as in test_policy_client.py), which the test tells
what to stream.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from playbook import Checkout, Connected, DownData, Playbook, SendDown, SendUp, Tunnel, UpData
from proxy_harness import Mesh, connection, run, samples, scrape
from test_http1_mesh import Web, request
from test_http1_proxy import ADDR, router
from test_inbound_authz import VOTE, WEB, identities_authz, server_message
from test_inbound_tcp_recheck import Changes
from test_policy_client import FakeController

from tether.api import inbound_pb2 as pb
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate
from tether.proxy.core.server_policy import ServerPolicy

UPGRADE = RequestHead(b"GET", b"/api/ws", ((b"host", b"voting"), (b"connection", b"upgrade"), (b"upgrade", b"ws")))


def facts(registry: Registry, client_id: str = WEB) -> ConnectionFacts:
    return ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.1.0.9"), mesh_tls=True, client_id=client_id,
                           target_labels='target_port="8080"', tls_labels=f'tls="true",client_id="{client_id}"',
                           registry=registry)


def test_an_upgraded_connection_is_revoked_when_its_requests_route_stops_admitting_the_client() -> None:
    current: list[ServerPolicy] = [translate(server_message(route_authz=[identities_authz("web", WEB)]))]
    changes, registry = Changes(), Registry(retain_idle=600)
    policy = InboundRequestPolicy(lambda: current[0], facts(registry), clock=lambda: 0.0, changes=changes)
    assert policy.check(UPGRADE) is None
    watch = policy.upgraded(UPGRADE)
    assert watch is not None
    revoked: list[bool] = []
    stop = watch.watch(lambda: revoked.append(True))
    # Another route's authorizations change: this request's route still admits the client.
    message = server_message(route_authz=[identities_authz("web", WEB)])
    other = message.protocol.detect.http_routes.add()
    other.CopyFrom(message.protocol.detect.http_routes[0])
    other.metadata.resource.name, other.rules[0].matches[0].path.prefix = "admin", "/admin"
    del other.authorizations[:]
    current[0] = translate(message)
    changes.fire(8080)
    assert revoked == []
    # Its route now admits only another identity: torn down, once, and counted.
    current[0] = translate(server_message(route_authz=[identities_authz("vote", VOTE)]))
    changes.fire(8080)
    changes.fire(8080)
    assert revoked == [True]
    assert ('inbound_tcp_authz_terminate_total{target_port="8080",srv_group="policy.linkerd.io",srv_kind="server",'
            f'srv_name="voting-grpc",srv_port="8080",tls="true",client_id="{WEB}"}} 1') in registry.render()
    stop()
    assert changes.subscribers[8080] == []
    # No route at all for the request under a policy: not admitted either.
    current[0] = translate(server_message(route_authz=[identities_authz("web", WEB)], path_prefix="/other"))
    assert watch.allowed() is None


def test_without_policy_discovery_an_upgrade_is_not_watched() -> None:
    policy = translate(server_message(route_authz=[identities_authz("web", WEB)]))
    checker = InboundRequestPolicy(lambda: policy, facts(Registry(retain_idle=600)), clock=lambda: 0.0)
    assert checker.upgraded(UPGRADE) is None


def test_the_http1_core_hands_the_watch_to_the_tunnel() -> None:
    current = [translate(server_message(route_authz=[identities_authz("web", WEB)]))]
    policy = InboundRequestPolicy(lambda: current[0], facts(Registry(retain_idle=600)), clock=lambda: 0.0,
                                  changes=Changes())
    head = b"GET /api/ws HTTP/1.1\r\nHost: voting\r\nConnection: upgrade\r\nUpgrade: ws\r\n\r\n"
    switched = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: ws\r\n\r\n"
    play = Playbook(router([]), HttpSettings("inbound", lambda: 0.0, policy=policy, informational=False))
    assert (play
            >> DownData(head)
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET /api/ws HTTP/1.1\r\nHost: voting\r\nUpgrade: ws\r\nconnection: upgrade\r\n\r\n")
            >> UpData(0, switched + b"hi")
            << SendDown(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\nconnection: upgrade\r\n\r\n")
            << Tunnel(0, b"", b"hi", watched=True))


def test_a_policy_change_tears_down_an_upgraded_connection_between_real_proxies(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = FakeController()
        server, port = await controller.serve()
        try:
            async with Mesh(tmp_path) as mesh:
                web_pod, client, svc = mesh.one_served_pod("web", 8080, 80)

                def locked(*identities: str) -> pb.Server:
                    message = server_message(route_authz=[identities_authz("callers", *identities)],
                                             path_prefix="/ws")
                    message.protocol.detect.timeout.seconds = 10
                    return message

                controller.queue(8080).put_nowait(locked(client.identity))
                b = await mesh.start_proxy(web_pod, LINKERD2_PROXY_POLICY_SVC_ADDR=f"127.0.0.1:{port}",
                                           LINKERD2_PROXY_INBOUND_PORTS="8080")
                await mesh.start_proxy(client, outbound_to=[f"{svc}:80"])
                while b.policies.policy(8080).meta.name != "voting-grpc":  # the controller's Server in force
                    await b.policies.updated()
                async with Web(web_pod.ip, 8080, "web-0"):
                    async with connection(svc, 80) as (reader, writer):
                        assert (await request(reader, writer, "GET", "/other"))[0].status == 404  # not its route
                    async with connection(svc, 80) as (reader, writer):
                        writer.write(b"GET /ws HTTP/1.1\r\nhost: web\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\nhi")
                        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
                        assert await reader.readexactly(2) == b"HI"
                        # Still admitted after an update that keeps the client: the bytes go on.
                        controller.queue(8080).put_nowait(locked(client.identity, "someone.else"))
                        await b.policies.updated()
                        writer.write(b"on")
                        assert await reader.readexactly(2) == b"ON"
                        controller.queue(8080).put_nowait(locked("someone.else"))
                        try:
                            rest = await reader.read()
                        except ConnectionError:
                            rest = b""
                        assert rest == b""  # torn down: the client's connection ends
                await b.idle()
                inbound = await scrape(b)
                ended = samples(inbound, "inbound_tcp_authz_terminate_total", srv_name="voting-grpc")
                assert [value for _, value in ended] == [1.0], ended
        finally:
            await server.stop(None)

    run(scenario())


def test_an_http2_connect_tunnel_is_reset_when_a_change_stops_admitting_its_request() -> None:
    """A 2xx to an HTTP/2 CONNECT makes its stream a tunnel (RFC 9113 §8.5), watched as an upgraded HTTP/1
    connection is: on a change that no longer admits it, both legs are reset -- CONNECT_ERROR to the client,
    CANCEL upstream -- and it is counted."""
    from h2.errors import ErrorCodes
    from h2_playbook import Connect, Connected, Data, Do, Down, H2Playbook, Headers, Rst, SendDown, SendUp, Up
    from test_http2_proxy import ADDRS, Router, http_settings

    def catch_all(*identities: str) -> ServerPolicy:
        message = server_message(route_authz=[identities_authz("callers", *identities)])
        del message.protocol.detect.http_routes[0].rules[0].matches[:]  # every request, CONNECT's too
        return translate(message)

    current = [catch_all(WEB)]
    changes, registry = Changes(), Registry(retain_idle=600)
    policy = InboundRequestPolicy(lambda: current[0], facts(registry), clock=lambda: 0.0, changes=changes)
    connect = [(b":method", b"CONNECT"), (b":authority", b"db.example.com:5432")]
    ok = [(b":status", b"200")]

    def change(*identities: str) -> None:
        current[0] = catch_all(*identities)
        changes.fire(8080)

    play = H2Playbook(Router(ADDRS[:1]), http_settings("inbound", policy=policy, informational=False))
    assert (play
            >> Down(Headers(1, connect))
            << Connect(ADDRS[0])
            >> Connected()
            << SendUp(0, Headers(1, connect))
            >> Up(0, Headers(1, ok))
            << SendDown(Headers(1, ok))
            >> Do(lambda: change(WEB, VOTE))  # still admitted: nothing happens
            >> Down(Data(1, b"ping"))
            << SendUp(0, Data(1, b"ping"))
            >> Do(lambda: change(VOTE))
            << SendDown(Rst(1, ErrorCodes.CONNECT_ERROR))
            << SendUp(0, Rst(1, ErrorCodes.CANCEL)))
    assert changes.subscribers[8080] == []  # the watch ended with the stream
    assert ('inbound_tcp_authz_terminate_total{target_port="8080",srv_group="policy.linkerd.io",srv_kind="server",'
            f'srv_name="voting-grpc",srv_port="8080",tls="true",client_id="{WEB}"}} 1') in registry.render()
