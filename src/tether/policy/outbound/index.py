"""The outbound index: Services, EgressNetworks, routes and Namespaces in; one ``OutboundState`` per watched target out.

Fed by the platform's watches (``apply(type_key, event)``, the same seam as
destination's cluster index), it answers two questions:

* **which target** a proxy means (``service_target``, ``address_target``):
  ``<svc>.<ns>.svc.<cluster-domain>[:port]`` is that Service's port (port 80
  by default), whether or not the Service exists yet, as Linkerd serves it;
  an ``ip:port`` is resolved on every change, in Linkerd's order: a Service's
  cluster IP (a port the Service does not define gets the *undefined-port*
  policy), else the most specific EgressNetwork -- those of the client's
  namespace if it has any, else those of the global egress namespace -- then
  oldest, then by namespace/name; else, outside the cluster networks, the
  *egress fallback*; else not found;
* **what policy** that target has (``state``): the parent (Service or
  EgressNetwork and port), the port's protocol (``appProtocol``, else opaque
  by ``config.linkerd.io/opaque-ports`` of the Service, else of its namespace,
  else the defaults), the parent's annotations (``Settings``), and its
  HTTPRoutes (both groups), GRPCRoutes, TLSRoutes and TCPRoutes whose status
  says that parent accepted them (read back, as Linkerd's index does), each
  resolved: backends checked against the Services and EgressNetworks that
  exist, rule timeouts and retries (HTTP and gRPC only) with the route's and
  then the parent's annotations filled in.  Which route kind the proxy gets is
  the translator's choice (Linkerd's precedence); the state keeps them all.

Producer and consumer routes: a route in the parent's namespace applies to
clients of every namespace; a route in another namespace applies only to
clients of that namespace.  That is why a Service target is keyed by the
client's namespace too.  Routes are ordered by creation time, then name.

Each target that has subscribers is one ``_Watch``: its state is computed once
per change and handed to its listeners only when it differs (so a relist that
changes nothing sends nothing).  Changes are coalesced: ``apply`` only marks
what changed and asks ``schedule`` (the event loop's ``call_soon``) to run
``flush`` once, so a burst of events in one loop turn yields one update per
target.  Without ``schedule`` (pure tests) ``flush`` runs after every event.
``flush`` recomputes only the watches a change can reach (``Reach``): each
watch records what its state was computed from, and each change marks what it
touched -- a Service or EgressNetwork its own watches and those whose routes
have it as a backend (plus, for a Service, the address watches on its cluster
IPs before and after); a route its parents' watches (a consumer route only
those of clients in its namespace); a Namespace the watches of its Services
(its opaque ports); an EgressNetwork also the address watches its namespace
decides (those of clients in that namespace, or every client's for the global
egress namespace, unless a Service's cluster IP takes the address first).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from tether.naming import ServiceAuthority, is_dns1123_label
from tether.platform.watch import ResourceEvent
from tether.policy.outbound import annotations as ann
from tether.policy.config import PolicyConfig
from tether.policy.outbound.facts import (
    GRPC_ROUTE_FILTERS,
    HTTP_ROUTE_FILTERS,
    EgressNetworkFacts,
    NamespaceFacts,
    Problem,
    RouteFacts,
    RuleFacts,
    ServiceFacts,
    Settings,
    facts_of,
)
from tether.ports import PortSet, parse_port_set
from tether.resources import kinds
from tether.resources.policy import Network
from tether.resources.references import ParentRef
from tether.resources.routes import BackendRef, RouteFilter

log = logging.getLogger(__name__)

# The resource types the outbound index reads, by ``ResourceType.key``.
WATCHED: tuple[str, ...] = (
    kinds.NAMESPACE.key,
    kinds.SERVICE.key,
    kinds.EGRESS_NETWORK.key,
    kinds.POLICY_HTTP_ROUTE.key,
    kinds.GATEWAY_HTTP_ROUTE.key,
    kinds.GRPC_ROUTE.key,
    kinds.TLS_ROUTE.key,
    kinds.TCP_ROUTE.key,
)
_ROUTE_TYPES = WATCHED[3:]

Key = tuple[str, str]  # (namespace, name)

ParentKind = Literal["Service", "EgressNetwork"]


# -- targets ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    """A Service port, asked for by name, seen from clients in ``source_ns``."""

    namespace: str
    name: str
    port: int
    source_ns: str


@dataclass(frozen=True, slots=True)
class AddressTarget:
    """An ``ip:port`` a client in ``source_ns`` connects to; what it resolves to is re-decided on every change."""

    ip: str
    port: int
    source_ns: str


Target = ServiceTarget | AddressTarget


class TargetNotFound(LookupError):
    """The target names nothing the index can give a policy for (gRPC NOT_FOUND)."""


class InvalidTarget(ValueError):
    """The target is malformed (gRPC INVALID_ARGUMENT)."""


# -- states: what the translator encodes -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parent:
    kind: ParentKind
    namespace: str
    name: str
    port: int
    authority: str | None = None  # Service: <svc>.<ns>.svc.<cd>:<port>, what its balancer resolves
    traffic_policy: str | None = None  # EgressNetwork: Allow or Deny


@dataclass(frozen=True, slots=True)
class ResolvedBackend:
    """A backendRef checked against the index: ``message`` set means it is invalid (the proxy fails its requests)."""

    kind: str  # Service, EgressNetwork, or the unsupported kind named
    namespace: str
    name: str
    port: int | None
    weight: int
    filters: tuple[RouteFilter, ...] = ()
    authority: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedRule:
    matches: tuple
    filters: tuple[RouteFilter, ...]
    backends: tuple[ResolvedBackend, ...]
    timeouts: ann.Timeouts
    retry: ann.Retry | None


@dataclass(frozen=True, slots=True)
class ResolvedRoute:
    group: str
    kind: str
    namespace: str
    name: str
    hostnames: tuple[str, ...]
    rules: tuple[ResolvedRule, ...]


@dataclass(frozen=True, slots=True)
class OutboundState:
    """The policy of a Service or EgressNetwork port, for one client namespace."""

    parent: Parent
    app_protocol: str | None  # http1, http2, opaque, unknown:<value>, or None (detect)
    settings: Settings
    http_routes: tuple[ResolvedRoute, ...] = ()
    grpc_routes: tuple[ResolvedRoute, ...] = ()
    tls_routes: tuple[ResolvedRoute, ...] = ()
    tcp_routes: tuple[ResolvedRoute, ...] = ()

    @property
    def routes(self) -> tuple[ResolvedRoute, ...]:
        return (*self.http_routes, *self.grpc_routes, *self.tls_routes, *self.tcp_routes)


@dataclass(frozen=True, slots=True)
class UndefinedPort:
    """A Service's cluster IP on a port the Service does not define: traffic is forbidden."""

    namespace: str
    name: str
    port: int


@dataclass(frozen=True, slots=True)
class EgressFallback:
    """An address outside the cluster networks that no EgressNetwork covers: forwarded as asked."""


State = OutboundState | UndefinedPort | EgressFallback
Listener = Callable[[State, "float | None"], None]


# What a change can reach, and what a watch's state was computed from (``OutboundIndex._reach_of``):
#   ("object", kind, ns, name)          a Service or EgressNetwork: the parent itself, or a route's backend
#   ("routes", kind, ns, name, None)    the routes of that parent's namespace (producer routes: every client)
#   ("routes", kind, ns, name, client)  the routes of namespace ``client`` on that parent (consumer routes)
#   ("namespace", ns)                   a Namespace's annotations (the opaque ports of its Services)
#   ("ip", ip)                          the Services whose cluster IPs include ``ip``
#   ("egress", ns)                      the EgressNetworks of ``ns``
Reach = tuple[str | None, ...]


class _Watch:
    __slots__ = ("target", "state", "listeners", "reach")

    def __init__(self, target: Target, state: State) -> None:
        self.target = target
        self.state = state
        self.reach: frozenset[Reach] = frozenset()  # kept by OutboundIndex._set_reach
        self.listeners: list[Listener] = []


# -- the index ---------------------------------------------------------------------------------------


class OutboundIndex:
    """Facts of the watched objects, target resolution, and one shared watch per subscribed target."""

    def __init__(self, config: PolicyConfig, schedule: Callable[[Callable[[], None]], object] | None = None) -> None:
        self.config = config
        self._schedule = schedule
        self.services: dict[Key, ServiceFacts] = {}
        self.egress_networks: dict[Key, EgressNetworkFacts] = {}
        self.namespaces: dict[str, NamespaceFacts] = {}
        self.routes: dict[tuple[str, str, str], RouteFacts] = {}  # (type key, namespace, name)
        self._services_by_ip: dict[str, set[Key]] = {}
        self._routes_by_parent: dict[tuple[str, str, str], set[tuple[str, str, str]]] = {}
        self._watches: dict[Target, _Watch] = {}
        self._watches_by_reach: dict[Reach, set[Target]] = {}  # the inverse of each watch's ``reach``
        self._synced: set[str] = set()
        self._pending_at: float | None = None
        self._flush_scheduled = False
        self._marks: set[Reach] = set()  # what the changes since the last flush reach
        self.updates = 0  # watched policies recomputed to a new value

    # -- feeding -------------------------------------------------------------------------------------

    def apply(self, type_key: str, event: ResourceEvent) -> None:
        """Apply one platform event for resource type ``type_key``; watches hear of it at the next ``flush``."""
        if event.type == "SYNCED":
            self._synced.add(type_key)
            return
        if type_key not in WATCHED:
            raise ValueError(f"the outbound index does not watch {type_key}")
        namespace, name = event.key
        facts = None if event.type == "DELETED" or event.object is None else facts_of(event.object)
        self._store(type_key, namespace, name, facts)
        self._changed(event.received_at)

    def delete(self, type_key: str, namespace: str, name: str, at: float | None = None) -> None:
        """Forget one object (what a ``DELETED`` event does)."""
        self._store(type_key, namespace, name, None)
        self._changed(at)

    @property
    def synced(self) -> bool:
        return all(key in self._synced for key in WATCHED)

    def _store(self, type_key: str, namespace: str, name: str, facts: object | None) -> None:
        """Replace one object's facts, keep the lookups in step, and mark what the change can reach."""
        marks = self._marks
        if type_key == kinds.SERVICE.key:
            marks.add(("object", "Service", namespace, name))
            old = self.services.pop((namespace, name), None)
            if old is not None:
                for ip in old.cluster_ips:
                    _discard(self._services_by_ip, ip, (namespace, name))
                    marks.add(("ip", ip))
            if isinstance(facts, ServiceFacts):
                self.services[(namespace, name)] = facts
                for ip in facts.cluster_ips:
                    self._services_by_ip.setdefault(ip, set()).add((namespace, name))
                    marks.add(("ip", ip))
        elif type_key == kinds.EGRESS_NETWORK.key:
            marks.update((("object", "EgressNetwork", namespace, name), ("egress", namespace)))
            self.egress_networks.pop((namespace, name), None)
            if isinstance(facts, EgressNetworkFacts):
                self.egress_networks[(namespace, name)] = facts
        elif type_key == kinds.NAMESPACE.key:
            marks.add(("namespace", name))
            self.namespaces.pop(name, None)
            if isinstance(facts, NamespaceFacts):
                self.namespaces[name] = facts
        elif type_key in _ROUTE_TYPES:
            key = (type_key, namespace, name)
            old_route = self.routes.pop(key, None)
            if old_route is not None:
                for parent in _parent_keys(old_route):
                    _discard(self._routes_by_parent, parent, key)
                    marks.add(_routes_mark(parent, namespace))
            if isinstance(facts, RouteFacts):
                self.routes[key] = facts
                for parent in _parent_keys(facts):
                    self._routes_by_parent.setdefault(parent, set()).add(key)
                    marks.add(_routes_mark(parent, namespace))

    def _changed(self, at: float | None) -> None:
        if at is not None and (self._pending_at is None or at < self._pending_at):
            self._pending_at = at
        if not self._watches:
            self._pending_at = None
            self._marks.clear()
            return
        if self._schedule is None:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._schedule(self.flush)

    def flush(self) -> None:
        """Recompute each watched target the changes reach, once; tell listeners of those that changed."""
        self._flush_scheduled = False
        at, self._pending_at = self._pending_at, None
        marks, self._marks = self._marks, set()
        reached: set[Target] = set()
        for mark in marks:
            reached.update(self._watches_by_reach.get(mark, ()))
        for target in reached:
            watch = self._watches.get(target)
            if watch is None:  # a listener of this flush unsubscribed its last listener
                continue
            try:
                state = self._resolve(target)
            except TargetNotFound:
                # The address no longer resolves (its Service went away inside the cluster networks):
                # clients keep the last policy, as Linkerd's watches keep theirs; what may resolve it again
                # (an EgressNetwork now) still reaches the watch.
                self._set_reach(watch, self._reach_of(target, watch.state))
                continue
            if state == watch.state:
                if isinstance(target, AddressTarget):  # the same policy, maybe no longer by a cluster IP
                    self._set_reach(watch, self._reach_of(target, state))
                continue
            self._set_reach(watch, self._reach_of(target, state))
            watch.state = state
            self.updates += 1
            for listener in list(watch.listeners):
                listener(state, at)

    def _set_reach(self, watch: _Watch, reach: frozenset[Reach]) -> None:
        if reach == watch.reach:
            return
        for mark in watch.reach - reach:
            _discard(self._watches_by_reach, mark, watch.target)
        for mark in reach - watch.reach:
            self._watches_by_reach.setdefault(mark, set()).add(watch.target)
        watch.reach = reach

    def _reach_of(self, target: Target, state: State) -> frozenset[Reach]:
        """What a watch's state was computed from (see ``Reach``): the changes that can alter it."""
        out: set[Reach] = set()
        if isinstance(target, AddressTarget):
            out.add(("ip", target.ip))
            if target.ip not in self._services_by_ip:  # else a Service's cluster IP decides, before any network
                out.add(("egress", target.source_ns))
                if not any(ns == target.source_ns for ns, _ in self.egress_networks):
                    out.add(("egress", self.config.global_egress_network_namespace))
        if isinstance(state, OutboundState):
            parent = state.parent
            out.update((("object", parent.kind, parent.namespace, parent.name),
                        ("routes", parent.kind, parent.namespace, parent.name, None),
                        ("routes", parent.kind, parent.namespace, parent.name, target.source_ns)))
            if parent.kind == "Service":
                out.add(("namespace", parent.namespace))
            for route in state.routes:
                out.update(("object", b.kind, b.namespace, b.name) for rule in route.rules for b in rule.backends)
        elif isinstance(state, UndefinedPort):
            out.add(("object", "Service", state.namespace, state.name))
        return frozenset(out)

    # -- subscriptions ------------------------------------------------------------------------------

    def subscribe(self, target: Target, listener: Listener) -> State:
        """Add ``listener`` to ``target``'s watch (made on first use); return the current state.

        Raises ``TargetNotFound`` for an address nothing covers.
        """
        watch = self._watches.get(target)
        if watch is None:
            state = self._resolve(target)
            watch = self._watches[target] = _Watch(target, state)
            self._set_reach(watch, self._reach_of(target, state))
        watch.listeners.append(listener)
        return watch.state

    def unsubscribe(self, target: Target, listener: Listener) -> None:
        watch = self._watches.get(target)
        if watch is None:
            return
        try:
            watch.listeners.remove(listener)
        except ValueError:
            return
        if not watch.listeners:
            self._set_reach(watch, frozenset())
            del self._watches[target]

    @property
    def watched_targets(self) -> int:
        return len(self._watches)

    def state(self, target: Target) -> State:
        """The current policy of ``target`` (for ``Get``); ``TargetNotFound`` as ``subscribe``."""
        watch = self._watches.get(target)
        return watch.state if watch is not None else self._resolve(target)

    def sizes(self) -> dict[str, int]:
        return {
            "service": len(self.services),
            "egress_network": len(self.egress_networks),
            "route": len(self.routes),
            "namespace": len(self.namespaces),
            "watch": len(self._watches),
        }

    def problems(self) -> list[Problem]:
        """Everything the index cannot use now, by object: dropped annotations, ignored routes, dangling references."""
        out: list[Problem] = []
        for svc in self.services.values():
            out.extend(svc.problems)
        for net in self.egress_networks.values():
            out.extend(net.problems)
        for route in self.routes.values():
            if route.problem is not None:
                out.append(route.problem)
                continue
            out.extend(route.warnings)
            out.extend(self._dangling(route))
        return out

    def _dangling(self, route: RouteFacts) -> Iterable[Problem]:
        """A route's parents and backends that name nothing: they grant nothing (reported, never fatal)."""
        def problem(reason: str, message: str) -> Problem:
            return Problem(route.kind, route.namespace, route.name, reason, message)

        for ref in route.parents:
            ns = ref.namespace or route.namespace
            if ref.targets(kinds.SERVICE) and (ns, ref.name) not in self.services:
                yield problem("parent_not_found", f"parentRefs: Service {ns}/{ref.name} does not exist")
            elif ref.targets(kinds.EGRESS_NETWORK) and (ns, ref.name) not in self.egress_networks:
                yield problem("parent_not_found", f"parentRefs: EgressNetwork {ns}/{ref.name} does not exist")
        for i, rule in enumerate(route.rules):
            for backend in rule.backends:
                ns = backend.namespace or route.namespace
                if backend.targets(kinds.SERVICE) and (ns, backend.name) not in self.services:
                    yield problem("backend_not_found", f"spec.rules[{i}].backendRefs: Service {ns}/{backend.name} "
                                                       "does not exist")
                elif backend.targets(kinds.EGRESS_NETWORK) and (ns, backend.name) not in self.egress_networks:
                    yield problem("backend_not_found", f"spec.rules[{i}].backendRefs: EgressNetwork "
                                                       f"{ns}/{backend.name} does not exist")

    # -- target resolution ---------------------------------------------------------------------------

    def service_target(self, authority: str, source_ns: str) -> ServiceTarget:
        """``<svc>.<ns>.svc[.<cluster-domain>][:port]`` -> that Service port (80 by default); other names: not found."""
        host, sep, port_text = authority.rpartition(":")
        if not sep:
            host, port_text = authority, "80"
        if not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
            raise InvalidTarget(f"invalid authority {authority!r}: bad port")
        if not host:
            raise InvalidTarget("authority must have a host")
        host = host.rstrip(".")
        host = host.removesuffix(f".{self.config.cluster_domain}")
        parts = host.split(".")
        if len(parts) != 3 or parts[2] != "svc" or not all(is_dns1123_label(p) for p in parts[:2]):
            raise TargetNotFound(
                f"authority must be of the form <name>.<namespace>.svc.{self.config.cluster_domain}"
            )
        return ServiceTarget(parts[1], parts[0], int(port_text), source_ns)

    def address_target(self, ip: str, port: int, source_ns: str) -> AddressTarget:
        if not 0 < port < 65536:
            raise InvalidTarget("port outside valid range" if port else "port cannot be zero")
        target = AddressTarget(str(ipaddress.ip_address(ip)), port, source_ns)
        self._resolve(target)  # raises TargetNotFound
        return target

    def _resolve(self, target: Target) -> State:
        if isinstance(target, ServiceTarget):
            return self._service_state(target.namespace, target.name, target.port, target.source_ns)
        services = sorted(self._services_by_ip.get(target.ip, ()))
        if services:
            ns, name = services[0]
            if len(services) > 1:
                log.warning("cluster IP %s belongs to several Services (%s); using %s/%s",
                            target.ip, ", ".join(f"{n}/{s}" for n, s in services), ns, name)
            if target.port not in self.services[(ns, name)].ports:
                return UndefinedPort(ns, name, target.port)
            return self._service_state(ns, name, target.port, target.source_ns)
        address = ipaddress.ip_address(target.ip)
        network = self._egress_network_for(address, target.source_ns)
        if network is not None:
            return self._egress_state(network, target.port, target.source_ns)
        if not any(network.contains(address) for network in self.config.cluster_networks):
            return EgressFallback()
        raise TargetNotFound(f"no Service or EgressNetwork covers {target.ip}:{target.port}")

    def _egress_network_for(
        self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, source_ns: str
    ) -> EgressNetworkFacts | None:
        own = [n for n in self.egress_networks.values() if n.namespace == source_ns]
        candidates = own or [
            n for n in self.egress_networks.values() if n.namespace == self.config.global_egress_network_namespace
        ]
        best: tuple[tuple, EgressNetworkFacts] | None = None
        for net in candidates:
            sizes = [n.cidr.num_addresses for n in self._networks_of(net) if n.contains(address)]
            if not sizes:
                continue
            # Most specific match, then oldest (no timestamp sorts first, as Linkerd's Option does), then name.
            rank = (min(sizes), net.created is not None, net.created, net.namespace, net.name)
            if best is None or rank < best[0]:
                best = (rank, net)
        return best[1] if best is not None else None

    def _networks_of(self, net: EgressNetworkFacts) -> tuple[Network, ...]:
        if net.networks is not None:
            return net.networks
        v4 = tuple(n.cidr for n in self.config.cluster_networks if n.cidr.version == 4)
        v6 = tuple(n.cidr for n in self.config.cluster_networks if n.cidr.version == 6)
        return (
            Network(ipaddress.ip_network("0.0.0.0/0"), v4),
            Network(ipaddress.ip_network("::/0"), v6),
        )

    # -- policy computation ----------------------------------------------------------------------------

    def _service_state(self, ns: str, name: str, port: int, source_ns: str) -> OutboundState:
        service = self.services.get((ns, name))
        authority = str(ServiceAuthority(name, ns, port, self.config.cluster_domain))
        parent = Parent("Service", ns, name, port, authority=authority)
        if service is None:
            # Linkerd serves a named Service port before (or without) the Service: the plain default policy.
            protocol = "opaque" if port in self.config.default_opaque_ports else None
            return self._with_routes(OutboundState(parent, protocol, Settings()), source_ns)
        protocol = service.app_protocols.get(port)
        if protocol is None and port in self._service_opaque_ports(service):
            protocol = "opaque"
        return self._with_routes(OutboundState(parent, protocol, service.settings), source_ns)

    def _service_opaque_ports(self, service: ServiceFacts) -> PortSet:
        if service.opaque_ports is not None:
            return service.opaque_ports
        namespace = self.namespaces.get(service.namespace)
        if namespace is not None and namespace.opaque_ports_annotation is not None:
            return parse_port_set(namespace.opaque_ports_annotation, dict(service.port_names))[0]
        return self.config.default_opaque_ports

    def _egress_state(self, net: EgressNetworkFacts, port: int, source_ns: str) -> OutboundState:
        parent = Parent("EgressNetwork", net.namespace, net.name, port, traffic_policy=net.traffic_policy)
        opaque = net.opaque_ports if net.opaque_ports is not None else self.config.default_opaque_ports
        return self._with_routes(OutboundState(parent, "opaque" if port in opaque else None, net.settings),
                                 source_ns)

    def _with_routes(self, state: OutboundState, source_ns: str) -> OutboundState:
        parent = state.parent
        # Both HTTPRoute groups share the kind name, and one list.
        by_kind: dict[str, list[RouteFacts]] = {"HTTPRoute": [], "GRPCRoute": [], "TLSRoute": [], "TCPRoute": []}
        for key in self._routes_by_parent.get((parent.kind, parent.namespace, parent.name), ()):
            route = self.routes[key]
            if route.problem is not None:
                continue
            # Producer routes (the parent's namespace) apply to everyone; consumer routes to their namespace only.
            if route.namespace not in (parent.namespace, source_ns):
                continue
            # Named as a parent, and accepted there by the status (read back, as Linkerd's index does).
            if not any(_attaches(ref, route.namespace, parent)
                       and route.accepted_by(ref, parent.kind, parent.name, parent.port) for ref in route.parents):
                continue
            by_kind[route.kind].append(route)
        if not any(by_kind.values()):
            return state
        resolved = {kind: tuple(self._resolve_route(r, state) for r in sorted(routes, key=RouteFacts.order_key))
                    for kind, routes in by_kind.items()}
        return replace(state, http_routes=resolved["HTTPRoute"], grpc_routes=resolved["GRPCRoute"],
                       tls_routes=resolved["TLSRoute"], tcp_routes=resolved["TCPRoute"])

    def _resolve_route(self, route: RouteFacts, state: OutboundState) -> ResolvedRoute:
        settings = state.settings
        if route.is_stream:
            # Connections: no timeouts, retries or filters (Linkerd reads no annotations on these routes).
            return ResolvedRoute(route.group, route.kind, route.namespace, route.name, route.hostnames, tuple(
                ResolvedRule((), (), tuple(self._backend(b, route.namespace, ()) for b in rule.backends),
                             ann.Timeouts(), None)
                for rule in route.rules))
        parent_retry = settings.grpc_retry if route.is_grpc else settings.http_retry
        allowed = GRPC_ROUTE_FILTERS if route.is_grpc else HTTP_ROUTE_FILTERS
        return ResolvedRoute(
            group=route.group,
            kind=route.kind,
            namespace=route.namespace,
            name=route.name,
            hostnames=route.hostnames,
            rules=tuple(
                _resolve_rule(rule, route, settings.timeouts, parent_retry,
                              tuple(self._backend(b, route.namespace, allowed) for b in rule.backends))
                for rule in route.rules
            ),
        )

    def _backend(self, ref: BackendRef, route_ns: str, allowed: tuple[str, ...]) -> ResolvedBackend:
        ns = ref.namespace or route_ns
        unsupported = next((f.type for f in ref.filters if f.type not in allowed), None)
        base = ResolvedBackend(ref.kind, ns, ref.name, ref.port, ref.weight)
        if unsupported is not None:
            return replace(base, message=f"unsupported backend filter: {unsupported}")
        filters = tuple(ref.filters)
        if ref.targets(kinds.SERVICE):
            assert ref.port is not None  # the route model requires it
            if (ns, ref.name) not in self.services:
                return replace(base, kind="Service", filters=filters, message=f"Service not found {ref.name}")
            authority = str(ServiceAuthority(ref.name, ns, ref.port, self.config.cluster_domain))
            return replace(base, kind="Service", filters=filters, authority=authority)
        if ref.targets(kinds.EGRESS_NETWORK):
            if (ns, ref.name) not in self.egress_networks:
                return replace(base, kind="EgressNetwork", filters=filters,
                               message=f"EgressNetwork not found {ref.name}")
            return replace(base, kind="EgressNetwork", filters=filters)
        group = ref.group or "core"
        return replace(base, message=f"unsupported backend type {group} {ref.kind}")


def _resolve_rule(
    rule: RuleFacts,
    route: RouteFacts,
    parent_timeouts: ann.Timeouts,
    parent_retry: ann.Retry | None,
    backends: tuple[ResolvedBackend, ...],
) -> ResolvedRule:
    """A rule's timeouts and retry: the route's annotations, its ``timeouts``, else the parent's annotations."""
    timeouts = route.timeouts
    retry = route.retry if route.retry is not None else parent_retry
    if rule.timeouts is not None:
        if timeouts.request is None and rule.timeouts.request:  # 0 means no timeout (GEP-1742)
            timeouts = replace(timeouts, request=rule.timeouts.request)
        backend = rule.timeouts.backend_request
        if backend:
            # Gateway API's backendRequest bounds each attempt: the retry timeout when the rule retries,
            # else (one attempt) the request itself.
            if retry is not None:
                if retry.timeout is None:
                    retry = replace(retry, timeout=backend)
            elif timeouts.request is None or backend < timeouts.request:
                timeouts = replace(timeouts, request=backend)
    if timeouts == ann.Timeouts():
        timeouts = parent_timeouts
    return ResolvedRule(rule.matches, rule.filters, backends, timeouts, retry)


def _attaches(ref: ParentRef, route_ns: str, parent: Parent) -> bool:
    kind = kinds.SERVICE if parent.kind == "Service" else kinds.EGRESS_NETWORK
    return (
        ref.targets(kind)
        and ref.name == parent.name
        and (ref.namespace or route_ns) == parent.namespace
        and (ref.port is None or ref.port == parent.port)
    )


def _parent_keys(route: RouteFacts) -> Iterable[tuple[str, str, str]]:
    for ref in route.parents:
        ns = ref.namespace or route.namespace
        if ref.targets(kinds.SERVICE):
            yield ("Service", ns, ref.name)
        elif ref.targets(kinds.EGRESS_NETWORK):
            yield ("EgressNetwork", ns, ref.name)


def _routes_mark(parent: tuple[str, str, str], route_ns: str) -> Reach:
    """What a route of ``route_ns`` on ``parent`` reaches: every client's watch of the parent when it is a
    producer route (the parent's namespace), else only the watches of clients in ``route_ns``."""
    kind, ns, name = parent
    return ("routes", kind, ns, name, None if route_ns == ns else route_ns)


def _discard(index: dict, key: object, value: object) -> None:
    values = index.get(key)
    if values is not None:
        values.discard(value)
        if not values:
            del index[key]
