"""An ``InboundServer`` (the index's decision) to the ``io.linkerd.proxy.inbound.Server`` message.

As Linkerd's gRPC layer builds it: the protocol with its routes and rate limit,
every authorization with ``metadata`` and the older ``labels``, an authorization
without networks given the cluster networks, identities split into exact names
and suffixes, Server ``labels`` ``{group, kind, name}``.  Routes are already in
precedence order.  Called once per change per watched port; the bytes are shared
by every stream of that port.
"""

from __future__ import annotations

from google.protobuf import duration_pb2

from tether.api import inbound_pb2 as pb
from tether.api import meta_pb2, net_pb2
from tether.api.addresses import to_ip_address
from tether.policy import route_translator as rt
from tether.policy.model import (
    DETECT_TIMEOUT_S,
    IPNetwork,
    AuthnKind,
    ClientAuthz,
    InboundRoute,
    InboundServer,
    Protocol,
    RateLimit,
    Ref,
)
from tether.resources.policy import Network

RATELIMIT_KIND = "HTTPLocalRateLimitPolicy"


def metadata(ref: Ref) -> meta_pb2.Metadata:
    if ref.is_default:
        return meta_pb2.Metadata(default=ref.name)
    return meta_pb2.Metadata(resource=meta_pb2.Resource(group=ref.group, kind=ref.kind, name=ref.name))


def labels(ref: Ref) -> dict[str, str]:
    return {"group": ref.group, "kind": ref.kind, "name": ref.name}


def ip_network(net: IPNetwork) -> net_pb2.IPNetwork:
    return net_pb2.IPNetwork(ip=to_ip_address(str(net.network_address)), prefix_len=net.prefixlen)


def authz(authorization: ClientAuthz, cluster_networks: tuple[Network, ...]) -> pb.Authz:
    networks = authorization.networks or tuple(Network(n.cidr) for n in cluster_networks)
    out = pb.Authz(metadata=metadata(authorization.ref), labels=labels(authorization.ref))
    for network in networks:
        entry = out.networks.add(net=ip_network(network.cidr))
        getattr(entry, "except").extend(ip_network(e) for e in network.except_)
    if authorization.authn is AuthnKind.UNAUTHENTICATED:
        out.authentication.unauthenticated.SetInParent()
    elif authorization.authn is AuthnKind.TLS_UNAUTHENTICATED:
        out.authentication.meshTLS.unauthenticated.SetInParent()
    else:
        clients = out.authentication.meshTLS.identities
        clients.SetInParent()
        for identity in authorization.identities:
            if identity.suffix is None:
                clients.identities.add(name=identity.name or "")
            else:
                clients.suffixes.add(parts=list(identity.suffix))
    return out


def _http_route(route: InboundRoute, cluster_networks: tuple[Network, ...]) -> pb.HttpRoute:
    out = pb.HttpRoute(metadata=metadata(route.ref))
    out.hosts.extend(rt.host_match(h) for h in route.hostnames)
    out.authorizations.extend(authz(a, cluster_networks) for a in route.authorizations)
    for rule in route.http_rules:
        entry = out.rules.add()
        entry.matches.extend(rt.http_match(m) for m in rule.matches)
        for f in rule.filters:
            if f.request_header_modifier is not None:
                entry.filters.add(request_header_modifier=rt.request_header_modifier(f.request_header_modifier))
            elif f.request_redirect is not None:
                entry.filters.add(redirect=rt.redirect(f.request_redirect))
            # ResponseHeaderModifier has no inbound filter message: Linkerd drops it too.
    return out


def _grpc_route(route: InboundRoute, cluster_networks: tuple[Network, ...]) -> pb.GrpcRoute:
    out = pb.GrpcRoute(metadata=metadata(route.ref))
    out.hosts.extend(rt.host_match(h) for h in route.hostnames)
    out.authorizations.extend(authz(a, cluster_networks) for a in route.authorizations)
    for rule in route.grpc_rules:
        entry = out.rules.add()
        entry.matches.extend(rt.grpc_match(m) for m in rule.matches)
        for f in rule.filters:
            if f.request_header_modifier is not None:
                entry.filters.add(request_header_modifier=rt.request_header_modifier(f.request_header_modifier))
    return out


def _ratelimit(limit: RateLimit) -> pb.HttpLocalRateLimit:
    out = pb.HttpLocalRateLimit(metadata=meta_pb2.Metadata(resource=meta_pb2.Resource(
        group="policy.linkerd.io", kind=RATELIMIT_KIND, name=limit.name)))
    if limit.total is not None:
        out.total.requestsPerSecond = limit.total
    if limit.identity is not None:
        out.identity.requestsPerSecond = limit.identity
    for override in limit.overrides:
        entry = out.overrides.add()
        entry.limit.requestsPerSecond = override.requests_per_second
        entry.clients.identities.extend(pb.Identity(name=i) for i in override.identities)
    return out


def server_message(server: InboundServer, cluster_networks: tuple[Network, ...]) -> pb.Server:
    out = pb.Server(labels=labels(server.ref))
    http = [_http_route(r, cluster_networks) for r in server.http_routes]
    limit = _ratelimit(server.ratelimit) if server.ratelimit is not None else None
    protocol = server.protocol
    if protocol is Protocol.DETECT:
        detect = out.protocol.detect
        detect.timeout.CopyFrom(duration_pb2.Duration(seconds=int(DETECT_TIMEOUT_S)))
        detect.http_routes.extend(http)
        if limit is not None:
            detect.http_local_rate_limit.CopyFrom(limit)
    elif protocol in (Protocol.HTTP1, Protocol.HTTP2):
        kind = out.protocol.http1 if protocol is Protocol.HTTP1 else out.protocol.http2
        kind.SetInParent()
        kind.routes.extend(http)
        if limit is not None:
            kind.local_rate_limit.CopyFrom(limit)
    elif protocol is Protocol.GRPC:
        out.protocol.grpc.SetInParent()
        out.protocol.grpc.routes.extend(_grpc_route(r, cluster_networks) for r in server.grpc_routes)
    elif protocol is Protocol.OPAQUE:
        out.protocol.opaque.SetInParent()
    else:
        out.protocol.tls.SetInParent()
    out.authorizations.extend(authz(a, cluster_networks) for a in server.authorizations)
    return out


def encode(server: InboundServer, cluster_networks: tuple[Network, ...]) -> bytes:
    return server_message(server, cluster_networks).SerializeToString(deterministic=True)
