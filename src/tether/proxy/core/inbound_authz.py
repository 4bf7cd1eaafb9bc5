"""Inbound policy enforced on HTTP requests (proxy.md §8.3): the ``RequestPolicy`` of an inbound connection.

Per request, against the port's current policy (looked up again for each
request, so a policy change applies to the next request): the best route
(none: 404 ``no route``, ``inbound_http_route_not_found_total``), then the
route's authorizations (none admits the client: 403 / gRPC
``PERMISSION_DENIED``, ``inbound_http_authz_deny_total``; else
``inbound_http_authz_allow_total``). Labels are Linkerd's: ``target_*``,
``srv_*``, ``route_*``, ``authz_*``, ``tls`` and ``client_id``. A denial is
logged; so is each request the ``audit`` authorization (the ``audit`` default
policy, a Server's ``accessPolicy: audit``) allows -- it would otherwise have
been denied -- counted as allowed under ``authz_kind="default",authz_name="audit"``
as linkerd2-proxy does. Then the rule's filters (``core.route_filters``), in
order: a failure injector that fires answers 500 ``unexpected error`` (gRPC
``INTERNAL``: linkerd2-proxy's inbound has no case for it), a redirect its
3xx with ``Location`` (gRPC ``NOT_FOUND``; one that cannot be made: 500), the
invalid policy's filter 500; header modifiers become one edit of the request's
headers, which ``check`` returns for the HTTP core to apply. Then the
server's local rate limit (``core.ratelimit``): 429 / gRPC
``RESOURCE_EXHAUSTED``, ``inbound_http_local_ratelimit_total{ratelimit_scope}``.

``TcpAuthzWatch`` is the other half of §8.3 for connections authorized
once (TCP, opaque, TLS passthrough): while one is open, every change of its
port's policy re-checks it, and one no longer admitted is torn down and
counted in ``inbound_tcp_authz_terminate_total`` (``target_*``, the new
policy's ``srv_*``, ``tls``/``client_id``), as linkerd2-proxy does. An HTTP
connection switched to another protocol (101, CONNECT) is carried as bytes
from then on, so it is watched the same way (``InboundRequestPolicy.upgraded``):
re-checked as the request that switched it -- its route under the new policy
and that route's authorizations -- and torn down and counted alike.

Both take the connection's facts as one ``ConnectionFacts``.

Caller: ``core.inbound`` (one ``InboundRequestPolicy`` per HTTP connection,
one ``TcpAuthzWatch`` per forwarded connection).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tether.proxy.codec.addrs import IpAddress
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import errors
from tether.proxy.core.authz import Authorization, Meta, authorize
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.metrics import Counter, Registry
from tether.proxy.core.http import HeaderEdit
from tether.proxy.core.route_filters import FailureInjector, HeaderModifier, InvalidRedirect, Redirect, chain
from tether.proxy.core.server_policy import HttpRoute, Protocol, Rule, ServerPolicy

log = logging.getLogger(__name__)

# Subscribe to a port's policy changes: ``(port, changed) -> unsubscribe`` (``io.policy_client``).
PolicyChanges = Callable[[int, Callable[[], None]], Callable[[], None]]

HELP = {
    "inbound_tcp_authz_terminate_total": "The total number of inbound TCP connections that were terminated due to "
                                         "an authorization change.",
    "inbound_http_authz_allow_total": "The total number of inbound HTTP requests that were authorized.",
    "inbound_http_authz_deny_total": "The total number of inbound HTTP requests that could not be authorized.",
    "inbound_http_route_not_found_total": "The number of inbound requests that did not match a route.",
    "inbound_http_local_ratelimit_total": "The number of inbound requests refused by a local rate limit.",
}


def server_labels(policy: ServerPolicy, port: int) -> str:
    """``srv_group``, ``srv_kind``, ``srv_name`` and ``srv_port``."""
    return f'{policy.meta.labels("srv")},srv_port="{port}"'


@dataclass(frozen=True, slots=True)
class ConnectionFacts:
    """What an inbound connection's authorization is decided on and counted under, fixed when it is accepted."""

    port: int  # the target port: whose policy applies
    client_ip: IpAddress
    mesh_tls: bool  # the client presented a mesh identity over mesh TLS
    client_id: str | None
    target_labels: str  # target_addr, target_ip, target_port ...
    tls_labels: str  # tls and client_id
    registry: Registry | None  # None: nothing is counted

    def admitting(self, authorizations: Sequence[Authorization]) -> Authorization | None:
        """The first of ``authorizations`` that admits this client, or None."""
        return authorize(authorizations, client_ip=self.client_ip, mesh_tls=self.mesh_tls, client_id=self.client_id)

    def client(self) -> str:
        """The client as log lines name it: its address and identity."""
        return f"{self.client_ip} ({self.client_id or 'no identity'})"

    def count(self, name: str, labels: str) -> None:
        if self.registry is not None:
            self.registry.counter(name, HELP[name]).inc(labels)


class InboundRequestPolicy:
    """Route and authorization of each request on one inbound connection.

    What depends only on the connection and the route -- the authorization decision and the labels of its
    metric -- is worked out once per route and kept while the port's policy is the same object (a policy
    update is a new object, so the next request decides afresh).
    """

    __slots__ = ("_policy", "_facts", "_changes", "_clock", "_draw", "permit", "route", "grpc", "_seen", "_srv",
                 "_server", "_parent", "_decided")

    def __init__(self, policy: Callable[[], ServerPolicy], facts: ConnectionFacts, *, clock: Callable[[], float],
                 draw: Callable[[], float] = random.random, changes: PolicyChanges | None = None) -> None:
        self._policy = policy
        self._facts = facts
        self._changes = changes  # None: policies are not discovered (they never change)
        self._clock = clock
        self._draw = draw  # a uniform number in [0, 1): whether a failure injector fails this request
        # The last authorized request's srv_*, route_* and authz_* labels: its request metrics' (core.routes).
        self.permit = ""
        # Its parent_* and route_* labels, and whether its Server speaks gRPC: the inbound route families'
        # (core.inbound_route_metrics).
        self.route = ""
        self.grpc = False
        self._seen: ServerPolicy | None = None  # the policy the kept decisions were made under
        self._srv = ""  # srv_* labels under it
        self._server = ""  # target_* and srv_* labels under it
        self._parent = ""  # parent_* labels under it (the server, as the route families name it)
        self._decided: dict[int, _Decision] = {}  # by id() of a route of ``_seen`` (which keeps it alive)

    def check(self, request: RequestHead) -> ProxyError | HeaderEdit | None:
        facts = self._facts
        policy = self._policy()
        if policy is not self._seen:
            self._seen = policy
            self._srv = server_labels(policy, facts.port)
            self._server = f"{facts.target_labels},{self._srv}"
            self._parent = f'{policy.meta.labels("parent")},parent_port="{facts.port}"'
            self._decided = {}
        # A policy whose one route takes every request (the default policies') is not asked: a call saved.
        selected = policy.every if policy.every is not None else policy.select(request)
        if selected is None:
            facts.count("inbound_http_route_not_found_total", f"{self._server},{facts.tls_labels}")
            return errors.route_not_found()
        route, rule = selected
        decision = self._decided.get(id(route))
        if decision is None:
            decision = self._decided[id(route)] = self._decide(route)
        if decision.counter is not None:
            decision.counter.inc(decision.labels)
        authz = decision.authz
        if authz is None:
            log.info("inbound: request denied: server %s, route %s, client %s", _name(policy.meta),
                     _name(route.meta), facts.client())
            return errors.unauthorized()
        if decision.audit:
            log.info("inbound: request allowed: server %s, route %s, client %s, authorization %s",
                     _name(policy.meta), _name(route.meta), facts.client(), _name(authz.meta))
        self.permit = decision.permit
        self.route = decision.route
        self.grpc = policy.protocol is Protocol.GRPC
        edit = None
        if rule.filters:
            outcome = self._filter(route, rule, request)
            if isinstance(outcome, ProxyError):
                return outcome
            edit = outcome
        limit = policy.ratelimit
        if limit is not None:
            scope = limit.check(facts.client_id if facts.mesh_tls else None, self._clock())
            if scope is not None:
                facts.count("inbound_http_local_ratelimit_total",
                            f'{decision.route_labels},{limit.meta.labels("ratelimit")},ratelimit_scope="{scope}"')
                return errors.rate_limited(scope)
        return edit

    def upgraded(self, request: RequestHead) -> TcpAuthzWatch | None:
        """The watch of the connection ``request`` switched to another protocol (see the module docstring)."""
        if self._changes is None:
            return None
        return TcpAuthzWatch(self._policy, self._changes, self._facts, request)

    def _filter(self, route: HttpRoute, rule: Rule, request: RequestHead) -> ProxyError | HeaderEdit | None:
        """The rule's filters in order, as linkerd2-proxy applies them: the first failure or redirect answers;
        header modifiers add up to one edit of the request's headers."""
        modifiers: list[HeaderModifier] = []
        for f in rule.filters:
            if isinstance(f, HeaderModifier):
                modifiers.append(f)
            elif isinstance(f, FailureInjector):
                if f.hits(self._draw()):
                    log.warning("inbound: unexpected error: route %s: injected failure %d: %s",
                                _name(route.meta), f.grpc_code if f.grpc_code is not None else f.status, f.message)
                    return UNEXPECTED
            elif isinstance(f, Redirect):
                try:
                    location = f.location_of(request, rule.matched_prefix(request))
                except InvalidRedirect as exc:
                    log.warning("inbound: route %s: invalid redirect: %s", _name(route.meta), exc)
                    return UNEXPECTED
                if location is not None:
                    return errors.redirect(f.status, location)
            else:
                return errors.invalid_policy(f"invalid server policy: {f.message}")
        return chain(modifiers)

    def _decide(self, route: HttpRoute) -> _Decision:
        facts = self._facts
        server_route = f"{self._server},{route.meta.labels('route')}"
        authz = facts.admitting(route.authorizations)
        permit = ""
        if authz is None:
            name, labels = "inbound_http_authz_deny_total", f"{server_route},{facts.tls_labels}"
        else:
            permit = f"{self._srv},{route.meta.labels('route')},{authz.meta.labels('authz')}"
            name, labels = "inbound_http_authz_allow_total", f"{facts.target_labels},{permit},{facts.tls_labels}"
        counter = facts.registry.counter(name, HELP[name]) if facts.registry is not None else None
        return _Decision(authz, counter, labels, server_route, permit, f"{self._parent},{route.meta.labels('route')}",
                         authz is not None and authz.meta == AUDIT)


class _Decision:
    """A route's authorization for the connection (None: denied), and the counter and labels each of its
    requests moves."""

    __slots__ = ("authz", "counter", "labels", "route_labels", "permit", "route", "audit")

    def __init__(self, authz: Authorization | None, counter: Counter | None, labels: str, route_labels: str,
                 permit: str, route: str, audit: bool) -> None:
        self.authz = authz
        self.counter = counter
        self.labels = labels
        self.route_labels = route_labels  # target_*, srv_* and route_* (a rate limit's labels start with them)
        self.permit = permit  # srv_*, route_* and authz_*: InboundRequestPolicy.permit when allowed
        self.route = route  # parent_* and route_*: InboundRequestPolicy.route when allowed
        self.audit = audit  # allowed by the ``audit`` authorization: each request is logged


class TcpAuthzWatch:
    """An open connection's authorization, checked again whenever its port's policy changes.

    The driver calls ``watch(revoke)`` once the connection is forwarded and the
    returned function when it ends; ``revoke`` is called (once) when a new
    policy no longer admits the client: by the port's authorizations, or -- for
    an HTTP connection switched to another protocol by ``request`` -- by the
    authorizations of the route ``request`` takes under the new policy (none: not
    admitted).
    """

    __slots__ = ("_policy", "_changes", "_facts", "_request", "_revoked")

    def __init__(self, policy: Callable[[], ServerPolicy], changes: PolicyChanges, facts: ConnectionFacts,
                 request: RequestHead | None = None) -> None:
        self._policy = policy
        self._changes = changes
        self._facts = facts
        self._request = request
        self._revoked = False

    def watch(self, revoke: Callable[[], None]) -> Callable[[], None]:
        return self._changes(self._facts.port, lambda: self._changed(revoke))

    def allowed(self) -> Meta | None:
        """The authorization that admits the connection under the port's current policy, or None."""
        policy = self._policy()
        authorizations = policy.authorizations
        if self._request is not None:
            selected = policy.select(self._request)
            if selected is None:
                return None
            authorizations = selected[0].authorizations
        authz = self._facts.admitting(authorizations)
        return authz.meta if authz is not None else None

    def _changed(self, revoke: Callable[[], None]) -> None:
        if self._revoked or self.allowed() is not None:
            return
        self._revoked = True
        facts, policy = self._facts, self._policy()
        log.info("inbound: connection from %s to port %d terminated: the policy of %s/%s/%s no longer admits it",
                 facts.client_ip, facts.port, policy.meta.group, policy.meta.kind, policy.meta.name)
        facts.count("inbound_tcp_authz_terminate_total",
                    f"{facts.target_labels},{server_labels(policy, facts.port)},{facts.tls_labels}")
        revoke()


# linkerd2-proxy's inbound error mapper has no case for an injected failure nor an invalid redirect: both are
# answered as any unexpected error, whatever status the filter says (and the connection is closed).
UNEXPECTED = errors.unexpected()
AUDIT = Meta.default("audit")  # the authorization of the ``audit`` policy: allows, and each request is logged


def log_connection(policy: ServerPolicy, authz: Meta | None, facts: ConnectionFacts) -> None:
    """linkerd2-proxy's log lines for a connection authorized once: denied, or allowed by ``audit``."""
    if authz is None:
        log.info("inbound: connection denied: server %s, client %s", _name(policy.meta), facts.client())
    elif authz == AUDIT:
        log.info("inbound: request allowed: server %s, client %s, authorization %s", _name(policy.meta),
                 facts.client(), _name(authz))


def _name(meta: Meta) -> str:
    return f"{meta.group}/{meta.kind}/{meta.name}" if meta.group else f"{meta.kind}:{meta.name}"


