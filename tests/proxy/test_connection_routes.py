"""Connections under TCPRoutes and TLSRoutes in the proxy, without sockets: the policy controller's own
OutboundPolicy messages (its index and encoder, fed Linkerd-shaped resources) translated by the proxy, then
the outbound connection layer driven command by command (``layer_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "policy" / "outbound"))
from layer_helpers import drive, kinds, replies  # noqa: E402
from outbound_helpers import backend, egress_network, stream_route  # noqa: E402
from proxy_tls_helpers import real_client_hello  # noqa: E402
from test_client_policy import (  # noqa: E402
    API, API_V2, ORIG, Balancers, PolicyWatch, balancer_lines, controller, draws, served)

from tether.proxy.codec import detect  # noqa: E402
from tether.proxy.codec.addrs import SocketAddr, parse_ip  # noqa: E402
from tether.proxy.codec.client_hello import ClientHello  # noqa: E402
from tether.proxy.core import commands as cmd  # noqa: E402
from tether.proxy.core.client_policy import ClientPolicy, OpaqueRoute, PolicyRef, select_tls_route  # noqa: E402
from tether.proxy.core.client_policy_translation import translate  # noqa: E402
from tether.proxy.core.metrics import Registry  # noqa: E402
from tether.proxy.core.outbound import OutboundSettings, outbound  # noqa: E402
from tether.proxy.core.policy_metrics import PolicyMetrics  # noqa: E402
from tether.proxy.core.policy_translation import InvalidPolicy  # noqa: E402
from tether.proxy.core.server_policy import HostMatch, Protocol  # noqa: E402

API_ENDPOINT = SocketAddr(parse_ip("10.1.0.2"), 8080)
API_V2_ENDPOINT = SocketAddr(parse_ip("10.1.0.3"), 8080)


class Proxy:
    """The outbound layer of one proxy whose client policy for ``ORIG`` is ``policy``, with its metrics."""

    def __init__(self, policy: ClientPolicy, balancers: Balancers, draw: Any = lambda: 0.5) -> None:
        self.registry = Registry(retain_idle=600.0, clock=lambda: 0.0)
        self.balancers = balancers
        self.settings = OutboundSettings(
            detect_timeout=10.0, connect_timeout=1.0, failfast=3.0, profile_networks=(), local_ips=frozenset(),
            own_addrs=frozenset(), refuse_loopback=True,
            client_policies=lambda addr: PolicyWatch(policy),  # type: ignore[arg-type,return-value]
            policy_metrics=PolicyMetrics(self.registry), draw=draw)

    def connect(self, **table: Any) -> list[cmd.Command]:
        """One connection to ``ORIG``; balancer waits answered by the balancer waited on."""
        answers = {cmd.Wait: lambda c: c.source.balancer.pick(), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}
        answers.update({getattr(cmd, k, None) or getattr(detect, k): v for k, v in table.items()})
        return drive(outbound(ORIG, self.settings, None), replies(answers))

    def lines(self, name: str) -> list[str]:
        return [line for line in self.registry.render().splitlines() if line.startswith(name + "{")]


def connected_to(seen: list[cmd.Command]) -> SocketAddr:
    assert kinds(seen)[-1] == "Forward", seen
    return next(c for c in seen if isinstance(c, cmd.Connect)).addr


def proxy_for(*objs: dict[str, Any], draw: Any = lambda: 0.5) -> Proxy:
    balancers = Balancers()
    return Proxy(translate(served(controller(*objs)), balancers), balancers, draw)


# -- TCPRoute ------------------------------------------------------------------------------------------------


def test_a_tcp_route_sends_each_connection_to_a_backend_drawn_by_weight() -> None:
    split = stream_route("TCPRoute", "split", "web", [backend("api", weight=1), backend("api-v2", weight=1)])
    proxy = proxy_for(split, draw=draws(0.1, 0.9))
    assert proxy.settings.client_policies is not None
    assert connected_to(proxy.connect()) == API_ENDPOINT  # no Detect: the policy is opaque
    assert connected_to(proxy.connect()) == API_V2_ENDPOINT
    # All to one side, then switched: weight 0 takes nothing.
    for weights, expected in (((0, 1), API_V2_ENDPOINT), ((1, 0), API_ENDPOINT)):
        route = stream_route("TCPRoute", "split", "web", [backend("api", weight=weights[0]),
                                                          backend("api-v2", weight=weights[1])])
        one_sided = proxy_for(route, draw=draws(*[i / 10 for i in range(10)]))
        assert {connected_to(one_sided.connect()) for _ in range(10)} == {expected}
    [opened] = proxy.lines("outbound_tcp_route_open_total")
    assert 'route_kind="TCPRoute",route_namespace="emojivoto",route_name="split"' in opened
    assert opened.endswith(" 2")
    [closed] = proxy.lines("outbound_tcp_route_close_total")
    assert 'error=""' in closed and closed.endswith(" 2")


def test_tcp_and_tls_route_backends_are_counted_in_their_own_balancer_families() -> None:
    for kind, family in (("TCPRoute", "tcp"), ("TLSRoute", "tls")):
        policy = translate(served(controller(stream_route(kind, "split", "web", [backend("api")]))), Balancers())
        lines = [line for line in balancer_lines(policy) if not line.startswith("#")]
        ours = [line for line in lines if 'backend_name="api"' in line]
        assert f'outbound_{family}_balancer_endpoints{{' in "".join(ours), lines
        assert all(line.startswith(f"outbound_{family}_balancer_") for line in ours), ours
        assert any(line.startswith(f"outbound_{family}_balancer_p2c_updates_total{{") and 'op="Reset"' in line
                   for line in ours), ours


def test_a_tcp_route_backend_that_does_not_exist_refuses_its_connections() -> None:
    proxy = proxy_for(stream_route("TCPRoute", "ghostly", "web", [backend("ghost")]))
    seen = proxy.connect()
    assert seen[-1] == cmd.Refuse("invalid backend") and "Connect" not in kinds(seen)
    [closed] = proxy.lines("outbound_tcp_route_close_total")
    assert 'error="invalid_backend"' in closed


def test_a_tcp_route_without_backends_goes_to_the_parent_service() -> None:
    proxy = proxy_for(stream_route("TCPRoute", "plain", "web", []))
    assert connected_to(proxy.connect()) == SocketAddr(parse_ip("10.1.0.1"), 8080)


def test_a_failed_connect_closes_with_unexpected() -> None:
    proxy = proxy_for(stream_route("TCPRoute", "split", "web", [backend("api")]))
    seen = proxy.connect(Connect=cmd.Failed("connection refused"))
    assert isinstance(seen[-1], cmd.Refuse)
    [closed] = proxy.lines("outbound_tcp_route_close_total")
    assert 'error="unexpected"' in closed


# -- TLSRoute ------------------------------------------------------------------------------------------------


def tls_routes() -> tuple[dict[str, Any], ...]:
    return (stream_route("TLSRoute", "exact", "web", [backend("api")], hostnames=["api.example.com"]),
            stream_route("TLSRoute", "wildcard", "web", [backend("api-v2")], hostnames=["*.example.com"]))


def hello(name: str | None) -> detect.Tls:
    return detect.Tls(ClientHello(server_name=name, alpn_protocols=()))


def test_tls_connections_go_where_their_sni_names() -> None:
    proxy = proxy_for(*tls_routes())
    seen = proxy.connect(Detect=hello("api.example.com"))
    detected = next(c for c in seen if isinstance(c, cmd.Detect))
    assert detected.tls and detected.timeout == 10.0  # read without terminating, within the detect timeout
    assert connected_to(seen) == API_ENDPOINT
    assert connected_to(proxy.connect(Detect=hello("www.example.com"))) == API_V2_ENDPOINT
    assert proxy.connect(Detect=hello("example.org"))[-1] == cmd.Refuse("no route")
    assert proxy.connect(Detect=hello(None))[-1] == cmd.Refuse("Could not find SNI")
    assert proxy.connect(Detect=detect.Opaque())[-1] == cmd.Refuse("Could not find SNI")  # plaintext
    assert proxy.connect(Detect=detect.TlsTimeout())[-1] == cmd.Refuse("SNI detection timed out")
    opened = proxy.lines("outbound_tls_route_open_total")
    assert any('route_kind="TLSRoute",route_namespace="emojivoto",route_name="exact",hostname=""' in line
               and line.endswith(" 1") for line in opened), opened
    assert any('route_name="wildcard"' in line for line in opened)
    assert len(opened) == 2  # refused before a route: not counted under one
    [protocol] = proxy.lines("outbound_tcp_protocol_connections_total")
    assert protocol.startswith('outbound_tcp_protocol_connections_total{protocol="tls"')


def test_a_real_client_hello_is_routed_by_its_sni() -> None:
    detector = detect.Detector(tls=True)
    verdict = detector.receive_data(real_client_hello("www.Example.com", ["h2"]))
    assert isinstance(verdict, detect.Tls)
    proxy = proxy_for(*tls_routes())
    assert connected_to(proxy.connect(Detect=verdict)) == API_V2_ENDPOINT


def test_sni_route_selection_as_linkerd() -> None:
    def route(name: str, *snis: HostMatch) -> OpaqueRoute:
        return OpaqueRoute(PolicyRef("gateway.networking.k8s.io", "TLSRoute", "ns", name), snis=snis)

    anything = route("any")
    short = route("short", HostMatch(suffix=("com",)))
    long = route("long", HostMatch(suffix=("example", "com")))
    exact = route("exact", HostMatch(exact="a.example.com"))
    routes = (anything, short, long, exact)
    assert select_tls_route(routes, "a.example.com") is exact
    assert select_tls_route(routes, "a.example.com.") is exact  # a trailing dot is the same name
    assert select_tls_route(routes, "b.example.com") is long
    assert select_tls_route(routes, "b.other.com") is short
    assert select_tls_route(routes, "example.org") is anything
    assert select_tls_route(routes[1:], "example.org") is None
    assert select_tls_route((short, route("short-2", HostMatch(suffix=("com",)))), "x.com") is short  # first wins
    assert select_tls_route(routes, "com") is anything  # a suffix takes subdomains only


def test_a_tls_route_on_a_denied_egress_network_and_the_default_deny_route() -> None:
    own = {"name": "ext", "kind": "EgressNetwork", "group": "policy.linkerd.io"}
    objs = (egress_network("ext", "Deny", [{"cidr": "1.2.3.0/24"}]),
            stream_route("TLSRoute", "api", "ext", [own], ns="linkerd-egress", port=443, parent_kind="EgressNetwork",
                         hostnames=["api.example.com"]))
    balancers = Balancers()
    policy = translate(served(controller(*objs), "1.2.3.4", 443), balancers)
    assert policy.protocol is Protocol.TLS
    assert [r.meta.name for r in policy.tls] == ["api", "tls-egress-deny"] and policy.tls[1].forbidden
    proxy = Proxy(policy, balancers)
    target = SocketAddr(parse_ip("1.2.3.4"), 443)

    def connect(name: str) -> list[cmd.Command]:
        answers = replies({cmd.Detect: hello(name), cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None})
        return drive(outbound(target, proxy.settings, None), answers)

    assert connected_to(connect("api.example.com")) == target  # the route forwards to the original destination
    assert connect("other.example.com")[-1] == cmd.Refuse("forbidden")
    closed = proxy.lines("outbound_tls_route_close_total")
    assert any('route_name="tls-egress-deny"' in line and 'error="forbidden"' in line for line in closed), closed


@pytest.mark.parametrize("mutate, field", [
    (lambda m: m.protocol.tls.routes[0].snis.add(), "protocol.tls.routes[0].snis[1]"),
    (lambda m: m.protocol.tls.routes[0].ClearField("rules"), "protocol.tls.routes[0].rules"),
])
def test_a_tls_policy_the_proxy_cannot_use_names_the_field(mutate: Any, field: str) -> None:
    message = served(controller(*tls_routes()))
    assert message.protocol.WhichOneof("kind") == "tls"
    mutate(message)
    with pytest.raises(InvalidPolicy, match=field.replace("[", r"\[").replace("]", r"\]")):
        translate(message, Balancers())


def test_the_tls_policy_translates_routes_snis_and_backends() -> None:
    balancers = Balancers()
    policy = translate(served(controller(*tls_routes())), balancers)
    assert policy.protocol is Protocol.TLS and not policy.opaque
    exact, wildcard = policy.tls
    assert exact.snis == (HostMatch(exact="api.example.com"),)
    assert wildcard.snis == (HostMatch(suffix=("example", "com")),)
    assert [b.authority for b in policy.backends()] == [API, API_V2]
    assert exact.backends[0].balancer is balancers.by_path[API]
