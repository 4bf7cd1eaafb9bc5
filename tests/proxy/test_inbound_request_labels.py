"""Inbound request metrics carry the labels of the policy decision that let each request through (proxy.md §9.2):
``srv_*``, ``route_*`` and ``authz_*`` of the request's route and authorization, not the connection's.

Socket-free: the policy check (``core.inbound_authz``) and the inbound router (``core.routes``) are pure.
"""

from __future__ import annotations

import ipaddress

from test_inbound_authz import VOTE, WEB, identities_authz, request, server_message

from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core.http import Pick
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.policy_translation import translate
from tether.proxy.core.routes import inbound_router


def routed(router: object, path: bytes) -> Pick:
    gen = router(request(path))  # type: ignore[operator]
    try:
        next(gen)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the inbound router does not wait")


def test_each_request_is_labelled_with_its_route_and_authorization() -> None:
    message = server_message(route_authz=[identities_authz("vote-api", VOTE)],
                             server_authz=[identities_authz("web-anywhere", WEB)])
    extra = message.protocol.detect.http_routes.add()
    extra.metadata.resource.group, extra.metadata.resource.kind = "policy.linkerd.io", "HTTPRoute"
    extra.metadata.resource.name = "other"
    extra.rules.add().matches.add().path.prefix = "/other"
    policy = translate(message)
    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.0.0.7"), mesh_tls=True, client_id=WEB,
                            target_labels='target_port="8080"', tls_labels="tls=\"true\"", registry=None)
    check = InboundRequestPolicy(lambda: policy, facts, clock=lambda: 0.0)
    router = inbound_router(parse_socket_addr("10.1.0.5:8080"), 0.3, 'direction="inbound"', lambda: check.permit)

    assert check.check(request(b"/api/vote")) is None
    first = routed(router, b"/api/vote")
    assert first.labels == ('direction="inbound",srv_group="policy.linkerd.io",srv_kind="server",'
                            'srv_name="voting-grpc",srv_port="8080",route_group="policy.linkerd.io",'
                            'route_kind="HTTPRoute",route_name="voting-api",authz_group="policy.linkerd.io",'
                            'authz_kind="AuthorizationPolicy",authz_name="web-anywhere"')
    assert check.check(request(b"/other")) is None
    second = routed(router, b"/other")
    assert 'route_name="other"' in second.labels and second is not first
    assert check.check(request(b"/api/vote")) is None
    assert routed(router, b"/api/vote") is first  # one pick per label set, kept for the connection


def test_an_inbound_connections_settings_label_errors_with_target_and_server_and_informational_by_client() -> None:
    from layer_helpers import drive, replies
    from test_inbound_layer import APP, CLIENT, FOR_ME, settings

    from tether.proxy.codec import detect
    from tether.proxy.core import commands as cmd
    from tether.proxy.core import errors, exchange
    from tether.proxy.core.http import HttpSettings
    from tether.proxy.core.http_commands import ServeHttp1
    from tether.proxy.core.inbound import inbound

    policy = translate(server_message(route_authz=[identities_authz("web-only", WEB)]))
    layer = settings(policies=lambda port: policy, http=HttpSettings("inbound", lambda: 0.0))
    plain = drive(inbound(APP, CLIENT, layer), replies({cmd.Detect: detect.Http1(), ServeHttp1: None}))[-1]
    meshed = drive(inbound(APP, CLIENT, layer), replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(WEB, None),
                                                         cmd.Sniff: detect.Http1(), ServeHttp1: None}))[-1]
    assert isinstance(plain, ServeHttp1) and isinstance(meshed, ServeHttp1)
    assert not plain.settings.informational and meshed.settings.informational
    assert exchange.error_labels(plain.settings, errors.load_shed().metric) == (
        'error="loadshed",target_addr="10.1.0.5:8080",target_ip="10.1.0.5",target_port="8080",'
        'srv_group="policy.linkerd.io",srv_kind="server",srv_name="voting-grpc",srv_port="8080"')
