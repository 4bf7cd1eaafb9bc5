"""Linkerd 2.20's inbound route families (proxy.md §9.5) of a request an inbound route authorized:
``inbound_{http,grpc}_requests_total``, ``..._statuses_total``, ``..._request_duration_seconds``,
``..._response_duration_seconds`` and ``..._{request,response}_frame_size_bytes`` under the Server (``parent_*``)
and the route (``route_*``), no namespace; ``grpc`` when the Server's protocol is gRPC.

Socket-free: the inbound layer (``core.inbound``) hands its router and settings to the HTTP/1 or HTTP/2 core,
driven by a playbook, with a clock the test moves; the policy is a real policy controller message translated as
the proxy does.
"""

from __future__ import annotations

from h2_fakes import FakeClock
from h2_playbook import Connect, Data, Do, Down, H2Playbook, Headers, Up
from h2_playbook import Connected as H2Connected
from h2_playbook import SendDown as H2SendDown
from h2_playbook import SendUp as H2SendUp
from layer_helpers import drive, replies
from playbook import (Checkin, Checkout, Close, Connected, Count, DownData, Playbook, Run, SendDown, SendUp, Tunnel,
                      UpData, UpEof)
from test_inbound_authz import WEB, identities_authz, server_message
from test_inbound_layer import APP, CLIENT, FOR_ME, settings

from tether.api import inbound_pb2 as pb
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.codec import detect
from tether.proxy.core import commands as cmd
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http_commands import ServeHttp1, ServeHttp2
from tether.proxy.core.inbound import inbound
from tether.proxy.core.inbound_route_metrics import InboundRouteMetrics
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate

LABELS = ('parent_group="policy.linkerd.io",parent_kind="server",parent_name="voting-grpc",parent_port="8080",'
          'route_group="policy.linkerd.io",route_kind="HTTPRoute",route_name="voting-api"')


GRPC_LABELS = ('parent_group="policy.linkerd.io",parent_kind="server",parent_name="voting-grpc",parent_port="8080",'
               'route_group="policy.linkerd.io",route_kind="GRPCRoute",route_name="voting-rpc"')


def serve(registry: Registry, message: pb.Server | None = None, *, http2: bool = False) -> ServeHttp1 | ServeHttp2:
    policy = translate(message or server_message(route_authz=[identities_authz("web-only", WEB)]))
    layer = settings(policies=lambda port: policy, http=HttpSettings("inbound", registry.clock), registry=registry,
                     route_metrics=InboundRouteMetrics(registry))
    sniffed, served_as = (detect.Http2(), ServeHttp2) if http2 else (detect.Http1(), ServeHttp1)
    served = drive(inbound(APP, CLIENT, layer), replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(WEB, None),
                                                         cmd.Sniff: sniffed, served_as: None}))[-1]
    assert isinstance(served, served_as)
    return served


def grpc_server() -> pb.Server:
    """A Server whose proxy protocol is gRPC, with one GRPCRoute for the client's identity."""
    message = pb.Server(labels={"group": "policy.linkerd.io", "kind": "server", "name": "voting-grpc"})
    route = message.protocol.grpc.routes.add()
    route.metadata.resource.group, route.metadata.resource.kind = "policy.linkerd.io", "GRPCRoute"
    route.metadata.resource.name = "voting-rpc"
    route.rules.add().matches.add().rpc.service = "api"
    route.authorizations.append(identities_authz("web-only", WEB))
    return message


def bucket(text: str, name: str, labels: str, le: str) -> int:
    """A histogram bucket's (cumulative) count in the rendered ``text``."""
    prefix = f'{name}_bucket{{{labels},le="{le}"}} '
    line = next(line for line in text.splitlines() if line.startswith(prefix))
    return int(line.removeprefix(prefix))


def test_an_authorized_request_is_counted_on_its_route_with_its_status_and_response_frames() -> None:
    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    served = serve(registry)
    head = b"POST /api/vote HTTP/1.1\r\nHost: voting\r\nContent-Length: 5\r\n\r\nhello"
    sent = head.replace(b"\r\n\r\n", f"\r\nl5d-client-id: {WEB}\r\n\r\n".encode())
    response = b"HTTP/1.1 201 Created\r\nContent-Length: 2100\r\n\r\n"
    assert (Playbook(served.router, served.settings)
            >> DownData(head)
            << Checkout(APP)
            >> Connected()
            << SendUp(0, sent)
            >> UpData(0, response + b"a" * 100)
            << SendDown(response + b"a" * 100)
            >> UpData(0, b"b" * 2000)
            << SendDown(b"b" * 2000)
            << Checkin(0, reuse=True))
    text = registry.render()
    assert f"inbound_http_requests_total{{{LABELS}}} 1" in text
    assert f'inbound_http_statuses_total{{{LABELS},status="201"}} 1' in text
    frames = f"inbound_http_response_frame_size_bytes_bucket{{{LABELS}"
    assert f'{frames},le="128.0"}} 1' in text and f'{frames},le="1024.0"}} 1' in text
    assert f'{frames},le="10240.0"}} 2' in text
    assert f"inbound_http_response_frame_size_bytes_sum{{{LABELS}}} 2100" in text
    assert f'inbound_http_request_frame_size_bytes_bucket{{{LABELS},le="128.0"}} 1' in text
    assert f"inbound_http_request_frame_size_bytes_sum{{{LABELS}}} 5" in text
    assert "inbound_grpc_requests_total{" not in text


def test_the_durations_run_from_the_authorization_and_from_the_requests_end_to_the_responses_end() -> None:
    """``request_duration``: authorized at 100.0, response over at 100.3; ``response_duration``: the request's last
    body chunk at 100.2, to the same end (linkerd2-proxy's two timers)."""
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    served = serve(registry)

    def at(now: float) -> Run:
        return Run(lambda: setattr(clock, "now", now))

    head = b"POST /api/vote HTTP/1.1\r\nHost: voting\r\nContent-Length: 10\r\n\r\n"
    sent = head.replace(b"\r\n\r\n", f"\r\nl5d-client-id: {WEB}\r\n\r\n".encode())
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"
    assert (Playbook(served.router, served.settings)
            >> DownData(head)
            << Checkout(APP)
            >> Connected()
            << SendUp(0, sent)
            >> at(100.1)
            >> DownData(b"hello")
            << SendUp(0, b"hello")
            >> at(100.2)
            >> DownData(b"world")
            << SendUp(0, b"world")
            >> UpData(0, response + b"ab")
            << SendDown(response + b"ab")
            >> at(100.3)
            >> UpData(0, b"cd")
            << SendDown(b"cd")
            << Checkin(0, reuse=True))
    text = registry.render()
    request = "inbound_http_request_duration_seconds"
    assert bucket(text, request, LABELS, "0.25") == 0 and bucket(text, request, LABELS, "0.5") == 1
    assert f"{request}_count{{{LABELS}}} 1" in text
    assert abs(float(text.split(f"{request}_sum{{{LABELS}}} ")[1].split()[0]) - 0.3) < 1e-9
    response_ = "inbound_http_response_duration_seconds"
    assert bucket(text, response_, LABELS, "0.05") == 0 and bucket(text, response_, LABELS, "0.5") == 1
    assert abs(float(text.split(f"{response_}_sum{{{LABELS}}} ")[1].split()[0]) - 0.1) < 1e-9
    # The request family's buckets are linkerd2-proxy's finer ones; the response family's the coarser ones.
    assert '0.025"' in text.split(f"# TYPE {request}")[1].split("# TYPE")[0]
    assert '0.025"' not in text.split(f"# TYPE {response_}")[1].split("# TYPE")[0]


def test_a_request_the_app_never_answers_is_timed_to_its_failure_but_has_no_status() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    served = serve(registry)
    head = b"GET /api/results HTTP/1.1\r\nHost: voting\r\n\r\n"
    sent = head.replace(b"\r\n\r\n", f"\r\nl5d-client-id: {WEB}\r\n\r\n".encode())
    book = (Playbook(served.router, served.settings)
            >> DownData(head)
            << Checkout(APP)
            >> Connected()
            << SendUp(0, sent)
            >> Run(lambda: setattr(clock, "now", 100.07))
            >> UpEof(0)
            << Checkin(0, reuse=False)
            << Count("inbound_http_errors_total", 'error="i/o",target_addr="10.1.0.5:8080",target_ip="10.1.0.5",'
                     'target_port="8080",srv_group="policy.linkerd.io",srv_kind="server",srv_name="voting-grpc",'
                     'srv_port="8080"')
            << SendDown(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nl5d-proxy-error: endpoint 10.1.0.5:8080: "
                        b"connection closed before the response\r\nconnection: close\r\nl5d-proxy-connection: close"
                        b"\r\n\r\n")
            << Close())
    assert book  # the proxy answers 502 itself: no status of the app's
    text = registry.render()
    assert f"inbound_http_requests_total{{{LABELS}}} 1" in text
    assert "inbound_http_statuses_total{" not in text
    request = "inbound_http_request_duration_seconds"
    assert bucket(text, request, LABELS, "0.05") == 0 and bucket(text, request, LABELS, "0.1") == 1
    assert bucket(text, "inbound_http_response_duration_seconds", LABELS, "0.05") == 0  # from its routing at 100.0


def test_a_grpc_call_on_a_grpc_server_is_counted_in_the_grpc_families_with_its_numeric_grpc_status() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    served = serve(registry, grpc_server(), http2=True)
    call = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"voting:8080"),
            (b":path", b"/api/Vote"), (b"content-type", b"application/grpc")]
    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert (H2Playbook(served.router, served.settings)
            >> Down(Headers(1, call))
            << Connect(APP)
            >> Do(lambda: setattr(clock, "now", 100.01))
            >> Down(Data(1, b"m" * 200, end=True))
            >> H2Connected()
            << H2SendUp(0, Headers(1, [*call, (b"l5d-client-id", WEB.encode())]), Data(1, b"m" * 200, end=True))
            >> Up(0, Headers(1, ok), Data(1, b"r" * 10))
            << H2SendDown(Headers(1, ok), Data(1, b"r" * 10))
            >> Do(lambda: setattr(clock, "now", 100.7))
            >> Up(0, Headers(1, [(b"grpc-status", b"5")], end=True))
            << H2SendDown(Headers(1, [(b"grpc-status", b"5")], end=True)))
    text = registry.render()
    assert f"inbound_grpc_requests_total{{{GRPC_LABELS}}} 1" in text
    assert f'inbound_grpc_statuses_total{{{GRPC_LABELS},status="5"}} 1' in text
    assert f'inbound_grpc_request_frame_size_bytes_bucket{{{GRPC_LABELS},le="128.0"}} 0' in text
    assert f"inbound_grpc_request_frame_size_bytes_sum{{{GRPC_LABELS}}} 200" in text
    assert f'inbound_grpc_response_frame_size_bytes_bucket{{{GRPC_LABELS},le="128.0"}} 1' in text
    request = "inbound_grpc_request_duration_seconds"
    assert bucket(text, request, GRPC_LABELS, "0.5") == 0 and bucket(text, request, GRPC_LABELS, "1.0") == 1
    response = "inbound_grpc_response_duration_seconds"  # 100.01 -> 100.7
    assert bucket(text, response, GRPC_LABELS, "0.5") == 0 and bucket(text, response, GRPC_LABELS, "1.0") == 1
    assert "inbound_http_requests_total{" not in text


def test_a_grpc_call_on_an_http_server_is_counted_in_the_http_families_as_linkerd_does() -> None:
    """linkerd2-proxy's ``PermitVariant`` is the Server's: a gRPC call authorized by an HTTPRoute is http."""
    registry = Registry(retain_idle=600.0, clock=FakeClock())
    served = serve(registry, http2=True)
    call = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"voting:8080"),
            (b":path", b"/api/Vote"), (b"content-type", b"application/grpc")]
    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert (H2Playbook(served.router, served.settings)
            >> Down(Headers(1, call, end=True))
            << Connect(APP)
            >> H2Connected()
            << H2SendUp(0, Headers(1, [*call, (b"l5d-client-id", WEB.encode())], end=True))
            >> Up(0, Headers(1, ok), Headers(1, [(b"grpc-status", b"0")], end=True))
            << H2SendDown(Headers(1, ok), Headers(1, [(b"grpc-status", b"0")], end=True)))
    text = registry.render()
    assert f"inbound_http_requests_total{{{LABELS}}} 1" in text
    assert f'inbound_http_statuses_total{{{LABELS},status="200"}} 1' in text
    assert "inbound_grpc_requests_total{" not in text


def test_a_route_unused_for_the_retention_period_leaves_the_families() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    served = serve(registry)
    head = b"GET /api/results HTTP/1.1\r\nHost: voting\r\n\r\n"
    sent = head.replace(b"\r\n\r\n", f"\r\nl5d-client-id: {WEB}\r\n\r\n".encode())
    response = b"HTTP/1.1 204 No Content\r\n\r\n"

    def exchange(book: Playbook, up: int) -> Playbook:
        return book >> DownData(head) << Checkout(APP, pooled=True) << SendUp(up, sent) >> UpData(up, response) \
            << SendDown(response) << Checkin(up, reuse=True)

    book = (Playbook(served.router, served.settings) >> DownData(head) << Checkout(APP) >> Connected()
            << SendUp(0, sent) >> UpData(0, response) << SendDown(response) << Checkin(0, reuse=True))
    book = exchange(book >> Run(lambda: registry.render()) >> Run(lambda: setattr(clock, "now", 650.0)), 0)
    assert book
    text = registry.render()  # used at 650 (after the scrape at 100): kept, with both requests
    assert f"inbound_http_requests_total{{{LABELS}}} 2" in text
    clock.now = 1300.0
    assert f"inbound_http_requests_total{{{LABELS}}}" not in registry.render()


def test_a_protocol_switch_ends_the_durations_at_its_101_not_with_the_tunnel() -> None:
    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    served = serve(registry)
    ask = b"GET /api/ws HTTP/1.1\r\nHost: voting\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
    sent = (b"GET /api/ws HTTP/1.1\r\nHost: voting\r\nUpgrade: websocket\r\nconnection: upgrade\r\n"
            + f"l5d-client-id: {WEB}\r\n\r\n".encode())
    assert (Playbook(served.router, served.settings)
            >> DownData(ask)
            << Checkout(APP)
            >> Connected()
            << SendUp(0, sent)
            >> Run(lambda: setattr(clock, "now", 100.3))
            >> UpData(0, b"HTTP/1.1 101 Switching\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
            << SendDown(b"HTTP/1.1 101 Switching\r\nUpgrade: websocket\r\nconnection: upgrade\r\n\r\n")
            << Tunnel(0, b"", b""))
    clock.now = 5000.0  # the tunnel goes on; the exchange was timed to its 101
    text = registry.render()
    assert f'inbound_http_statuses_total{{{LABELS},status="101"}} 1' in text
    request = "inbound_http_request_duration_seconds"
    assert bucket(text, request, LABELS, "0.25") == 0 and bucket(text, request, LABELS, "0.5") == 1
    assert f"{request}_count{{{LABELS}}} 1" in text


def test_the_apps_router_answers_picks_of_five_fields_which_the_counted_pick_keeps() -> None:
    """``routed`` makes each request's Pick from the app router's connect, header, labels, authority and
    unreachable alone: a field that router set besides those would be lost, so it must set none."""
    from tether.proxy.core.http import Pick
    from tether.proxy.core.routes import inbound_router

    for permit in (None, lambda: 'srv_name="s"'):
        steps = inbound_router(APP, 1.0, 'direction="inbound"', permit)(RequestHead(b"GET", b"/", ()))
        try:
            steps.send(None)
            raise AssertionError("the app's router waited")
        except StopIteration as done:
            picked = done.value
        assert picked == Pick(picked.connect, picked.header, picked.labels, picked.authority,
                              unreachable=picked.unreachable)


def test_a_request_the_proxy_answers_before_the_app_counts_with_no_status() -> None:
    """The app port in fail-fast or its queue full (core.inbound_queue): the router answers an error, which
    linkerd2-proxy's route metrics, above that queue, count under the route with ``status=""``."""
    from dataclasses import dataclass

    from tether.proxy.core import errors
    from tether.proxy.core.inbound_route_metrics import routed

    @dataclass
    class Authorized:
        route: str = LABELS
        grpc: bool = False

    def failing(request: RequestHead):  # type: ignore[no-untyped-def]
        return errors.failfast("10.0.0.1:8080")
        yield  # a generator, like every router

    clock = FakeClock()
    registry = Registry(retain_idle=600.0, clock=clock)
    route = routed(failing, authorized=Authorized(), profiles=None, metrics=InboundRouteMetrics(registry))
    try:
        route(RequestHead(b"GET", b"/", ())).send(None)
        raise AssertionError("the router waited")
    except StopIteration as done:
        assert done.value.kind is errors.ErrorKind.FAILFAST
    text = registry.render()
    assert f"inbound_http_requests_total{{{LABELS}}} 1" in text
    assert f'inbound_http_statuses_total{{{LABELS},status=""}} 1' in text
    assert f"inbound_http_request_duration_seconds_count{{{LABELS}}} 1" in text
