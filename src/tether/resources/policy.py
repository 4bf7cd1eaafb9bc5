"""Typed specs of Linkerd's policy kinds (``policy.linkerd.io``), except routes (see `routes`).

Server, ServerAuthorization, AuthorizationPolicy, MeshTLSAuthentication,
NetworkAuthentication, HTTPLocalRateLimitPolicy and EgressNetwork. Besides the
CRD schemas, the single-object rules of Linkerd's policy admission webhook are
checked here, since the local platform has no webhook. `model.parse` calls the
``parse_*`` functions; the policy controller's indexes read the specs.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from tether.resources import formats
from tether.resources.fields import Fields
from tether.resources.kinds import (
    GATEWAY_HTTP_ROUTE,
    GRPC_ROUTE,
    MESH_TLS_AUTHENTICATION,
    NAMESPACE,
    NETWORK_AUTHENTICATION,
    POLICY_HTTP_ROUTE,
    SERVER,
    SERVICE_ACCOUNT,
    ResourceType,
)
from tether.resources.meta import ConditionsStatus, ObjectMeta, parse_conditions_status
from tether.resources.references import ObjectRef, parse_ref
from tether.resources.selectors import LabelSelector, selector_at

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PROXY_PROTOCOLS = ("unknown", "HTTP/1", "HTTP/2", "gRPC", "opaque", "TLS")
DEFAULT_POLICIES = (
    "all-unauthenticated",
    "all-authenticated",
    "cluster-unauthenticated",
    "cluster-authenticated",
    "deny",
    "audit",
)
TRAFFIC_POLICIES = ("Allow", "Deny")

@dataclass(frozen=True, slots=True)
class Network:
    """``{cidr, except}``: the addresses in ``cidr`` but in none of ``except_``."""

    cidr: IPNetwork
    except_: tuple[IPNetwork, ...] = ()

    def contains(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return address in self.cidr and not any(address in e for e in self.except_)

    def overlaps(self, other: IPNetwork) -> bool:
        """Whether some address of this network (outside its exceptions) is in ``other``."""
        if other.version != self.cidr.version or not self.cidr.overlaps(other):
            return False
        # Two overlapping CIDRs meet in the smaller; take the exceptions out of it.
        remaining: list[IPNetwork] = [self.cidr if self.cidr.subnet_of(other) else other]  # type: ignore[arg-type]
        for excluded in self.except_:
            left: list[IPNetwork] = []
            for net in remaining:
                if net.subnet_of(excluded):  # type: ignore[arg-type]
                    continue
                if excluded.subnet_of(net):  # type: ignore[arg-type]
                    left.extend(net.address_exclude(excluded))  # type: ignore[arg-type]
                else:
                    left.append(net)
            remaining = left
        return bool(remaining)


def _network(text: str, node: Fields, key: str) -> IPNetwork:
    # A bare address means that single host, as Linkerd's parser allows.
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise node.error(key, f"{text!r} is not a CIDR or IP address") from None


def _networks(node: Fields, key: str, *, required: bool) -> tuple[Network, ...]:
    out = []
    for net in node.children(key, required=required, non_empty=True):
        cidr = _network(net.string("cidr"), net, "cidr")
        excepts = []
        for i, text in enumerate(net.strings("except")):
            excluded = _network(text, net, f"except[{i}]")
            if excluded.version != cidr.version or not excluded.subnet_of(cidr) or excluded == cidr:
                raise net.error(f"except[{i}]", f"{text!r} must be a proper subset of cidr {cidr}")
            excepts.append(excluded)
        out.append(Network(cidr, tuple(excepts)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """Exactly one of the selectors is set; ``port`` is a number or a container-port name."""

    port: int | str
    pod_selector: LabelSelector | None = None
    external_workload_selector: LabelSelector | None = None
    proxy_protocol: str = "unknown"
    access_policy: str = "deny"


def parse_server(doc: Fields, meta: ObjectMeta) -> tuple[ServerSpec, None]:
    spec = doc.child("spec")
    selectors = {key: selector_at(spec, key) for key in ("podSelector", "externalWorkloadSelector")}
    if sum(s is not None for s in selectors.values()) != 1:
        raise spec.error(None, "exactly one of podSelector, externalWorkloadSelector must be set")
    return (
        ServerSpec(
            port=spec.int_or_string("port", check=formats.iana_svc_name),
            pod_selector=selectors["podSelector"],
            external_workload_selector=selectors["externalWorkloadSelector"],
            proxy_protocol=spec.choice("proxyProtocol", PROXY_PROTOCOLS, "unknown"),
            access_policy=spec.choice("accessPolicy", DEFAULT_POLICIES, "deny"),
        ),
        None,
    )


@dataclass(frozen=True, slots=True)
class ServerSelection:
    """Which Servers a ServerAuthorization applies to: one by name, or those a selector matches."""

    name: str | None = None
    selector: LabelSelector | None = None


@dataclass(frozen=True, slots=True)
class ServiceAccountRef:
    name: str
    namespace: str | None = None  # None: the authorization's own namespace


@dataclass(frozen=True, slots=True)
class MeshTLSClients:
    unauthenticated_tls: bool = False
    identities: tuple[str, ...] = ()
    service_accounts: tuple[ServiceAccountRef, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizedClients:
    """``networks`` is None when unset (the controller then uses the cluster networks)."""

    networks: tuple[Network, ...] | None = None
    unauthenticated: bool = False
    mesh_tls: MeshTLSClients | None = None


@dataclass(frozen=True, slots=True)
class ServerAuthorizationSpec:
    server: ServerSelection
    client: AuthorizedClients


def parse_server_authorization(doc: Fields, meta: ObjectMeta) -> tuple[ServerAuthorizationSpec, None]:
    spec = doc.child("spec")
    server = spec.child("server")
    if server.has("name") == server.has("selector"):
        raise server.error(None, "exactly one of name, selector must be set")
    client = spec.child("client")
    mesh = client.child("meshTLS", None)
    mesh_tls = None
    if mesh is not None:
        mesh_tls = MeshTLSClients(
            unauthenticated_tls=mesh.boolean("unauthenticatedTLS", False),
            identities=mesh.strings("identities", check=formats.proxy_identity),
            service_accounts=tuple(
                ServiceAccountRef(
                    name=sa.string("name", check=formats.dns1123_label),
                    namespace=sa.string("namespace", None, check=formats.dns1123_label),
                )
                for sa in mesh.children("serviceAccounts")
            ),
        )
    unauthenticated = client.boolean("unauthenticated", False)
    if unauthenticated and mesh_tls is not None:
        raise client.error("meshTLS", "must not be set when unauthenticated is true")
    if mesh_tls is not None and mesh_tls.unauthenticated_tls and (mesh_tls.identities or mesh_tls.service_accounts):
        raise mesh.error(None, "identities and serviceAccounts must be empty when unauthenticatedTLS is true")
    if not unauthenticated and (
        mesh_tls is None or not (mesh_tls.unauthenticated_tls or mesh_tls.identities or mesh_tls.service_accounts)
    ):
        raise client.error(
            None, "must set unauthenticated, meshTLS.unauthenticatedTLS, or meshTLS identities or serviceAccounts"
        )
    return (
        ServerAuthorizationSpec(
            server=ServerSelection(
                name=server.string("name", None, check=formats.dns1123_label),
                selector=selector_at(server, "selector"),
            ),
            client=AuthorizedClients(
                networks=_networks(client, "networks", required=False) if client.has("networks") else None,
                unauthenticated=unauthenticated,
                mesh_tls=mesh_tls,
            ),
        ),
        None,
    )


@dataclass(frozen=True, slots=True)
class AuthorizationPolicySpec:
    target_ref: ObjectRef
    required_authentication_refs: tuple[ObjectRef, ...] = ()


_POLICY_TARGETS = (SERVER, NAMESPACE, POLICY_HTTP_ROUTE, GATEWAY_HTTP_ROUTE, GRPC_ROUTE)
# Each authentication kind may be required at most once per policy.
_AUTHENTICATIONS = (MESH_TLS_AUTHENTICATION, NETWORK_AUTHENTICATION, SERVICE_ACCOUNT)


def parse_authorization_policy(doc: Fields, meta: ObjectMeta) -> tuple[AuthorizationPolicySpec, None]:
    spec = doc.child("spec")
    target_node = spec.child("targetRef")
    target = parse_ref(target_node)
    _kind_of(target_node, target, "target", _POLICY_TARGETS)
    if target.targets(NAMESPACE) and meta.namespace is not None and target.name != meta.namespace:
        raise target_node.error("name", f"a Namespace target must be the policy's own namespace {meta.namespace!r}")
    refs = []
    counts = dict.fromkeys(_AUTHENTICATIONS, 0)
    for node in spec.children("requiredAuthenticationRefs", required=True):
        ref = parse_ref(node)
        rtype = _kind_of(node, ref, "authentication", _AUTHENTICATIONS)
        counts[rtype] += 1
        if counts[rtype] > 1:
            raise node.error(None, f"at most one {rtype.kind} may be required")
        if counts[MESH_TLS_AUTHENTICATION] and counts[SERVICE_ACCOUNT]:
            raise node.error(None, "a MeshTLSAuthentication and a ServiceAccount may not both be required")
        refs.append(ref)
    return AuthorizationPolicySpec(target, tuple(refs)), None


@dataclass(frozen=True, slots=True)
class MeshTLSAuthenticationSpec:
    identities: tuple[str, ...] = ()
    identity_refs: tuple[ObjectRef, ...] = ()


def parse_mesh_tls_authentication(doc: Fields, meta: ObjectMeta) -> tuple[MeshTLSAuthenticationSpec, None]:
    spec = doc.child("spec")
    if spec.has("identities") == spec.has("identityRefs"):
        raise spec.error(None, "exactly one of identities, identityRefs must be set")
    refs = []
    for node in spec.children("identityRefs"):
        ref = parse_ref(node, name_required=False)
        rtype = _kind_of(node, ref, "identity reference", (SERVICE_ACCOUNT, NAMESPACE))
        if rtype is NAMESPACE and ref.namespace is not None:
            raise node.error("namespace", "must not be set for a Namespace reference")
        refs.append(ref)
    return MeshTLSAuthenticationSpec(spec.strings("identities", check=formats.proxy_identity), tuple(refs)), None


@dataclass(frozen=True, slots=True)
class NetworkAuthenticationSpec:
    networks: tuple[Network, ...]


def parse_network_authentication(doc: Fields, meta: ObjectMeta) -> tuple[NetworkAuthenticationSpec, None]:
    return NetworkAuthenticationSpec(_networks(doc.child("spec"), "networks", required=True)), None


@dataclass(frozen=True, slots=True)
class RateLimitOverride:
    requests_per_second: int
    client_refs: tuple[ObjectRef, ...]


@dataclass(frozen=True, slots=True)
class HTTPLocalRateLimitPolicySpec:
    """Requests per second: ``total`` for the Server, ``identity`` per client identity."""

    target_ref: ObjectRef
    total: int | None = None
    identity: int | None = None
    overrides: tuple[RateLimitOverride, ...] = ()


def parse_http_local_rate_limit_policy(
    doc: Fields, meta: ObjectMeta
) -> tuple[HTTPLocalRateLimitPolicySpec, ConditionsStatus]:
    spec = doc.child("spec")
    target_node = spec.child("targetRef")
    target = parse_ref(target_node)
    _kind_of(target_node, target, "target", (SERVER,))
    total = _requests_per_second(spec, "total", None)
    overrides = []
    for node in spec.children("overrides"):
        client_refs = []
        for ref_node in node.children("clientRefs", required=True):
            ref = parse_ref(ref_node)
            _kind_of(ref_node, ref, "client", (SERVICE_ACCOUNT,))
            client_refs.append(ref)
        overrides.append(RateLimitOverride(node.integer("requestsPerSecond", minimum=1), tuple(client_refs)))
        _at_most(node, "requestsPerSecond", overrides[-1].requests_per_second, total)
    return (
        HTTPLocalRateLimitPolicySpec(
            target_ref=target,
            total=total,
            identity=_requests_per_second(spec, "identity", total),
            overrides=tuple(overrides),
        ),
        parse_conditions_status(doc),
    )


def _requests_per_second(spec: Fields, key: str, total: int | None) -> int | None:
    limit = spec.child(key, None)
    if limit is None:
        return None
    rps = limit.integer("requestsPerSecond", minimum=1)
    _at_most(limit, "requestsPerSecond", rps, total)
    return rps


def _at_most(node: Fields, key: str, rps: int, total: int | None) -> None:
    if total is not None and rps > total:
        raise node.error(key, f"must not exceed the total of {total}")


@dataclass(frozen=True, slots=True)
class EgressNetworkSpec:
    """``networks`` None means everything outside the cluster networks."""

    traffic_policy: str
    networks: tuple[Network, ...] | None = None


def parse_egress_network(doc: Fields, meta: ObjectMeta) -> tuple[EgressNetworkSpec, ConditionsStatus]:
    spec = doc.child("spec")
    return (
        EgressNetworkSpec(
            traffic_policy=spec.choice("trafficPolicy", TRAFFIC_POLICIES),
            networks=_networks(spec, "networks", required=False) if spec.has("networks") else None,
        ),
        parse_conditions_status(doc),
    )


def _kind_of(node: Fields, ref: ObjectRef, what: str, allowed: tuple[ResourceType, ...]) -> ResourceType:
    """The allowed type ``ref`` names, else an error at ``node``'s ``kind``."""
    for rtype in allowed:
        if ref.targets(rtype):
            return rtype
    named = f"{ref.kind}.{ref.group}" if ref.group else ref.kind
    supported = ", ".join(t.key for t in allowed)
    raise node.error("kind", f"unsupported {what} {named} (supported: {supported})")
