"""What the policy controller decides, before any protobuf: authorizations, routes, servers.

The inbound index (``tether.policy.inbound.index``) builds these frozen
records; the translator (``tether.policy.inbound.translator``) turns them into
``inbound.proto`` messages; the CLI's ``authz`` reads them as they are.  Being
frozen and hashable, two records compare equal exactly when the message they
would encode is the same, which is how a recomputation that changed nothing
sends nothing.  Pure: no protobufs, no I/O.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from tether.resources.policy import Network
from tether.resources.routes import GRPCRouteMatch, HTTPRouteMatch, RouteFilter

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALL_NETWORKS = (Network(ipaddress.ip_network("0.0.0.0/0")), Network(ipaddress.ip_network("::/0")))
DETECT_TIMEOUT_S = 10.0  # Linkerd's hard-coded protocol detection timeout


@dataclass(frozen=True, slots=True, order=True)
class Ref:
    """Where a server, authorization, route or rate limit came from.

    ``group`` empty and ``kind`` ``default`` for the built-in ones (``Default("probe")``),
    else the resource's group, lower-case kind and name.
    """

    group: str
    kind: str
    name: str

    @classmethod
    def default(cls, name: str) -> Ref:
        return cls("", "default", name)

    @property
    def is_default(self) -> bool:
        return self.kind == "default" and not self.group


class AuthnKind(enum.Enum):
    UNAUTHENTICATED = "unauthenticated"  # anything, plaintext included
    TLS_UNAUTHENTICATED = "tls"  # mesh TLS, any or no client identity
    TLS_AUTHENTICATED = "identities"  # mesh TLS with a matching client identity


@dataclass(frozen=True, slots=True)
class IdentityMatch:
    """``name`` exact, or ``suffix`` labels (``*`` is the empty suffix: any identity)."""

    name: str | None = None
    suffix: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> IdentityMatch:
        if text == "*":
            return cls(suffix=())
        if text.startswith("*."):
            return cls(suffix=tuple(text[2:].split(".")))
        return cls(name=text)

    def __str__(self) -> str:
        if self.suffix is None:
            return self.name or ""
        return "*" if not self.suffix else "*." + ".".join(self.suffix)


@dataclass(frozen=True, slots=True)
class ClientAuthz:
    """One authorization: which client networks, with which authentication.

    ``networks`` empty means "the cluster networks" (a ServerAuthorization without
    ``networks``), filled in by the translator as Linkerd's gRPC layer does.
    """

    ref: Ref
    authn: AuthnKind
    identities: tuple[IdentityMatch, ...] = ()
    networks: tuple[Network, ...] = ALL_NETWORKS


@dataclass(frozen=True, slots=True)
class HttpRule:
    matches: tuple[HTTPRouteMatch, ...]
    filters: tuple[RouteFilter, ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcRule:
    matches: tuple[GRPCRouteMatch, ...]
    filters: tuple[RouteFilter, ...] = ()


@dataclass(frozen=True, slots=True)
class InboundRoute:
    """An HTTP or gRPC route on a server, with the authorizations that target it."""

    ref: Ref
    hostnames: tuple[str, ...] = ()
    http_rules: tuple[HttpRule, ...] = ()
    grpc_rules: tuple[GrpcRule, ...] = ()
    authorizations: tuple[ClientAuthz, ...] = ()


DEFAULT_HTTP_ROUTE = InboundRoute(Ref.default("default"), http_rules=(HttpRule((HTTPRouteMatch(),)),))
DEFAULT_GRPC_ROUTE = InboundRoute(Ref.default("default"), grpc_rules=(GrpcRule(()),))


@dataclass(frozen=True, slots=True)
class RateLimitOverride:
    requests_per_second: int
    identities: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RateLimit:
    name: str
    total: int | None = None
    identity: int | None = None
    overrides: tuple[RateLimitOverride, ...] = ()


class Protocol(enum.Enum):
    DETECT = "detect"
    OPAQUE = "opaque"
    HTTP1 = "http1"
    HTTP2 = "http2"
    GRPC = "grpc"
    TLS = "tls"


# A Server's ``proxyProtocol`` to the protocol the proxy is told.
PROXY_PROTOCOLS = {
    "unknown": Protocol.DETECT,
    "HTTP/1": Protocol.HTTP1,
    "HTTP/2": Protocol.HTTP2,
    "gRPC": Protocol.GRPC,
    "opaque": Protocol.OPAQUE,
    "TLS": Protocol.TLS,
}


@dataclass(frozen=True, slots=True)
class InboundServer:
    """The policy of one pod port: a Server's, or the default policy's (``ref`` a default)."""

    ref: Ref
    protocol: Protocol
    authorizations: tuple[ClientAuthz, ...]
    http_routes: tuple[InboundRoute, ...] = (DEFAULT_HTTP_ROUTE,)
    grpc_routes: tuple[InboundRoute, ...] = (DEFAULT_GRPC_ROUTE,)
    ratelimit: RateLimit | None = None
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        # Computed once: the encoding cache hashes the policy for every stream it is sent to, and a
        # policy (a hundred authorizations with their networks) is deep.
        cached = self._hash
        if cached is None:
            cached = hash((self.ref, self.protocol, self.authorizations, self.http_routes, self.grpc_routes,
                           self.ratelimit))
            object.__setattr__(self, "_hash", cached)
        return cached
