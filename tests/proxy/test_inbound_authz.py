"""Inbound authorization (proxy.md §8.3): the decision table, route selection, the controller's message, per request.

Socket-free: ``core.authz``, ``core.server_policy``, ``core.policy_translation``
and ``core.inbound_authz`` are pure. The ``Server`` messages are the generated
protobuf classes, built as the policy controller's translator builds them.
"""

from __future__ import annotations

import ipaddress

import pytest

from tether.api import inbound_pb2 as pb
from tether.api import meta_pb2
from tether.api.addresses import to_ip_address
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.authz import LOCALHOST, Authn, Authorization, Meta, Network, authorize
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.errors import ErrorKind
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import InvalidPolicy, translate
from tether.proxy.core.server_policy import INVALID, Protocol, default_policy

ip = ipaddress.ip_address
net = ipaddress.ip_network
WEB = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
VOTE = "voting.emojivoto.serviceaccount.identity.linkerd.cluster.local"


def authz(authn: Authn, *, networks: tuple[Network, ...] = (Network(net("0.0.0.0/0")),),
          identities: frozenset[str] = frozenset(), suffixes: tuple[tuple[str, ...], ...] = ()) -> Authorization:
    return Authorization(Meta("policy.linkerd.io", "authorizationpolicy", "a"), networks, authn, identities, suffixes)


@pytest.mark.parametrize(("rule", "client", "mesh_tls", "client_id", "allowed"), [
    (authz(Authn.UNAUTHENTICATED), "192.0.2.1", False, None, True),
    # networks minus exceptions
    (authz(Authn.UNAUTHENTICATED, networks=(Network(net("10.0.0.0/8"), (net("10.1.0.0/16"),)),)),
     "10.2.0.1", False, None, True),
    (authz(Authn.UNAUTHENTICATED, networks=(Network(net("10.0.0.0/8"), (net("10.1.0.0/16"),)),)),
     "10.1.0.1", False, None, False),
    (authz(Authn.UNAUTHENTICATED, networks=(Network(net("10.0.0.0/8")),)), "::ffff:10.0.0.9", False, None, True),
    # mesh TLS, identity or not
    (authz(Authn.MESH_TLS), "192.0.2.1", True, None, True),
    (authz(Authn.MESH_TLS), "192.0.2.1", False, None, False),
    # identities, suffixes
    (authz(Authn.IDENTITIES, identities=frozenset({WEB})), "192.0.2.1", True, WEB, True),
    (authz(Authn.IDENTITIES, identities=frozenset({WEB})), "192.0.2.1", True, VOTE, False),
    (authz(Authn.IDENTITIES, identities=frozenset({WEB})), "192.0.2.1", False, WEB, False),
    (authz(Authn.IDENTITIES, identities=frozenset({WEB})), "192.0.2.1", True, None, False),
    (authz(Authn.IDENTITIES, suffixes=(("emojivoto", "serviceaccount", "identity", "linkerd", "cluster", "local"),)),
     "192.0.2.1", True, VOTE, True),
    (authz(Authn.IDENTITIES, suffixes=(("other", "serviceaccount", "identity", "linkerd", "cluster", "local"),)),
     "192.0.2.1", True, VOTE, False),
    (authz(Authn.IDENTITIES, suffixes=((),)), "192.0.2.1", True, VOTE, True),
    # SPIFFE identities match exactly, never by suffix
    (authz(Authn.IDENTITIES, suffixes=((),)), "192.0.2.1", True, "spiffe://example.org/web", False),
    (authz(Authn.IDENTITIES, identities=frozenset({"spiffe://example.org/web"})), "192.0.2.1", True,
     "spiffe://example.org/web", True),
    # the implicit default:localhost
    (LOCALHOST, "127.0.0.1", False, None, True),
    (LOCALHOST, "::1", False, None, True),
    (LOCALHOST, "10.0.0.1", False, None, False),
])
def test_authorization_table(rule: Authorization, client: str, mesh_tls: bool, client_id: str | None,
                             allowed: bool) -> None:
    assert (authorize([rule], client_ip=ip(client), mesh_tls=mesh_tls, client_id=client_id) is rule) is allowed


def test_default_policies_carry_localhost_except_deny() -> None:
    nets = (net("10.0.0.0/8"),)
    authenticated = default_policy(DefaultPolicy.ALL_AUTHENTICATED, nets, opaque=False)
    assert authorize(authenticated.authorizations, client_ip=ip("127.0.0.1"), mesh_tls=False,
                     client_id=None) == LOCALHOST
    deny = default_policy(DefaultPolicy.DENY, nets, opaque=False)
    assert deny.protocol is Protocol.OPAQUE and deny.authorizations == ()
    assert default_policy(DefaultPolicy.ALL_UNAUTHENTICATED, nets, opaque=True).protocol is Protocol.OPAQUE


# -- the controller's message -------------------------------------------------------------------------------

def _net(cidr: str) -> pb.Network:
    n = net(cidr)
    out = pb.Network()
    out.net.ip.CopyFrom(to_ip_address(str(n.network_address)))
    out.net.prefix_len = n.prefixlen
    return out


def identities_authz(name: str, *identities: str) -> pb.Authz:
    out = pb.Authz(metadata=meta_pb2.Metadata(resource=meta_pb2.Resource(
        group="policy.linkerd.io", kind="AuthorizationPolicy", name=name)))
    out.networks.extend([_net("0.0.0.0/0"), _net("::/0")])
    out.authentication.meshTLS.identities.identities.extend(pb.Identity(name=i) for i in identities)
    return out


def server_message(*, route_authz: list[pb.Authz], server_authz: list[pb.Authz] = [],  # noqa: B006 - not mutated
                   path_prefix: str = "/api") -> pb.Server:
    message = pb.Server(labels={"group": "policy.linkerd.io", "kind": "server", "name": "voting-grpc"})
    route = message.protocol.detect.http_routes.add()
    route.metadata.resource.group, route.metadata.resource.kind = "policy.linkerd.io", "HTTPRoute"
    route.metadata.resource.name = "voting-api"
    rule = route.rules.add()
    rule.matches.add().path.prefix = path_prefix
    route.authorizations.extend(route_authz)
    message.authorizations.extend(server_authz)
    return message


def request(path: bytes, host: bytes = b"voting.emojivoto:8080", method: bytes = b"GET") -> RequestHead:
    return RequestHead(method, path, ((b"host", host),))


def test_translated_routes_and_authorizations() -> None:
    policy = translate(server_message(route_authz=[identities_authz("web-only", WEB)]))
    assert policy.meta == Meta("policy.linkerd.io", "server", "voting-grpc")
    assert policy.authorizations == (LOCALHOST,)  # the implicit one only: opaque connections need the server's
    route = policy.route(request(b"/api/vote?choice=1"))
    assert route is not None and route.meta.name == "voting-api"
    assert policy.route(request(b"/apiary")) is None  # prefixes match whole segments
    assert policy.route(request(b"/")) is None
    assert authorize(route.authorizations, client_ip=ip("10.0.0.7"), mesh_tls=True, client_id=WEB) is not None
    assert authorize(route.authorizations, client_ip=ip("10.0.0.7"), mesh_tls=True, client_id=VOTE) is None


def test_a_server_without_routes_gets_one_catch_all_route_with_its_authorizations() -> None:
    message = pb.Server(labels={"name": "s"})
    message.protocol.http1.SetInParent()
    message.authorizations.append(identities_authz("web", WEB))
    policy = translate(message)
    route = policy.route(request(b"/anything"))
    assert route is not None and route.meta == Meta.default("default")
    assert authorize(route.authorizations, client_ip=ip("10.0.0.7"), mesh_tls=True, client_id=WEB) is not None


def test_best_route_wins() -> None:
    message = pb.Server(labels={"name": "s"})
    detect = message.protocol.detect
    for name, kind, value in (("prefix", "prefix", "/"), ("exact", "exact", "/api/vote"),
                              ("longer", "prefix", "/api")):
        route = detect.http_routes.add()
        route.metadata.default = name
        setattr(route.rules.add().matches.add().path, kind, value)
    headered = detect.http_routes.add()
    headered.metadata.default = "headered"
    match = headered.rules.add().matches.add()
    match.path.prefix = "/api"
    match.headers.add(name="X-Canary", exact=b"1")
    hosted = detect.http_routes.add()
    hosted.metadata.default = "hosted"
    hosted.hosts.add(exact="admin.example.com")
    hosted.rules.add()
    policy = translate(message)

    def best(head: RequestHead) -> str:
        route = policy.route(head)
        assert route is not None
        return route.meta.name

    assert best(request(b"/api/vote")) == "exact"
    assert best(request(b"/api/list")) == "longer"
    assert best(RequestHead(b"GET", b"/api/list", ((b"host", b"x"), (b"x-canary", b"1")))) == "headered"
    assert best(request(b"/other")) == "prefix"
    assert best(request(b"/other", host=b"admin.example.com:80")) == "hosted"


@pytest.mark.parametrize("breakage", ["no protocol", "no authentication", "no rules", "bad regex"])
def test_invalid_messages_are_refused_by_field(breakage: str) -> None:
    message = server_message(route_authz=[identities_authz("web-only", WEB)])
    if breakage == "no protocol":
        message.ClearField("protocol")
    elif breakage == "no authentication":
        message.protocol.detect.http_routes[0].authorizations[0].ClearField("authentication")
    elif breakage == "no rules":
        del message.protocol.detect.http_routes[0].rules[:]
    else:
        message.protocol.detect.http_routes[0].rules[0].matches[0].path.regex = "(["
    with pytest.raises(InvalidPolicy):
        translate(message)


# -- per request ---------------------------------------------------------------------------------------------

def checker(policy_message: pb.Server | None, *, client_id: str | None, registry: Registry) -> InboundRequestPolicy:
    policy = translate(policy_message) if policy_message is not None else INVALID
    facts = ConnectionFacts(port=8080, client_ip=ip("10.0.0.7"), mesh_tls=client_id is not None, client_id=client_id,
                            target_labels='target_port="8080"', tls_labels=f'tls="true",client_id="{client_id or ""}"',
                            registry=registry)
    return InboundRequestPolicy(lambda: policy, facts, clock=lambda: 0.0)


def test_requests_are_routed_then_authorized_and_counted() -> None:
    registry = Registry(retain_idle=600)
    message = server_message(route_authz=[identities_authz("web-only", WEB)])
    assert checker(message, client_id=WEB, registry=registry).check(request(b"/api/vote")) is None
    denied = checker(message, client_id=VOTE, registry=registry).check(request(b"/api/vote"))
    assert denied is not None and denied.kind is ErrorKind.UNAUTHORIZED and denied.status == 403
    assert denied.kind.grpc == 7  # PERMISSION_DENIED
    missing = checker(message, client_id=WEB, registry=registry).check(request(b"/elsewhere"))
    assert missing is not None and missing.status == 404
    text = registry.render()
    assert ('inbound_http_authz_allow_total{target_port="8080",srv_group="policy.linkerd.io",srv_kind="server",'
            'srv_name="voting-grpc",srv_port="8080",route_group="policy.linkerd.io",route_kind="HTTPRoute",'
            'route_name="voting-api",authz_group="policy.linkerd.io",authz_kind="AuthorizationPolicy",'
            f'authz_name="web-only",tls="true",client_id="{WEB}"}} 1') in text
    assert f'inbound_http_authz_deny_total{{target_port="8080",srv_group="policy.linkerd.io"' in text
    assert f'route_name="voting-api",tls="true",client_id="{VOTE}"}} 1' in text
    assert 'inbound_http_route_not_found_total{target_port="8080"' in text


def test_the_invalid_policy_denies_every_request() -> None:
    denied = checker(None, client_id=WEB, registry=Registry(retain_idle=600)).check(request(b"/"))
    assert denied is not None and denied.status == 403


def test_the_servers_authorizations_apply_on_every_route() -> None:
    """linkerd2-proxy adds the Server's authorizations to each route's own (the controller's default route has none)."""
    policy = translate(server_message(route_authz=[identities_authz("vote-only", VOTE)],
                                      server_authz=[identities_authz("web-only", WEB)]))
    route = policy.route(request(b"/api/vote"))
    assert route is not None
    for client_id in (WEB, VOTE):
        assert authorize(route.authorizations, client_ip=ip("10.0.0.7"), mesh_tls=True, client_id=client_id)
    assert authorize(route.authorizations, client_ip=ip("10.0.0.7"), mesh_tls=True, client_id="x.y") is None


def test_a_grpc_request_is_denied_with_a_trailers_only_permission_denied() -> None:
    from tether.proxy.core import errors

    headers = dict(errors.grpc_headers(errors.unauthorized()))
    assert headers[b"grpc-status"] == b"7" and headers[b"content-type"] == b"application/grpc"
    assert dict(errors.grpc_headers(errors.route_not_found()))[b"grpc-status"] == b"5"  # NOT_FOUND
