"""The registry of resource types the mesh reads, and name resolution as kubectl does it.

Callers: `model.parse` (via `type_of`) to pick a schema, the store to key rows by
`ResourceType.key`, and the CLI to turn ``tether get srv`` into a type (`lookup`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.resources.errors import UnknownKind, ValidationError


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One group/kind, with the versions Tether accepts (the first is preferred)."""

    group: str
    kind: str
    versions: tuple[str, ...]
    plural: str
    short_names: tuple[str, ...] = ()
    namespaced: bool = True

    @property
    def key(self) -> str:
        """``Pod`` for the core group, else ``<Kind>.<group>``: unique across the registry."""
        return self.kind if not self.group else f"{self.kind}.{self.group}"

    @property
    def api_version(self) -> str:
        """The preferred ``apiVersion`` (what Tether writes)."""
        return self.api_version_of(self.versions[0])

    def api_version_of(self, version: str) -> str:
        return version if not self.group else f"{self.group}/{version}"

    @property
    def names(self) -> tuple[str, ...]:
        """Every lower-case name kubectl accepts for this type without a group."""
        return (self.plural, self.kind.lower(), *self.short_names)


NAMESPACE = ResourceType("", "Namespace", ("v1",), "namespaces", ("ns",), namespaced=False)
SERVICE_ACCOUNT = ResourceType("", "ServiceAccount", ("v1",), "serviceaccounts", ("sa",))
POD = ResourceType("", "Pod", ("v1",), "pods", ("po",))
SERVICE = ResourceType("", "Service", ("v1",), "services", ("svc",))
DEPLOYMENT = ResourceType("apps", "Deployment", ("v1",), "deployments", ("deploy",))
SERVICE_PROFILE = ResourceType(
    "linkerd.io", "ServiceProfile", ("v1alpha2", "v1alpha1"), "serviceprofiles", ("sp",)
)
SERVER = ResourceType(
    "policy.linkerd.io", "Server", ("v1beta3", "v1beta2", "v1beta1", "v1alpha1"), "servers", ("srv",)
)
SERVER_AUTHORIZATION = ResourceType(
    "policy.linkerd.io",
    "ServerAuthorization",
    ("v1beta1", "v1alpha1"),
    "serverauthorizations",
    ("saz", "serverauthz", "srvauthz"),
)
AUTHORIZATION_POLICY = ResourceType(
    "policy.linkerd.io", "AuthorizationPolicy", ("v1alpha1",), "authorizationpolicies", ("authzpolicy",)
)
MESH_TLS_AUTHENTICATION = ResourceType(
    "policy.linkerd.io", "MeshTLSAuthentication", ("v1alpha1",), "meshtlsauthentications", ("meshtlsauthn",)
)
NETWORK_AUTHENTICATION = ResourceType(
    "policy.linkerd.io",
    "NetworkAuthentication",
    ("v1alpha1",),
    "networkauthentications",
    ("netauthn", "networkauthn"),
)
POLICY_HTTP_ROUTE = ResourceType(
    "policy.linkerd.io", "HTTPRoute", ("v1beta3", "v1beta2", "v1beta1", "v1alpha1"), "httproutes"
)
GATEWAY_HTTP_ROUTE = ResourceType("gateway.networking.k8s.io", "HTTPRoute", ("v1", "v1beta1", "v1alpha2"), "httproutes")
GRPC_ROUTE = ResourceType("gateway.networking.k8s.io", "GRPCRoute", ("v1", "v1alpha2"), "grpcroutes")
TLS_ROUTE = ResourceType("gateway.networking.k8s.io", "TLSRoute", ("v1alpha2",), "tlsroutes")
TCP_ROUTE = ResourceType("gateway.networking.k8s.io", "TCPRoute", ("v1alpha2",), "tcproutes")
HTTP_LOCAL_RATE_LIMIT_POLICY = ResourceType(
    "policy.linkerd.io", "HTTPLocalRateLimitPolicy", ("v1alpha1",), "httplocalratelimitpolicies"
)
EGRESS_NETWORK = ResourceType("policy.linkerd.io", "EgressNetwork", ("v1alpha1",), "egressnetworks")
EXTERNAL_WORKLOAD = ResourceType("workload.linkerd.io", "ExternalWorkload", ("v1beta1",), "externalworkloads")
ENDPOINT_SLICE = ResourceType("discovery.k8s.io", "EndpointSlice", ("v1",), "endpointslices")
EVENT = ResourceType("", "Event", ("v1",), "events", ("ev",))

# Order matters only where a bare name matches several groups: the earlier entry
# wins.  For ``httproute`` kubectl's answer depends on API discovery order; with
# Linkerd installed it is commonly ``httproutes.policy.linkerd.io`` (noted in
# linkerd/website#1667), so the policy.linkerd.io HTTPRoute comes first and the
# Gateway API one is reached as ``httproutes.gateway.networking.k8s.io``.
REGISTRY: tuple[ResourceType, ...] = (
    NAMESPACE,
    SERVICE_ACCOUNT,
    POD,
    SERVICE,
    DEPLOYMENT,
    SERVICE_PROFILE,
    SERVER,
    SERVER_AUTHORIZATION,
    AUTHORIZATION_POLICY,
    MESH_TLS_AUTHENTICATION,
    NETWORK_AUTHENTICATION,
    POLICY_HTTP_ROUTE,
    GATEWAY_HTTP_ROUTE,
    GRPC_ROUTE,
    TLS_ROUTE,
    TCP_ROUTE,
    HTTP_LOCAL_RATE_LIMIT_POLICY,
    EGRESS_NETWORK,
    EXTERNAL_WORKLOAD,
    ENDPOINT_SLICE,
    EVENT,
)


def lookup(name: str) -> ResourceType:
    """Resolve ``pods``, ``po``, ``Pod``, ``deploy.apps``, ``httproutes.v1.gateway.networking.k8s.io`` ...

    Matching is case-insensitive over plural, singular, kind and short names,
    optionally followed by ``.<group>`` or ``.<version>.<group>``.
    """
    lowered = name.strip().lower()
    resource, _, qualifier = lowered.partition(".")
    for rtype in REGISTRY:
        if resource in rtype.names and _qualifier_matches(rtype, qualifier):
            return rtype
    raise UnknownKind(name, _close_matches(lowered))


def _qualifier_matches(rtype: ResourceType, qualifier: str) -> bool:
    if not qualifier:
        return True
    if qualifier == rtype.group:
        return True
    version, _, group = qualifier.partition(".")
    return group == rtype.group and version in rtype.versions


def _close_matches(lowered: str) -> tuple[str, ...]:
    candidates = {n for rtype in REGISTRY for n in rtype.names}
    candidates |= {f"{rtype.plural}.{rtype.group}" for rtype in REGISTRY if rtype.group}
    return tuple(difflib.get_close_matches(lowered, sorted(candidates), n=4, cutoff=0.6))


def type_of(obj: Mapping[str, Any]) -> ResourceType:
    """The type named by an object's ``apiVersion`` and ``kind``.

    Raises `ValidationError` at path ``apiVersion`` or ``kind`` when either is
    missing, malformed, unknown or names a version Tether does not accept.
    """
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if api_version is None:
        raise ValidationError("required", path="apiVersion")
    if not isinstance(api_version, str):
        raise ValidationError("expected a string", path="apiVersion")
    if kind is None:
        raise ValidationError("required", path="kind")
    if not isinstance(kind, str):
        raise ValidationError("expected a string", path="kind")
    group, _, version = api_version.rpartition("/")
    if not version:
        raise ValidationError(f"{api_version!r} is not <group>/<version> or <version>", path="apiVersion")
    same_kind = [t for t in REGISTRY if t.kind == kind]
    if not same_kind:
        raise ValidationError(f"unknown kind {kind!r}", path="kind", kind=kind)
    for rtype in same_kind:
        if rtype.group != group:
            continue
        if version not in rtype.versions:
            supported = ", ".join(rtype.api_version_of(v) for v in rtype.versions)
            raise ValidationError(
                f"unsupported version {api_version!r} of {kind} (supported: {supported})",
                path="apiVersion",
                kind=kind,
            )
        return rtype
    groups = ", ".join(t.api_version for t in same_kind)
    raise ValidationError(
        f"kind {kind} is not served by {api_version!r} (supported: {groups})", path="apiVersion", kind=kind
    )
