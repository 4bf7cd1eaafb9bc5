"""The inbound layer's decisions, driven without sockets: direct stack, TLS detection, policy, forwarding."""

from __future__ import annotations

import ipaddress

import pytest
from layer_helpers import drive, kinds, replies

from tether.ports import PortSet
from tether.proxy.core import commands as cmd
from tether.proxy.codec.addrs import SocketAddr, parse_socket_addr
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.inbound import InboundSettings, inbound
from tether.proxy.core.authz import authorize
from tether.proxy.core.server_policy import default_policy
from tether.proxy.codec import detect
from tether.proxy.codec.client_hello import ClientHello
from tether.proxy.codec.transport_header import HeaderReceived, NoHeader, SessionProtocol, TransportHeader

ME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
CLIENT_ID = "client.emojivoto.serviceaccount.identity.linkerd.cluster.local"
POD_IP = "10.1.0.5"
DIRECT = parse_socket_addr(f"{POD_IP}:4143")
APP = parse_socket_addr(f"{POD_IP}:8080")
CLIENT = parse_socket_addr("10.1.0.9:51234")
TRANSPORT = "transport.l5d.io/v1"
FOR_ME = detect.Tls(ClientHello(ME, ()))


def settings(**overrides: object) -> InboundSettings:
    base = dict(local_name=ME, inbound_port=4143, detect_timeout=10.0, connect_timeout=0.3,
                opaque_ports=PortSet.parse("25,3306"), ips=frozenset({ipaddress.ip_address(POD_IP)}),
                default_policy=DefaultPolicy.ALL_UNAUTHENTICATED, cluster_networks=())
    base.update(overrides)
    return InboundSettings(**base)  # type: ignore[arg-type]


def header(port: int = 8080, **kwargs: object) -> HeaderReceived:
    return HeaderReceived(TransportHeader(port=port, **kwargs), b"")  # type: ignore[arg-type]


def forwarded(seen: list[cmd.Command]) -> cmd.Connect:
    assert kinds(seen)[-2:] == ["Connect", "Forward"], kinds(seen)
    connect = seen[-2]
    assert isinstance(connect, cmd.Connect) and connect.tls is None
    return connect


def labels_set(seen: list[cmd.Command]) -> str:
    return next(c.labels for c in seen if isinstance(c, cmd.SetLabels))


OK = {cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}


def test_direct_connection_with_a_transport_header_goes_to_the_named_port() -> None:
    seen = drive(inbound(DIRECT, CLIENT, settings()),
                 replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT),
                          cmd.ReadHeader: header(8080, protocol=SessionProtocol.HTTP2), **OK}))
    assert kinds(seen) == ["Detect", "AcceptTls", "ReadHeader", "Count", "Count", "SetLabels", "Connect", "Forward"]
    assert seen[1] == cmd.AcceptTls(alpn=True, timeout=10.0)
    assert seen[3] == cmd.Count("inbound_tcp_transport_header_connections_total",
                                f'session_protocol="http2",target_port="8080",target_name="",client_id="{CLIENT_ID}"')
    assert forwarded(seen).addr == APP  # the pod's own IP, the header's port
    assert f'tls="true",client_id="{CLIENT_ID}"' in labels_set(seen)


@pytest.mark.parametrize(("answers", "error"), [
    ({cmd.Detect: detect.Tls(ClientHello("someone.else", ()))}, "direct connections must be mutually authenticated"),
    ({cmd.Detect: detect.Opaque()}, "direct connections must be mutually authenticated"),
    ({cmd.Detect: detect.TlsTimeout()}, "tls detection timeout"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.Failed("untrusted client certificate")}, "untrusted client certificate"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(None, TRANSPORT)},
     "direct connections must be mutually authenticated"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, None)},
     "direct connections require transport header negotiation"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT), cmd.ReadHeader: NoHeader()},
     "connection did not include a transport header"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT),
      cmd.ReadHeader: cmd.Failed("invalid transport header")}, "invalid transport header"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT),
      cmd.ReadHeader: header(8080, name="web.example.com")}, "gateway connections are not supported"),
    ({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT), cmd.ReadHeader: header(4143)},
     "loop"),
])
def test_direct_connections_refused(answers: dict[type, object], error: str) -> None:
    seen = drive(inbound(DIRECT, CLIENT, settings()), replies(answers))
    refuse = seen[-1]
    assert isinstance(refuse, cmd.Refuse) and refuse.error == error
    assert refuse.labels is not None and 'direction="inbound",peer="src"' in refuse.labels
    assert "Connect" not in kinds(seen)


def test_mesh_tls_on_an_application_port_is_terminated_then_sniffed() -> None:
    seen = drive(inbound(APP, CLIENT, settings()),
                 replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, None),
                          cmd.Sniff: detect.Http1(), **OK}))
    assert kinds(seen) == ["Detect", "AcceptTls", "Sniff", "Count", "SetLabels", "Connect", "Forward"]
    assert seen[1] == cmd.AcceptTls(alpn=False, timeout=10.0)
    assert forwarded(seen).addr == APP
    assert f'tls="true",client_id="{CLIENT_ID}"' in labels_set(seen)


def test_other_tls_passes_through_and_plaintext_is_forwarded() -> None:
    seen = drive(inbound(APP, CLIENT, settings()),
                 replies({cmd.Detect: detect.Tls(ClientHello("api.example.com", ())), **OK}))
    assert "AcceptTls" not in kinds(seen)
    assert 'tls="opaque",sni="api.example.com"' in labels_set(seen)
    seen = drive(inbound(APP, CLIENT, settings()), replies({cmd.Detect: detect.Http1(), **OK}))
    assert 'tls="no_identity",no_tls_reason="no_tls_from_remote"' in labels_set(seen)
    assert forwarded(seen).addr == APP


def test_opaque_ports_skip_detection() -> None:
    target = parse_socket_addr(f"{POD_IP}:3306")
    seen = drive(inbound(target, CLIENT, settings()), replies(OK))
    assert kinds(seen) == ["Count", "SetLabels", "Connect", "Forward"]
    assert 'no_tls_reason="port_skipped"' in labels_set(seen)
    assert forwarded(seen).addr == target


def test_http_detection_is_counted_per_server_with_its_duration() -> None:
    from tether.proxy.core.metrics import Registry
    from tether.proxy.core.policy_metrics import DetectMetrics

    now = [100.0]
    registry = Registry(retain_idle=600.0, clock=lambda: now[0])
    s = settings(detect_metrics=DetectMetrics(registry, "inbound"))

    def sniffed(reply: detect.Verdict) -> detect.Verdict:
        now[0] += 0.05  # the detection took 50 ms
        return reply

    drive(inbound(APP, CLIENT, s), replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, None),
                                            cmd.Sniff: lambda c: sniffed(detect.Http1()), **OK}))
    drive(inbound(APP, CLIENT, s), replies({cmd.Detect: lambda c: sniffed(detect.Opaque()), **OK}))  # plaintext
    drive(inbound(parse_socket_addr(f"{POD_IP}:3306"), CLIENT, s), replies(OK))  # an opaque port: not detected
    drive(inbound(APP, CLIENT, s), replies({cmd.Detect: detect.Tls(ClientHello("api.example.com", ())), **OK}))
    text = registry.render()
    server = 'srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="8080"'
    results = {line.split('result="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
               if line.startswith("inbound_tcp_detect_http_results_total{") and server in line}
    assert results == {"http/1": "1", "not_http": "1", "http/2": "0", "read_timeout": "0", "error": "0"}, text
    assert 'srv_port="3306"' not in text
    assert f'inbound_tcp_detect_http_duration_seconds_bucket{{{server},le="0.1"}} 2' in text, text
    assert f'inbound_tcp_detect_http_duration_seconds_bucket{{{server},le="0.001"}} 0' in text, text


def test_refusals_before_forwarding() -> None:
    other_ip = parse_socket_addr("10.9.9.9:8080")
    seen = drive(inbound(other_ip, CLIENT, settings()), replies({}))
    assert seen[-1].error == "ip not allowed"  # type: ignore[attr-defined]
    for verdict, error in ((detect.TlsTimeout(), "tls detection timeout"), (detect.Closed(), "closed before detection")):
        seen = drive(inbound(APP, CLIENT, settings()), replies({cmd.Detect: verdict}))
        assert seen[-1].error == error  # type: ignore[attr-defined]
    seen = drive(inbound(APP, CLIENT, settings()), replies({cmd.Detect: detect.Opaque(),
                                                            cmd.Connect: cmd.Failed("i/o", "ECONNREFUSED")}))
    assert seen[-1] == cmd.Refuse("i/o")


def test_default_policies() -> None:
    seen = drive(inbound(APP, CLIENT, settings(default_policy=DefaultPolicy.DENY)),
                 replies({cmd.Detect: detect.Opaque()}))
    assert kinds(seen) == ["Detect", "Count", "Refuse"] and seen[-1].error == "unauthorized"  # type: ignore[attr-defined]
    assert seen[1].name == "inbound_tcp_authz_deny_total"  # type: ignore[attr-defined]
    authenticated = settings(default_policy=DefaultPolicy.ALL_AUTHENTICATED)
    seen = drive(inbound(APP, CLIENT, authenticated), replies({cmd.Detect: detect.Opaque()}))
    assert seen[-1].error == "unauthorized"  # type: ignore[attr-defined]
    seen = drive(inbound(APP, CLIENT, authenticated),
                 replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, None),
                          cmd.Sniff: detect.Opaque(), **OK}))
    assert kinds(seen)[-2:] == ["Connect", "Forward"]


def test_policy_table() -> None:
    ip = ipaddress.ip_address
    nets = (ipaddress.ip_network("10.0.0.0/8"),)
    cases = [
        (DefaultPolicy.ALL_UNAUTHENTICATED, "192.168.1.1", False, None, True),
        (DefaultPolicy.ALL_AUTHENTICATED, "192.168.1.1", True, None, False),
        (DefaultPolicy.ALL_AUTHENTICATED, "192.168.1.1", True, CLIENT_ID, True),
        (DefaultPolicy.CLUSTER_UNAUTHENTICATED, "10.2.3.4", False, None, True),
        (DefaultPolicy.CLUSTER_UNAUTHENTICATED, "192.168.1.1", False, None, False),
        (DefaultPolicy.CLUSTER_AUTHENTICATED, "10.2.3.4", True, CLIENT_ID, True),
        (DefaultPolicy.AUDIT, "192.168.1.1", False, None, True),
        (DefaultPolicy.DENY, "10.2.3.4", True, CLIENT_ID, False),
        (DefaultPolicy.ALL_AUTHENTICATED, "127.0.0.1", False, None, True),  # default:localhost
        (DefaultPolicy.ALL_AUTHENTICATED, "::ffff:127.0.0.1", False, None, True),
    ]
    for policy, client, mesh_tls, client_id, allowed in cases:
        server = default_policy(policy, nets, opaque=False)
        decision = authorize(server.authorizations, client_ip=ip(client), mesh_tls=mesh_tls, client_id=client_id)
        assert (decision is not None) is allowed, (policy, client, client_id)


def test_target_labels_of_the_direct_stack_name_the_app_port() -> None:
    seen = drive(inbound(DIRECT, CLIENT, settings()),
                 replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(CLIENT_ID, TRANSPORT),
                          cmd.ReadHeader: header(8080), **OK}))
    assert f'target_addr="{SocketAddr(APP.ip, 8080)}"' in labels_set(seen)
    assert 'srv_port="8080"' in labels_set(seen)


def test_the_controllers_policy_decides_opaque_connections_once_and_leaves_http_to_each_request() -> None:
    from tether.proxy.core.authz import Authn, Authorization, Meta, Network
    from tether.proxy.codec.http1 import RequestHead
    from tether.proxy.core.http import HttpSettings
    from tether.proxy.core.http_commands import ServeHttp1
    from tether.proxy.core.server_policy import Protocol, ServerPolicy

    web_only = Authorization(Meta("policy.linkerd.io", "authorizationpolicy", "web-only"),
                             (Network(ipaddress.ip_network("0.0.0.0/0")),), Authn.IDENTITIES, frozenset({ME}))
    opaque = ServerPolicy(Meta("policy.linkerd.io", "server", "db"), Protocol.OPAQUE, (web_only,))
    lookups: list[int] = []

    def policies(port: int) -> ServerPolicy:
        lookups.append(port)
        return opaque

    # An opaque Server: a plaintext client is denied before a byte moves, under the Server's name.
    seen = drive(inbound(APP, CLIENT, settings(policies=policies)), replies({cmd.Detect: detect.Http1()}))
    assert kinds(seen)[-2:] == ["Count", "Refuse"] and seen[-1].error == "unauthorized"  # type: ignore[attr-defined]
    assert seen[-2].name == "inbound_tcp_authz_deny_total"  # type: ignore[attr-defined]
    assert 'srv_kind="server",srv_name="db",srv_port="8080"' in seen[-2].labels  # type: ignore[attr-defined]
    assert 8080 in lookups
    # The identity it names gets through, counted under the authorization's name.
    seen = drive(inbound(APP, CLIENT, settings(policies=policies)),
                 replies({cmd.Detect: FOR_ME, cmd.AcceptTls: cmd.TlsAccepted(ME, None), cmd.Sniff: detect.Http1(),
                          **OK}))
    assert kinds(seen)[-2:] == ["Connect", "Forward"]
    allow = next(c for c in seen if isinstance(c, cmd.Count))
    assert allow.name == "inbound_tcp_authz_allow_total" and 'authz_name="web-only"' in allow.labels
    # HTTP under a detect policy is not refused at the connection, whoever the client: each request is checked.
    detect_policy = ServerPolicy(Meta("policy.linkerd.io", "server", "web"), Protocol.DETECT, ())
    http = HttpSettings("inbound", lambda: 0.0)
    seen = drive(inbound(APP, CLIENT, settings(policies=lambda port: detect_policy, http=http)),
                 replies({cmd.Detect: detect.Http1(), ServeHttp1: None}))
    assert "Refuse" not in kinds(seen) and "Count" not in kinds(seen)
    serve = seen[-1]
    assert isinstance(serve, ServeHttp1) and serve.settings.policy is not None
    denied = serve.settings.policy.check(RequestHead(b"GET", b"/", ((b"host", b"web"),)))
    assert denied is not None and denied.status == 404  # a detect Server without routes here: no route
