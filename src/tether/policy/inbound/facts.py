"""What the inbound index keeps of each object: small frozen records read once from the typed resource model.

``tether.policy.inbound.index`` turns each watched object into one of these
(``facts_of``) and never keeps the object itself.  A pod is indexed only when
it carries ``linkerd.io/control-plane-ns`` (it was meshed), as Linkerd's
controller watches only those.  No protobufs here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.policy.model import IdentityMatch
from tether.ports import PortSet, parse_port_set
from tether.resources import kinds
from tether.resources.meta import ConditionsStatus
from tether.resources.model import Resource
from tether.resources.policy import (
    AuthorizationPolicySpec,
    HTTPLocalRateLimitPolicySpec,
    MeshTLSAuthenticationSpec,
    Network,
    NetworkAuthenticationSpec,
    ServerAuthorizationSpec,
    ServerSpec,
)
from tether.resources.routes import GRPCRouteSpec, HTTPRouteSpec, RouteParentStatus, RouteStatus
from tether.resources.workloads import ExternalWorkloadSpec, PodSpec, Probe

log = logging.getLogger(__name__)

CONTROL_PLANE_NS_LABEL = "linkerd.io/control-plane-ns"
DEFAULT_INBOUND_POLICY = "config.linkerd.io/default-inbound-policy"
OPAQUE_PORTS = "config.linkerd.io/opaque-ports"
REQUIRE_IDENTITY_PORTS = "config.linkerd.io/proxy-require-identity-inbound-ports"
# Annotations a pod inherits from its namespace when it does not set them (the injector copies them
# on Kubernetes; the local platform has no webhook to, so the index reads the namespace).
INHERITED = (DEFAULT_INBOUND_POLICY, OPAQUE_PORTS, REQUIRE_IDENTITY_PORTS)
# The name this controller writes status under (``tether.policy.status``) and reads it back by.
CONTROLLER_NAME = "linkerd.io/policy-controller"
_EPOCH = datetime.min


@dataclass(frozen=True, slots=True)
class PodFacts:
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]  # only the INHERITED ones the pod sets
    service_account: str
    port_names: Mapping[str, tuple[int, ...]]
    probe_paths: Mapping[int, tuple[str, ...]]
    ip: str | None = None
    external: bool = False  # an ExternalWorkload (a VM's proxy), selected by ``externalWorkloadSelector``

    def ports_named(self, name: str) -> tuple[int, ...]:
        return self.port_names.get(name, ())


@dataclass(frozen=True, slots=True)
class Named:
    """A namespaced policy object: its name, creation time (for precedence), labels and spec."""

    namespace: str
    name: str
    created: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    spec: Any = None
    # The Servers whose acceptance of this route or rate limit the object's status records (see ``accepted_by``).
    accepted_by: frozenset[str] = frozenset()

    @property
    def order(self) -> tuple[datetime, str]:
        """Linkerd's precedence: oldest first, then by name."""
        return self.created, self.name


def _probe_paths(spec: PodSpec, port_names: Mapping[str, tuple[int, ...]]) -> dict[int, tuple[str, ...]]:
    """HTTP probe paths by port, of every container -- init containers too, as Linkerd's ``pod_http_probes``:
    a native-sidecar proxy's ``/live`` and ``/ready`` on its admin port are among them."""
    paths: dict[int, set[str]] = {}
    for container in (*spec.containers, *spec.init_containers):
        probes: tuple[Probe | None, ...] = (container.liveness_probe, container.readiness_probe,
                                            container.startup_probe)
        for probe in probes:
            if probe is None or probe.http_get is None or probe.http_get.scheme.upper() != "HTTP":
                continue
            target = probe.http_get.port
            ports = (target,) if isinstance(target, int) else port_names.get(target, ())
            for port in ports:
                paths.setdefault(port, set()).add(probe.http_get.path or "/")
    return {port: tuple(sorted(p)) for port, p in paths.items()}


def pod_facts(resource: Resource) -> PodFacts | None:
    """A meshed pod's facts; None for a pod no Linkerd control plane meshed."""
    if CONTROL_PLANE_NS_LABEL not in resource.labels:
        return None
    spec = resource.spec
    assert isinstance(spec, PodSpec)
    names: dict[str, list[int]] = {}
    for container in (*spec.containers, *spec.init_containers):  # Linkerd's pod_tcp_ports_by_name
        for port in container.ports:
            if port.name and port.protocol == "TCP":
                names.setdefault(port.name, []).append(port.container_port)
    port_names = {name: tuple(ports) for name, ports in names.items()}
    status = resource.status
    return PodFacts(
        namespace=resource.namespace or "default",
        name=resource.name,
        labels=dict(resource.labels),
        annotations={k: v for k, v in resource.annotations.items() if k in INHERITED},
        service_account=spec.service_account_name,
        port_names=port_names,
        probe_paths=_probe_paths(spec, port_names),
        ip=getattr(status, "pod_ip", None),
    )


def external_workload_facts(resource: Resource) -> PodFacts:
    """An ExternalWorkload's facts, in a pod's shape: its labels, annotations and named ports (no probes).

    Every ExternalWorkload is meshed (a proxy runs beside it); its identity is its ``meshTLS``,
    so there is no service account.
    """
    spec = resource.spec
    assert isinstance(spec, ExternalWorkloadSpec)
    names: dict[str, list[int]] = {}
    for port in spec.ports:
        if port.name and port.protocol == "TCP":
            names.setdefault(port.name, []).append(port.port)
    return PodFacts(
        namespace=resource.namespace or "default",
        name=resource.name,
        labels=dict(resource.labels),
        annotations={k: v for k, v in resource.annotations.items() if k in INHERITED},
        service_account="",
        port_names={name: tuple(ports) for name, ports in names.items()},
        probe_paths={},
        ip=spec.workload_ips[0] if spec.workload_ips else None,
        external=True,
    )


def named(resource: Resource) -> Named:
    meta = resource.metadata
    return Named(resource.namespace or "default", resource.name, meta.creation_timestamp or _EPOCH,
                 dict(meta.labels), resource.spec, accepted_by(resource))


def accepted_by(resource: Resource) -> frozenset[str]:
    """The Servers the object's status says accept it, read back as Linkerd's inbound index reads it: a
    route's ``status.parents`` entry of kind ``Server`` written by this controller with ``Accepted: True``; an
    HTTPLocalRateLimitPolicy's ``Accepted: True`` condition (its target Server).  A route or rate limit counts
    only once the status controller's write has landed, never on its own spec."""
    status = resource.status
    if isinstance(status, RouteStatus):
        servers = set()
        for parent in status.parents:
            # Other controllers' entries are theirs (Linkerd's index skips them too, silently).
            if parent.controller_name != CONTROLLER_NAME or parent.parent_ref.kind != kinds.SERVER.kind:
                continue
            _warn_unexpected(resource, parent)
            if parent.accepted:
                servers.add(parent.parent_ref.name)
        return frozenset(servers)
    if isinstance(status, ConditionsStatus) and isinstance(resource.spec, HTTPLocalRateLimitPolicySpec):
        condition = status.condition("Accepted")
        if condition is not None and condition.is_true:
            return frozenset((resource.spec.target_ref.name,))
    return frozenset()


def _warn_unexpected(resource: Resource, parent: RouteParentStatus) -> None:
    """Log what a Server's entry under this controller's name carries that this controller never writes: a
    condition other than ``Accepted``, or one neither ``True`` nor ``False`` -- another controller writing as
    this one (a second control plane?).  As Linkerd's inbound index (``from_http_parent_status``): the
    condition is logged and does not count."""
    where = (f"{resource.type.kind} {resource.namespace}/{resource.name}: status.parents entry of Server "
             f"{parent.parent_ref.name} by {CONTROLLER_NAME}")
    for condition in parent.conditions:
        if condition.type != "Accepted":
            log.warning("%s has a condition this controller does not write: %s (ignored; is another controller "
                        "writing as %s?)", where, condition.type, CONTROLLER_NAME)
        elif condition.status not in ("True", "False"):
            log.warning("%s has condition Accepted with status %s, neither True nor False (ignored)", where,
                        condition.status)


def port_set(text: str | None, names: Mapping[str, tuple[int, ...]], where: str) -> PortSet:
    """A port-list annotation as Linkerd reads it: bad items are logged and skipped."""
    if not text:
        return PortSet.of(())
    ports, skipped = parse_port_set(text, names)
    if skipped:
        log.warning("%s: ignoring %s (not ports, ranges or port names)", where, ", ".join(skipped))
    return ports


def identity_matches(spec: MeshTLSAuthenticationSpec, namespace: str,
                     sa_identity: Any, ns_identity: Any) -> tuple[IdentityMatch, ...]:
    """The identities a MeshTLSAuthentication names (``identityRefs`` resolved)."""
    out = [IdentityMatch.parse(i) for i in spec.identities]
    for ref in spec.identity_refs:
        if ref.targets(kinds.SERVICE_ACCOUNT) and ref.name:
            out.append(IdentityMatch(name=sa_identity(ref.namespace or namespace, ref.name)))
        elif ref.targets(kinds.NAMESPACE) and ref.name:
            out.append(IdentityMatch.parse(ns_identity(ref.name)))
    return tuple(out)


SPEC_TYPES: dict[str, type] = {
    kinds.SERVER.key: ServerSpec,
    kinds.SERVER_AUTHORIZATION.key: ServerAuthorizationSpec,
    kinds.AUTHORIZATION_POLICY.key: AuthorizationPolicySpec,
    kinds.MESH_TLS_AUTHENTICATION.key: MeshTLSAuthenticationSpec,
    kinds.NETWORK_AUTHENTICATION.key: NetworkAuthenticationSpec,
    kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key: HTTPLocalRateLimitPolicySpec,
    kinds.POLICY_HTTP_ROUTE.key: HTTPRouteSpec,
    kinds.GATEWAY_HTTP_ROUTE.key: HTTPRouteSpec,
    kinds.GRPC_ROUTE.key: GRPCRouteSpec,
}

__all__ = ["Network", "PodFacts", "Named", "pod_facts", "external_workload_facts", "named", "accepted_by", "port_set",
           "identity_matches", "SPEC_TYPES", "CONTROLLER_NAME"]
