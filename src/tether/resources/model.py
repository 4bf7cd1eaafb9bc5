"""`parse`: a decoded manifest in, a validated, typed `Resource` out.

The entry point for everything that reads resources: the CLI (``tether apply``),
the store (rows back into objects) and the platforms' watches. The object is
kept whole in ``Resource.raw`` (unknown fields included) so what a Linkerd user
wrote round-trips unchanged; the typed ``spec``/``status`` hold what the
controllers read, with defaults applied. Every error is a `ValidationError`
naming the source, document, kind, name and field path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tether.resources import core, discovery, kinds, policy, profiles, routes, workloads
from tether.resources.durations import parse_duration
from tether.resources.errors import ValidationError
from tether.resources.fields import Fields
from tether.resources.kinds import ResourceType, type_of
from tether.resources.meta import ConditionsStatus, ObjectMeta, parse_metadata
from tether.resources.quantities import parse_quantity

__all__ = ["Resource", "Spec", "Status", "parse", "parse_duration", "parse_quantity"]

Spec = (
    core.NamespaceSpec
    | core.ServiceAccountSpec
    | core.ServiceSpec
    | workloads.PodSpec
    | workloads.DeploymentSpec
    | workloads.ExternalWorkloadSpec
    | profiles.ServiceProfileSpec
    | policy.ServerSpec
    | policy.ServerAuthorizationSpec
    | policy.AuthorizationPolicySpec
    | policy.MeshTLSAuthenticationSpec
    | policy.NetworkAuthenticationSpec
    | policy.HTTPLocalRateLimitPolicySpec
    | policy.EgressNetworkSpec
    | routes.HTTPRouteSpec
    | routes.GRPCRouteSpec
    | routes.TLSRouteSpec
    | routes.TCPRouteSpec
    | discovery.EndpointSliceSpec
    | core.EventSpec
)
Status = workloads.PodStatus | workloads.DeploymentStatus | routes.RouteStatus | ConditionsStatus

KindParser = Callable[[Fields, ObjectMeta], tuple[Any, Any]]

# One parser per registered type; tests check the two tables stay in step.
PARSERS: dict[ResourceType, KindParser] = {
    kinds.NAMESPACE: core.parse_namespace,
    kinds.SERVICE_ACCOUNT: core.parse_service_account,
    kinds.POD: workloads.parse_pod,
    kinds.SERVICE: core.parse_service,
    kinds.DEPLOYMENT: workloads.parse_deployment,
    kinds.SERVICE_PROFILE: profiles.parse_service_profile,
    kinds.SERVER: policy.parse_server,
    kinds.SERVER_AUTHORIZATION: policy.parse_server_authorization,
    kinds.AUTHORIZATION_POLICY: policy.parse_authorization_policy,
    kinds.MESH_TLS_AUTHENTICATION: policy.parse_mesh_tls_authentication,
    kinds.NETWORK_AUTHENTICATION: policy.parse_network_authentication,
    kinds.POLICY_HTTP_ROUTE: routes.parse_policy_http_route,
    kinds.GATEWAY_HTTP_ROUTE: routes.parse_gateway_http_route,
    kinds.GRPC_ROUTE: routes.parse_grpc_route,
    kinds.TLS_ROUTE: routes.parse_tls_route,
    kinds.TCP_ROUTE: routes.parse_tcp_route,
    kinds.HTTP_LOCAL_RATE_LIMIT_POLICY: policy.parse_http_local_rate_limit_policy,
    kinds.EGRESS_NETWORK: policy.parse_egress_network,
    kinds.EXTERNAL_WORKLOAD: workloads.parse_external_workload,
    kinds.ENDPOINT_SLICE: discovery.parse_endpoint_slice,
    kinds.EVENT: core.parse_event,
}


@dataclass(frozen=True, slots=True)
class Resource:
    """A validated object: the manifest as given, plus its typed reading.

    ``status`` is None for kinds without one (Namespace, ServiceAccount, Service,
    ServiceProfile and the policy kinds other than rate limits and egress
    networks) and an empty status object when the manifest carries none.
    """

    raw: dict[str, Any]
    type: ResourceType
    metadata: ObjectMeta
    spec: Spec
    status: Status | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    @property
    def labels(self) -> dict[str, str]:
        return self.metadata.labels

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations


def parse(obj: Mapping[str, Any], source: str | None = None, index: int | None = None) -> Resource:
    """Validate ``obj`` against its kind's schema and return it typed.

    ``source`` (a file name) and ``index`` (1-based document number) only label
    errors. A missing namespace is left None: defaulting it is the caller's job.
    """
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    try:
        if not isinstance(obj, Mapping):
            raise ValidationError("expected a mapping (a Kubernetes object)")
        raw = copy.deepcopy(dict(obj))
        rtype = type_of(raw)
        doc = Fields(raw)
        meta = parse_metadata(doc, rtype)
        spec, status = PARSERS[rtype](doc, meta)
    except ValidationError as e:
        raise e.located(
            source=source,
            doc_index=index,
            kind=kind if isinstance(kind, str) else None,
            name=name if isinstance(name, str) else None,
        ) from None
    return Resource(raw=raw, type=rtype, metadata=meta, spec=spec, status=status)
