"""Linkerd 2.20's inbound route families (proxy.md §9.5) of a request an inbound HTTPRoute authorized:
``inbound_{http,grpc}_requests_total``, ``..._statuses_total`` and ``..._{request,response}_frame_size_bytes``
under the Server (``parent_*``) and the route (``route_*``), no namespace.

Socket-free: the inbound layer (``core.inbound``) hands its router and settings to the HTTP/1 core, driven by a
playbook; the policy is a real policy controller message translated as the proxy does.
"""

from __future__ import annotations

from layer_helpers import drive, replies
from playbook import Checkin, Checkout, Connected, DownData, Playbook, SendDown, SendUp, UpData
from test_inbound_authz import WEB, identities_authz, server_message
from test_inbound_layer import APP, CLIENT, FOR_ME, settings

from tether.proxy.codec import detect
from tether.proxy.core import commands as cmd
from tether.proxy.core.http import HttpSettings
from tether.proxy.core.http_commands import ServeHttp1
from tether.proxy.core.inbound import inbound
from tether.proxy.core.inbound_route_metrics import InboundRouteMetrics
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate

LABELS = ('parent_group="policy.linkerd.io",parent_kind="server",parent_name="voting-grpc",parent_port="8080",'
          'route_group="policy.linkerd.io",route_kind="HTTPRoute",route_name="voting-api"')


def serve(registry: Registry) -> ServeHttp1:
    policy = translate(server_message(route_authz=[identities_authz("web-only", WEB)]))
    layer = settings(policies=lambda port: policy, http=HttpSettings("inbound", lambda: 0.0), registry=registry,
                     route_metrics=InboundRouteMetrics(registry))
    served = drive(inbound(APP, CLIENT, layer), replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(WEB, None),
                                                         cmd.Sniff: detect.Http1(), ServeHttp1: None}))[-1]
    assert isinstance(served, ServeHttp1)
    return served


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


def test_a_grpc_call_is_counted_in_the_grpc_families_with_its_numeric_grpc_status() -> None:
    from h2_fakes import FakeClock
    from h2_playbook import Connect, Connected, Data, Down, H2Playbook, Headers, SendDown, SendUp, Up

    from tether.proxy.core.http_commands import ServeHttp2

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    policy = translate(server_message(route_authz=[identities_authz("web-only", WEB)]))
    layer = settings(policies=lambda port: policy, http=HttpSettings("inbound", FakeClock()), registry=registry,
                     route_metrics=InboundRouteMetrics(registry))
    served = drive(inbound(APP, CLIENT, layer), replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(WEB, None),
                                                         cmd.Sniff: detect.Http2(), ServeHttp2: None}))[-1]
    assert isinstance(served, ServeHttp2)
    call = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"voting:8080"),
            (b":path", b"/api/vote"), (b"content-type", b"application/grpc")]
    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert (H2Playbook(served.router, served.settings)
            >> Down(Headers(1, call))
            << Connect(APP)
            >> Down(Data(1, b"m" * 200, end=True))
            >> Connected()
            << SendUp(0, Headers(1, [*call, (b"l5d-client-id", WEB.encode())]), Data(1, b"m" * 200, end=True))
            >> Up(0, Headers(1, ok), Data(1, b"r" * 10), Headers(1, [(b"grpc-status", b"5")], end=True))
            << SendDown(Headers(1, ok), Data(1, b"r" * 10), Headers(1, [(b"grpc-status", b"5")], end=True)))
    text = registry.render()
    assert f"inbound_grpc_requests_total{{{LABELS}}} 1" in text
    assert f'inbound_grpc_statuses_total{{{LABELS},status="5"}} 1' in text
    assert f'inbound_grpc_request_frame_size_bytes_bucket{{{LABELS},le="128.0"}} 0' in text
    assert f"inbound_grpc_request_frame_size_bytes_sum{{{LABELS}}} 200" in text
    assert f'inbound_grpc_response_frame_size_bytes_bucket{{{LABELS},le="128.0"}} 1' in text
    assert "inbound_http_requests_total{" not in text
