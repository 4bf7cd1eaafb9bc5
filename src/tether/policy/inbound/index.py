"""The inbound index: pods, Servers and the authorization resources -> the policy of each watched pod port.

Fed by ``tether.policy.service`` with every platform event (``apply``); read by
the ``InboundServerPolicies`` handlers (``subscribe``/``lookup``), the status
controller (``route_parent_status``, ``ratelimit_winner``, ``problems``) and
``tether authz``/``diagnostics policy`` (``lookup``).

Linkerd's semantics (control-plane.md §5.4), computed from facts on demand:

* Servers in the pod's namespace are taken oldest first (then by name); the
  first whose ``podSelector`` matches the pod and whose ``port`` (a number, or a
  name meaning every container port so named) matches wins; later matching
  Servers are conflicts, ignored and reported.  An ExternalWorkload (a VM's
  proxy asks as ``{"ns":…,"external_workload":…}``) is decided the same way,
  by the Servers' ``externalWorkloadSelector`` and its named ``spec.ports``.
* A port no Server selects gets the default server: the pod's
  ``config.linkerd.io/default-inbound-policy`` (else its namespace's, else the
  cluster default), made authenticated on the pod's require-identity ports;
  opaque when the port is in the pod's opaque ports, else detect.
* HTTP routes: those whose parent is the Server and whose status says this
  controller accepted them there (the status controller's rule, the Server
  exists, decides that status; the index reads it back, as Linkerd's does, so
  a route counts once its status is written), with the AuthorizationPolicies
  that target them; without any, the default
  catch-all route plus, when the probe networks are not empty and the port has
  HTTP probes, the ``probe`` route authorizing GET on the probe paths.
* Rate limit: the oldest HTTPLocalRateLimitPolicy on the Server whose status
  says ``Accepted`` (read back as routes are).
* An AuthorizationPolicy referring to an authentication that does not exist is
  skipped (it grants nothing) and reported by ``problems``.

Changes are coalesced: ``apply`` only records facts and marks what a change
can reach (``_mark``: a pod's ports, the ports of the Servers an object names,
before and after the change; a MeshTLSAuthentication or NetworkAuthentication
reaches what the AuthorizationPolicies naming it target, wherever they live);
one flush per event-loop turn recomputes those watched ports and tells their
listeners only when the policy changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tether.platform.watch import ResourceEvent
from tether.policy.config import PolicyConfig
from tether.policy.defaults import DefaultPolicy, UnknownPolicy
from tether.policy.inbound.facts import (
    DEFAULT_INBOUND_POLICY,
    OPAQUE_PORTS,
    REQUIRE_IDENTITY_PORTS,
    Named,
    PodFacts,
    external_workload_facts,
    identity_matches,
    named,
    pod_facts,
    port_set,
)
from tether.policy.model import (
    ALL_NETWORKS,
    DEFAULT_GRPC_ROUTE,
    DEFAULT_HTTP_ROUTE,
    PROXY_PROTOCOLS,
    AuthnKind,
    ClientAuthz,
    GrpcRule,
    HttpRule,
    IdentityMatch,
    InboundRoute,
    InboundServer,
    Protocol,
    RateLimit,
    RateLimitOverride,
    Ref,
)
from tether.ports import PortSet
from tether.resources import kinds
from tether.resources.errors import ValidationError
from tether.resources.model import parse
from tether.resources.policy import (
    AuthorizationPolicySpec,
    HTTPLocalRateLimitPolicySpec,
    Network,
    ServerAuthorizationSpec,
    ServerSpec,
)
from tether.resources.routes import GRPCRouteSpec, HTTPRouteMatch, HTTPRouteSpec, PathMatch

log = logging.getLogger(__name__)

POLICY_GROUP = "policy.linkerd.io"
# Every type the inbound index reads, in the order they are listed at start.
WATCHED = (
    kinds.NAMESPACE.key,
    kinds.POD.key,
    kinds.EXTERNAL_WORKLOAD.key,
    kinds.SERVER.key,
    kinds.SERVER_AUTHORIZATION.key,
    kinds.AUTHORIZATION_POLICY.key,
    kinds.MESH_TLS_AUTHENTICATION.key,
    kinds.NETWORK_AUTHENTICATION.key,
    kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key,
    kinds.POLICY_HTTP_ROUTE.key,
    kinds.GATEWAY_HTTP_ROUTE.key,
    kinds.GRPC_ROUTE.key,
    kinds.TLS_ROUTE.key,
    kinds.TCP_ROUTE.key,
)
# Namespaced policy kinds kept as ``Named`` facts, per namespace.
_POLICY_KINDS = WATCHED[3:]
# Kept only for the status controller, which reads every route from here: no inbound policy has these routes.
_STATUS_ONLY_KINDS = (kinds.TLS_ROUTE.key, kinds.TCP_ROUTE.key)
_AUTHN_KINDS = (kinds.MESH_TLS_AUTHENTICATION.key, kinds.NETWORK_AUTHENTICATION.key)
_ROUTE_KINDS = (kinds.POLICY_HTTP_ROUTE.key, kinds.GATEWAY_HTTP_ROUTE.key, kinds.GRPC_ROUTE.key)
# Route filters the proxy's inbound side applies (others make the route unusable inbound).
_INBOUND_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect")

Listener = Callable[[InboundServer | None, float | None], None]


class UnknownPod(LookupError):
    """No meshed pod (or ExternalWorkload) of that name in that namespace."""


def _unknown(namespace: str, name: str, external: bool) -> UnknownPod:
    what = "external workload" if external else "meshed pod"
    return UnknownPod(f"unknown server: no {what} {namespace}/{name}")


@dataclass(frozen=True, slots=True)
class Problem:
    """Something the index ignored: a conflicting Server, a dangling reference, an unusable route."""

    namespace: str
    kind: str
    name: str
    reason: str
    message: str


@dataclass(slots=True)
class _PortWatch:
    listeners: list[Listener] = field(default_factory=list)
    current: InboundServer | None = None

    @property
    def server(self) -> str | None:
        """The Server that decided the current policy; None for a default server (or none)."""
        ref = None if self.current is None else self.current.ref
        return ref.name if ref is not None and ref.kind == "server" and ref.group == POLICY_GROUP else None


@dataclass(slots=True)
class _Reach:
    """Which watched ports of one namespace the changes of a flush can reach (the others keep their answer)."""

    everything: bool = False  # a Namespace's annotations: every port
    explicit: bool = False  # a Namespace-wide AuthorizationPolicy: every port a Server decides
    servers: set[str] = field(default_factory=set)  # the ports these Servers decide, or may come to decide
    workloads: set[tuple[str, bool]] = field(default_factory=set)  # every port of these (name, external)


def _type(type_key: str) -> kinds.ResourceType:
    return next(t for t in kinds.REGISTRY if t.key == type_key)


class InboundIndex:
    def __init__(self, config: PolicyConfig, *, on_change: Callable[[], None] | None = None) -> None:
        self.config = config
        self.pods: dict[tuple[str, str], PodFacts] = {}
        self.external_workloads: dict[tuple[str, str], PodFacts] = {}  # VMs' proxies ask as these
        self.namespaces: dict[str, dict[str, str]] = {}  # name -> its inherited annotations
        # type key -> namespace -> name -> facts
        self.objects: dict[str, dict[str, dict[str, Named]]] = {key: {} for key in _POLICY_KINDS}
        self._watches: dict[tuple[str, str, int, bool], _PortWatch] = {}  # (ns, name, port, external)
        self._dirty: dict[str, _Reach] = {}  # namespace -> what its changes reach
        self._latest: float | None = None
        self._flush_scheduled = False
        self._synced: set[str] = set()
        self._on_change = on_change
        # What a flush decided once and every port of that flush reuses (see ``_memo``); None outside a flush.
        self._flush_memo: dict[tuple[Any, ...], Any] | None = None
        self.updates = 0  # port policies recomputed to something new (a metric)

    # -- feeding -------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.issuperset(WATCHED)

    def apply(self, type_key: str, event: ResourceEvent) -> None:
        if event.type == "SYNCED":
            self._synced.add(type_key)
            return
        assert event.object is not None
        ns, name = event.key
        ns = ns or "default"
        before = self.objects[type_key].get(ns, {}).get(name) if type_key in self.objects else None
        if type_key == kinds.NAMESPACE.key:
            ns = name
            if event.type == "DELETED":
                self.namespaces.pop(name, None)
            else:
                annotations = (event.object.get("metadata") or {}).get("annotations") or {}
                self.namespaces[name] = {k: v for k, v in annotations.items()
                                         if k in (DEFAULT_INBOUND_POLICY, OPAQUE_PORTS, REQUIRE_IDENTITY_PORTS)}
        elif event.type == "DELETED":
            if type_key == kinds.POD.key:
                self.pods.pop((ns, name), None)
            elif type_key == kinds.EXTERNAL_WORKLOAD.key:
                self.external_workloads.pop((ns, name), None)
            else:
                self.objects[type_key].get(ns, {}).pop(name, None)
        else:
            resource = self._parse(event.object)
            if resource is None:
                return
            if type_key == kinds.POD.key:
                facts = pod_facts(resource)
                if facts is None:
                    self.pods.pop((ns, name), None)
                else:
                    self.pods[(ns, name)] = facts
            elif type_key == kinds.EXTERNAL_WORKLOAD.key:
                self.external_workloads[(ns, name)] = external_workload_facts(resource)
            else:
                self.objects[type_key].setdefault(ns, {})[name] = named(resource)
        if type_key in _STATUS_ONLY_KINDS:
            return  # no port's policy depends on them
        self._mark(type_key, ns, name, before, event.received_at)
        self._schedule()

    def _mark(self, type_key: str, ns: str, name: str, before: Named | None, at: float) -> None:
        """Mark for the next flush the watched ports whose answer this change can alter (``_Reach``), rather
        than every port of the namespace: a Server's change re-decides the ports it decided or now selects, a
        policy's or route's those of the Servers it names (before and after the change), a pod's only its
        own.  That is the only rule for what a flush skips; the decision itself stays ``compute``."""
        if type_key == kinds.NAMESPACE.key:
            self._reach(ns, at).everything = True
        elif type_key in (kinds.POD.key, kinds.EXTERNAL_WORKLOAD.key):
            self._reach(ns, at).workloads.add((name, type_key == kinds.EXTERNAL_WORKLOAD.key))
        elif type_key in _AUTHN_KINDS:
            # Only AuthorizationPolicies name an authentication, from any namespace: re-decide what they
            # target, not every watched port.
            for policy in self._referring(type_key, ns, name):
                self._reach_target(policy.namespace, policy.spec.target_ref, at)
        else:
            # What the object decided before the change and what it decides now.
            after = self.objects[type_key].get(ns, {}).get(name)
            for version in (before, after):
                if version is not None:
                    self._reach_object(type_key, version, at)

    def _referring(self, type_key: str, namespace: str, name: str) -> list[Named]:
        """The AuthorizationPolicies (of any namespace) that name the authentication ``namespace/name``."""
        rtype = _type(type_key)
        return [policy for policy_ns, policies in self.objects[kinds.AUTHORIZATION_POLICY.key].items()
                for policy in policies.values() for ref in policy.spec.required_authentication_refs
                if ref.targets(rtype) and ref.name == name and (ref.namespace or policy_ns) == namespace]

    def _reach_object(self, type_key: str, obj: Named, at: float) -> None:
        """Mark the ports whose policy one version of a namespaced policy object takes part in deciding."""
        spec = obj.spec
        if type_key == kinds.SERVER.key:
            self._reach(obj.namespace, at).servers.add(obj.name)
        elif type_key == kinds.SERVER_AUTHORIZATION.key:
            selection = spec.server
            servers = self.objects[kinds.SERVER.key].get(obj.namespace, {}).values()
            self._reach(obj.namespace, at).servers.update(
                [selection.name] if selection.name is not None else
                [s.name for s in servers if selection.selector is not None and selection.selector.matches(s.labels)])
        elif type_key == kinds.AUTHORIZATION_POLICY.key:
            self._reach_target(obj.namespace, spec.target_ref, at)
        elif type_key == kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key:
            self._reach(obj.namespace, at).servers.add(spec.target_ref.name)
        elif type_key in _ROUTE_KINDS:
            self._reach(obj.namespace, at).servers.update(self.route_server_names(obj))

    def _reach_target(self, namespace: str, target: Any, at: float) -> None:
        """Mark the ports an AuthorizationPolicy's target takes it to: a Server's, every explicit server's of a
        Namespace, or those of the Servers a targeted route names as parents."""
        if target.targets(kinds.SERVER):
            self._reach(namespace, at).servers.add(target.name)
        elif target.targets(kinds.NAMESPACE):
            self._reach(namespace, at).explicit = True
        else:
            for type_key in _ROUTE_KINDS:
                rtype = _type(type_key)
                route = self.objects[type_key].get(namespace, {}).get(target.name)
                if route is not None and (target.group, target.kind.lower()) == (rtype.group, rtype.kind.lower()):
                    self._reach(namespace, at).servers.update(self.route_server_names(route))

    def _reaches(self, reach: _Reach, namespace: str, pod: str, port: int, external: bool,
                 watch: _PortWatch) -> bool:
        """Whether a watched port's answer can change with what ``reach`` marked (see ``_Reach``)."""
        if reach.everything or (pod, external) in reach.workloads:
            return True
        server = watch.server
        if server is not None and (reach.explicit or server in reach.servers):
            return True
        # A marked Server may now take this port from the default server or from a younger Server.
        facts = self.workload(namespace, pod, external)
        servers = self.objects[kinds.SERVER.key].get(namespace, {})
        return facts is not None and any(
            port in self.server_ports(facts, servers[name]) for name in reach.servers if name in servers)

    @staticmethod
    def _parse(obj: Any) -> Any:
        # A watch may deliver what the API server accepted but our model refuses: skip it, as
        # Linkerd's "guarded" watches do, and keep the index serving.
        try:
            return parse(obj)
        except ValidationError as exc:
            log.warning("ignoring an object that does not parse: %s", exc)
            return None

    def _reach(self, namespace: str, at: float) -> _Reach:
        """The namespace's marks for the next flush."""
        reach = self._dirty.get(namespace)
        if reach is None:
            reach = self._dirty[namespace] = _Reach()
        self._latest = at if self._latest is None else min(self._latest, at)
        return reach

    def _schedule(self) -> None:
        if self._flush_scheduled or not self._dirty:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()  # no loop (a synchronous caller): flush at once
            return
        self._flush_scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Recompute the watched ports the marked changes reach; tell listeners what changed."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, {}
        at, self._latest = self._latest, None
        if not dirty:
            return
        self._flush_memo = {}
        try:
            for (ns, pod, port, external), watch in list(self._watches.items()):
                reach = dirty.get(ns)
                if reach is None or not self._reaches(reach, ns, pod, port, external, watch):
                    continue
                facts = self.workload(ns, pod, external)
                server = None if facts is None else self.compute(facts, port)
                if server is watch.current or server == watch.current:
                    continue
                watch.current = server
                self.updates += 1
                for listener in list(watch.listeners):
                    listener(server, at)
        finally:
            self._flush_memo = None
        if self._on_change is not None:
            self._on_change()

    # -- subscriptions --------------------------------------------------------------------------------

    def workload(self, namespace: str, name: str, external: bool = False) -> PodFacts | None:
        """A meshed pod's facts, or with ``external`` an ExternalWorkload's; None if there is none."""
        return (self.external_workloads if external else self.pods).get((namespace, name))

    def subscribe(self, namespace: str, pod: str, port: int, listener: Listener, *, external: bool = False) -> None:
        """Call ``listener`` with the port's policy now and whenever it changes; ``UnknownPod`` if none."""
        facts = self.workload(namespace, pod, external)
        if facts is None:
            raise _unknown(namespace, pod, external)
        key = (namespace, pod, port, external)
        watch = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = _PortWatch(current=self.compute(facts, port))
        watch.listeners.append(listener)
        listener(watch.current, None)

    def unsubscribe(self, namespace: str, pod: str, port: int, listener: Listener, *, external: bool = False) -> None:
        key = (namespace, pod, port, external)
        watch = self._watches.get(key)
        if watch is None:
            return
        try:
            watch.listeners.remove(listener)
        except ValueError:
            pass
        if not watch.listeners:
            del self._watches[key]

    @property
    def watched_ports(self) -> int:
        return len(self._watches)

    def lookup(self, namespace: str, pod: str, port: int, *, external: bool = False) -> InboundServer:
        """The port's policy now (``GetPort``, diagnostics); ``UnknownPod`` if there is no such workload."""
        facts = self.workload(namespace, pod, external)
        if facts is None:
            raise _unknown(namespace, pod, external)
        return self.compute(facts, port)

    def sizes(self) -> dict[str, int]:
        out = {"pod": len(self.pods), "externalworkload": len(self.external_workloads)}
        for key in _POLICY_KINDS:
            out[_type(key).kind.lower()] = sum(len(v) for v in self.objects[key].values())
        return out

    # -- the rules ------------------------------------------------------------------------------------

    def _memo(self, key: tuple[Any, ...], decide: Callable[[], Any]) -> Any:
        """``decide()``, once per flush for ``key``: every port a flush recomputes sees the same objects, so
        a namespace's sorted objects, an AuthorizationPolicy's resolved authorization and a Server's whole
        policy (shared by every pod it selects) are decided once per change, not once per port."""
        memo = self._flush_memo
        if memo is None:
            return decide()
        try:
            return memo[key]
        except KeyError:
            value = memo[key] = decide()
            return value

    def _in(self, type_key: str, namespace: str) -> list[Named]:
        """The namespace's objects of a kind, in Linkerd's precedence (oldest, then by name)."""
        return self._memo(("in", type_key, namespace), lambda: sorted(
            self.objects[type_key].get(namespace, {}).values(), key=lambda n: n.order))

    def _annotation(self, pod: PodFacts, key: str) -> str | None:
        value = pod.annotations.get(key)
        return value if value is not None else self.namespaces.get(pod.namespace, {}).get(key)

    def server_ports(self, pod: PodFacts, server: Named) -> tuple[int, ...]:
        spec: ServerSpec = server.spec
        selector = spec.external_workload_selector if pod.external else spec.pod_selector
        if selector is None or not selector.matches(pod.labels):
            return ()
        return (spec.port,) if isinstance(spec.port, int) else pod.ports_named(spec.port)

    def select_server(self, pod: PodFacts, port: int) -> tuple[Named | None, list[Named]]:
        """The Server that wins this pod port, and the later ones that also select it (conflicts)."""
        winner, conflicts = None, []
        for server in self._in(kinds.SERVER.key, pod.namespace):
            if port in self.server_ports(pod, server):
                if winner is None:
                    winner = server
                else:
                    conflicts.append(server)
        return winner, conflicts

    def compute(self, pod: PodFacts, port: int) -> InboundServer:
        server, conflicts = self.select_server(pod, port)
        for other in conflicts:
            log.debug("Server %s/%s also selects %s:%d; %s wins (older)", other.namespace, other.name,
                      pod.name, port, server.name if server else "")
        probes = pod.probe_paths.get(port, ())
        if server is None:
            return self._default_server(pod, port, probes)
        return self._memo(("server", pod.namespace, server.name, probes),
                          lambda: self._explicit_server(pod.namespace, server, probes))

    def default_policy(self, pod: PodFacts, port: int) -> DefaultPolicy:
        policy = self.config.default_policy
        text = self._annotation(pod, DEFAULT_INBOUND_POLICY)
        if text:
            try:
                policy = DefaultPolicy.parse(text)
            except UnknownPolicy as exc:
                log.warning("pod %s/%s: %s: %s; using %s", pod.namespace, pod.name, DEFAULT_INBOUND_POLICY, exc,
                            policy.name)
        where = f"pod {pod.namespace}/{pod.name} {REQUIRE_IDENTITY_PORTS}"
        if port in port_set(self._annotation(pod, REQUIRE_IDENTITY_PORTS), pod.port_names, where):
            policy = policy.authenticated()
        return policy

    def opaque_ports(self, pod: PodFacts) -> PortSet:
        text = self._annotation(pod, OPAQUE_PORTS)
        if text is None:
            return self.config.default_opaque_ports
        return port_set(text, pod.port_names, f"pod {pod.namespace}/{pod.name} {OPAQUE_PORTS}")

    def _default_server(self, pod: PodFacts, port: int, probes: tuple[str, ...]) -> InboundServer:
        policy = self.default_policy(pod, port)
        protocol = Protocol.OPAQUE if port in self.opaque_ports(pod) else Protocol.DETECT
        return InboundServer(
            ref=Ref.default(policy.name),
            protocol=protocol,
            authorizations=policy.authorizations(self.config.cluster_networks),
            http_routes=self._default_http_routes(probes),
        )

    def _default_http_routes(self, probes: tuple[str, ...]) -> tuple[InboundRoute, ...]:
        if not probes or not self.config.probe_networks:
            return (DEFAULT_HTTP_ROUTE,)
        matches = tuple(HTTPRouteMatch(path=PathMatch("Exact", path), method="GET") for path in probes)
        probe = InboundRoute(
            Ref.default("probe"),
            http_rules=(HttpRule(matches),),
            authorizations=(ClientAuthz(Ref.default("probe"), AuthnKind.UNAUTHENTICATED, (),
                                        self.config.probe_networks),),
        )
        return (DEFAULT_HTTP_ROUTE, probe)

    def _explicit_server(self, namespace: str, server: Named, probes: tuple[str, ...]) -> InboundServer:
        spec: ServerSpec = server.spec
        http_routes = self._routes(namespace, server.name, grpc=False) or self._default_http_routes(probes)
        grpc_routes = self._routes(namespace, server.name, grpc=True) or (DEFAULT_GRPC_ROUTE,)
        return InboundServer(
            ref=Ref(POLICY_GROUP, "server", server.name),
            protocol=PROXY_PROTOCOLS[spec.proxy_protocol],
            authorizations=self.server_authorizations(namespace, server),
            http_routes=http_routes,
            grpc_routes=grpc_routes,
            ratelimit=self._ratelimit(namespace, server.name),
        )

    def server_authorizations(self, namespace: str, server: Named) -> tuple[ClientAuthz, ...]:
        out: list[ClientAuthz] = []
        for saz in self._in(kinds.SERVER_AUTHORIZATION.key, namespace):
            spec: ServerAuthorizationSpec = saz.spec
            selection = spec.server
            if selection.name is not None:
                if selection.name != server.name:
                    continue
            elif selection.selector is None or not selection.selector.matches(server.labels):
                continue
            out.append(self._saz_authz(namespace, saz))
        for policy in self._in(kinds.AUTHORIZATION_POLICY.key, namespace):
            spec_ap: AuthorizationPolicySpec = policy.spec
            target = spec_ap.target_ref
            if target.targets(kinds.SERVER):
                if target.name != server.name:
                    continue
            elif not target.targets(kinds.NAMESPACE):
                continue  # route targets are the routes' authorizations
            authz = self._policy_authz(namespace, policy)
            if authz is not None:
                out.append(authz)
        access = server.spec.access_policy
        out.extend(DefaultPolicy(access).authorizations(self.config.cluster_networks))
        return tuple(out)

    def _saz_authz(self, namespace: str, saz: Named) -> ClientAuthz:
        client = saz.spec.client
        ref = Ref(POLICY_GROUP, "serverauthorization", saz.name)
        networks = client.networks or ()  # none given: the cluster networks, filled in on the wire
        if client.unauthenticated:
            return ClientAuthz(ref, AuthnKind.UNAUTHENTICATED, (), networks)
        mesh = client.mesh_tls
        if mesh.unauthenticated_tls:
            return ClientAuthz(ref, AuthnKind.TLS_UNAUTHENTICATED, (), networks)
        identities = [IdentityMatch.parse(i) for i in mesh.identities]
        identities += [IdentityMatch(name=self.config.service_account_identity(sa.namespace or namespace, sa.name))
                       for sa in mesh.service_accounts]
        return ClientAuthz(ref, AuthnKind.TLS_AUTHENTICATED, tuple(identities), networks)

    def _policy_authz(self, namespace: str, policy: Named) -> ClientAuthz | None:
        """The authorization an AuthorizationPolicy grants, or None when a reference dangles (grants nothing)."""
        return self._memo(("authz", namespace, policy.name), lambda: self._resolve_policy(namespace, policy))

    def _resolve_policy(self, namespace: str, policy: Named) -> ClientAuthz | None:
        problem = self.policy_problem(namespace, policy)
        if problem is not None:
            log.info("ignoring AuthorizationPolicy %s/%s: %s", namespace, policy.name, problem)
            return None
        identities: tuple[IdentityMatch, ...] | None = None
        networks: tuple[Network, ...] = ALL_NETWORKS
        for ref in policy.spec.required_authentication_refs:
            ref_ns = ref.namespace or namespace
            if ref.targets(kinds.MESH_TLS_AUTHENTICATION):
                authn = self.objects[kinds.MESH_TLS_AUTHENTICATION.key][ref_ns][ref.name]
                identities = identity_matches(authn.spec, ref_ns, self.config.service_account_identity,
                                              self.config.namespace_identity)
            elif ref.targets(kinds.SERVICE_ACCOUNT):
                identities = (IdentityMatch(name=self.config.service_account_identity(ref_ns, ref.name)),)
            elif ref.targets(kinds.NETWORK_AUTHENTICATION):
                networks = self.objects[kinds.NETWORK_AUTHENTICATION.key][ref_ns][ref.name].spec.networks
        ref = Ref(POLICY_GROUP, "authorizationpolicy", policy.name)
        if identities is None:
            return ClientAuthz(ref, AuthnKind.UNAUTHENTICATED, (), networks)
        return ClientAuthz(ref, AuthnKind.TLS_AUTHENTICATED, identities, networks)

    def policy_problem(self, namespace: str, policy: Named) -> str | None:
        """Why an AuthorizationPolicy grants nothing (a missing authentication), or None."""
        for ref in policy.spec.required_authentication_refs:
            ref_ns = ref.namespace or namespace
            for rtype in (kinds.MESH_TLS_AUTHENTICATION, kinds.NETWORK_AUTHENTICATION):
                if ref.targets(rtype) and ref.name not in self.objects[rtype.key].get(ref_ns, {}):
                    return f"{rtype.kind} {ref_ns}/{ref.name} does not exist"
        return None

    # -- routes -----------------------------------------------------------------------------------------

    @staticmethod
    def route_server_names(route: Named) -> list[str]:
        """The Servers an inbound route names as parents (in its own namespace: no other can be one)."""
        return [parent.name for parent in route.spec.parent_refs
                if parent.targets(kinds.SERVER) and parent.namespace in (None, route.namespace)]

    def route_parents(self, route: Named) -> list[tuple[str, bool]]:
        """Each Server parent of an inbound route: (server name, the status controller accepts it = the Server
        exists).  Policy does not use this rule: it reads back the status written from it (``Named.accepted_by``)."""
        servers = self.objects[kinds.SERVER.key].get(route.namespace, {})
        return [(name, name in servers) for name in self.route_server_names(route)]

    def unsupported_filters(self, route: Named) -> list[str]:
        rules = route.spec.rules
        return sorted({f.type for rule in rules for f in rule.filters if f.type not in _INBOUND_FILTERS})

    def _routes(self, namespace: str, server_name: str, *, grpc: bool) -> tuple[InboundRoute, ...]:
        type_keys = (kinds.GRPC_ROUTE.key,) if grpc else (kinds.POLICY_HTTP_ROUTE.key, kinds.GATEWAY_HTTP_ROUTE.key)
        found: list[tuple[tuple[Any, ...], InboundRoute]] = []
        for type_key in type_keys:
            for route in self._in(type_key, namespace):
                # Linkerd's index: a route the Server's status accepts, not one this controller would accept.
                if server_name not in route.accepted_by or server_name not in self.route_server_names(route):
                    continue
                if self.unsupported_filters(route):
                    continue  # reported by problems(); an inbound proxy could not apply it
                rtype = _type(type_key)
                ref = Ref(rtype.group, rtype.kind, route.name)
                authz = self._route_authorizations(namespace, ref)
                if grpc:
                    spec_g: GRPCRouteSpec = route.spec
                    rules_g = tuple(GrpcRule(r.matches, r.filters) for r in spec_g.rules) or (GrpcRule(()),)
                    inbound = InboundRoute(ref, spec_g.hostnames, grpc_rules=rules_g, authorizations=authz)
                else:
                    spec_h: HTTPRouteSpec = route.spec
                    rules_h = tuple(HttpRule(r.matches, r.filters) for r in spec_h.rules)
                    inbound = InboundRoute(ref, spec_h.hostnames, http_rules=rules_h, authorizations=authz)
                found.append(((route.created, ref), inbound))
        found.sort(key=lambda pair: pair[0])
        return tuple(route for _, route in found)

    def _route_authorizations(self, namespace: str, route: Ref) -> tuple[ClientAuthz, ...]:
        out = []
        for policy in self._in(kinds.AUTHORIZATION_POLICY.key, namespace):
            target = policy.spec.target_ref
            if (target.group, target.kind.lower(), target.name) != (route.group, route.kind.lower(), route.name):
                continue
            authz = self._policy_authz(namespace, policy)
            if authz is not None:
                out.append(authz)
        return tuple(out)

    # -- rate limits ------------------------------------------------------------------------------------

    def ratelimit_winner(self, namespace: str, server_name: str) -> Named | None:
        """The oldest HTTPLocalRateLimitPolicy on a Server (the status controller's rule: a second one is
        refused in status)."""
        for policy in self._in(kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key, namespace):
            spec: HTTPLocalRateLimitPolicySpec = policy.spec
            if spec.target_ref.name == server_name:
                return policy
        return None

    def _ratelimit(self, namespace: str, server_name: str) -> RateLimit | None:
        # As Linkerd's index: the (oldest) one whose status says the Server accepted it, not the status rule's.
        policy = next((p for p in self._in(kinds.HTTP_LOCAL_RATE_LIMIT_POLICY.key, namespace)
                       if p.spec.target_ref.name == server_name and server_name in p.accepted_by), None)
        if policy is None:
            return None
        spec: HTTPLocalRateLimitPolicySpec = policy.spec
        overrides = tuple(
            RateLimitOverride(o.requests_per_second, tuple(
                self.config.service_account_identity(ref.namespace or namespace, ref.name or "")
                for ref in o.client_refs))
            for o in spec.overrides
        )
        return RateLimit(policy.name, spec.total, spec.identity, overrides)

    # -- what was ignored -------------------------------------------------------------------------------

    def problems(self) -> list[Problem]:
        """Every conflict, dangling reference and unusable route the index is ignoring now."""
        out: list[Problem] = []
        for namespace, policies in self.objects[kinds.AUTHORIZATION_POLICY.key].items():
            for policy in policies.values():
                why = self.policy_problem(namespace, policy)
                if why is not None:
                    out.append(Problem(namespace, "AuthorizationPolicy", policy.name, "MissingAuthentication", why))
                target = policy.spec.target_ref
                if target.targets(kinds.SERVER) and target.name not in self.objects[kinds.SERVER.key].get(
                        namespace, {}):
                    out.append(Problem(namespace, "AuthorizationPolicy", policy.name, "NoMatchingTarget",
                                       f"Server {namespace}/{target.name} does not exist"))
        for type_key in _ROUTE_KINDS:
            for namespace, routes in self.objects[type_key].items():
                for route in routes.values():
                    unsupported = self.unsupported_filters(route)
                    if unsupported:
                        out.append(Problem(namespace, _type(type_key).kind, route.name, "UnsupportedValue",
                                           f"filters an inbound proxy cannot apply: {', '.join(unsupported)}"))
                    for server_name, accepted in self.route_parents(route):
                        if not accepted:
                            out.append(Problem(namespace, _type(type_key).kind, route.name, "NoMatchingParent",
                                               f"Server {namespace}/{server_name} does not exist"))
        seen: set[tuple[str, str]] = set()
        for pod in (*self.pods.values(), *self.external_workloads.values()):
            for server in self._in(kinds.SERVER.key, pod.namespace):
                for port in self.server_ports(pod, server):
                    winner, conflicts = self.select_server(pod, port)
                    for other in conflicts:
                        if (other.namespace, other.name) in seen:
                            continue
                        seen.add((other.namespace, other.name))
                        out.append(Problem(other.namespace, "Server", other.name, "Conflicted",
                                           f"pod {pod.name} port {port} is already selected by Server "
                                           f"{winner.name if winner else ''}"))
        return out

    def servers_selecting(self, pod: PodFacts) -> Iterable[tuple[int, Named]]:
        """(port, Server) for every port of the pod a Server wins (``tether authz``)."""
        ports = sorted({p for server in self._in(kinds.SERVER.key, pod.namespace)
                        for p in self.server_ports(pod, server)})
        for port in ports:
            winner, _ = self.select_server(pod, port)
            if winner is not None:
                yield port, winner
