"""The status controller: ``status.parents[]`` on routes, conditions on rate limits and EgressNetworks.

Linkerd's status controller (control-plane.md §5.6), one writer per cluster.
``desired_statuses`` is pure: from the inbound index (every route, Server and
rate limit) and the outbound index (Services, EgressNetworks) it computes, per
object, the status this controller owns:

* routes, per parent: ``Accepted`` (``Accepted``; ``NoMatchingParent`` when the
  Server, Service or EgressNetwork does not exist, the Service is headless or ExternalName, or the
  EgressNetwork's own status is not ``Accepted``; ``RouteReasonConflicted`` for
  a route on a Server, or a Service or EgressNetwork port, that a route of a kind of higher
  precedence also has -- GRPCRoute over HTTPRoute over TLSRoute over TCPRoute,
  Linkerd's order (GEP-1426), which is also the one the outbound policy serves;
  ``InvalidKind`` for another kind) and, but on a Server (Linkerd writes ``Accepted`` alone there),
  ``ResolvedRefs`` (``ResolvedRefs``; ``BackendNotFound`` when a Service backend does not exist), under
  controller ``linkerd.io/policy-controller``;
  parents other controllers wrote are kept;
* HTTPLocalRateLimitPolicies: ``Accepted`` (``Accepted``; ``NoMatchingTarget``
  without the Server; ``RateLimitReasonAlreadyExists`` for all but the oldest on
  one Server);
* EgressNetworks: ``Accepted`` (``Accepted``; ``EgressReasonNetworkOverlap`` when
  its networks, exceptions taken out, reach into the cluster networks); other
  types of condition on it are kept.

The inbound and outbound indexes read route and rate-limit acceptance back
from the status this writes (``tether.policy.inbound.facts.accepted_by``,
``tether.policy.outbound.facts.RouteFacts.accepted_by``), as Linkerd's do: the
rule above decides it once, here.  ``StatusController`` keeps each object's status as the watch
delivers it (``observe``), reconciles after changes (coalesced) and every
``period`` seconds (an object found in order is not merged again until its
resourceVersion or its wanted status moves), and writes only what differs, guarded by the
resourceVersion it saw (a concurrent change wins; the next round retries),
through a ``StatusWriter``: ``LocalStatusWriter`` replaces the object in the
store; on Kubernetes ``tether.policy.kubernetes_status`` patches the status
subresource while this replica holds the Lease.  A condition keeps its
``lastTransitionTime`` while its status holds.

The loop must never hold up the process: the local writer has a store
connection of its own and writes from a worker thread, so a write waiting on
another process's transaction (SQLite's busy wait) blocks neither the event
loop nor the watches reading the same file; and the wait for a change uses
``asyncio.timeout``, because Python 3.11's ``wait_for`` swallows a cancellation
that arrives in the turn the awaited event fires, which left ``stop`` waiting
for a status task that went on running.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from tether.platform.watch import ResourceEvent
from tether.policy.inbound.facts import CONTROLLER_NAME
from tether.policy.inbound.index import InboundIndex, Named
from tether.policy.metrics import PolicyMetrics
from tether.resources import kinds
from tether.resources.errors import ValidationError
from tether.resources.policy import Network
from tether.store import Store, StoreError

log = logging.getLogger(__name__)

RECONCILE_PERIOD_S = 10.0  # Linkerd's status reconciliation period
ROUTE_KINDS = (kinds.POLICY_HTTP_ROUTE, kinds.GATEWAY_HTTP_ROUTE, kinds.GRPC_ROUTE, kinds.TLS_ROUTE, kinds.TCP_ROUTE)
# A route kind -> the kinds that win a Service or EgressNetwork port over it (Linkerd's conflict rule).
_PRECEDED_BY = {
    kinds.GRPC_ROUTE.kind: (),
    kinds.GATEWAY_HTTP_ROUTE.kind: (kinds.GRPC_ROUTE,),
    kinds.TLS_ROUTE.kind: (kinds.GRPC_ROUTE, kinds.POLICY_HTTP_ROUTE, kinds.GATEWAY_HTTP_ROUTE),
    kinds.TCP_ROUTE.kind: (kinds.GRPC_ROUTE, kinds.POLICY_HTTP_ROUTE, kinds.GATEWAY_HTTP_ROUTE, kinds.TLS_ROUTE),
}

Key = tuple[str, str, str]  # (type key, namespace, name)
Status = dict[str, Any]


def _condition(type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}


def _linkerd_parent_ref(rtype: kinds.ResourceType, parent: Any, namespace: str) -> dict[str, Any]:
    """A known parent as Linkerd's status controller spells it, whatever the route wrote: its API group
    (``core`` for a Service, not ``""``), kind and namespace always, the port (not a Server's), no sectionName."""
    ref: dict[str, Any] = {"group": rtype.group or "core", "kind": rtype.kind, "namespace": namespace,
                           "name": parent.name}
    if parent.port and rtype is not kinds.SERVER:
        ref["port"] = parent.port
    return ref


def _parent_ref(parent: Any) -> dict[str, Any]:
    """A parent of a kind this controller does not know, as the route wrote it."""
    ref: dict[str, Any] = {"group": parent.group, "kind": parent.kind, "name": parent.name}
    if parent.namespace:
        ref["namespace"] = parent.namespace
    if parent.section_name:
        ref["sectionName"] = parent.section_name
    if parent.port:
        ref["port"] = parent.port
    return ref


def _route_parent(kind: str, route: Named, parent: Any, inbound: InboundIndex,
                  services: Mapping[tuple[str, str], Any], egress: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
    ns = parent.namespace or route.namespace
    rtype: kinds.ResourceType
    if parent.targets(kinds.SERVER):
        exists = parent.name in inbound.objects[kinds.SERVER.key].get(ns, {}) and ns == route.namespace
        rtype = kinds.SERVER
    elif parent.targets(kinds.SERVICE):
        exists, rtype = (ns, parent.name) in services, kinds.SERVICE
    elif parent.targets(kinds.EGRESS_NETWORK):
        exists, rtype = (ns, parent.name) in egress, kinds.EGRESS_NETWORK
    else:
        return {"parentRef": _parent_ref(parent), "controllerName": CONTROLLER_NAME, "conditions": [
            _condition("Accepted", False, "InvalidKind", _invalid_kind(parent)),
            _condition("ResolvedRefs", True, "ResolvedRefs")]}
    what = rtype.kind
    winner = None if not exists else _winning_route_on(kind, parent, ns, inbound)
    if not exists:
        accepted = _condition("Accepted", False, "NoMatchingParent", f"{what} {ns}/{parent.name} does not exist")
    elif rtype is kinds.SERVICE and services[(ns, parent.name)].headless:
        # Linkerd's valid_parent_service: the proxy reaches a Service's routes through its cluster IP.
        accepted = _condition("Accepted", False, "NoMatchingParent", f"Service {ns}/{parent.name} has no cluster "
                                                                     "IP (headless or ExternalName)")
    elif rtype is kinds.EGRESS_NETWORK and not egress[(ns, parent.name)].accepted:
        # Linkerd's parent_condition_egress_network: its own Accepted status first (written by this controller,
        # read back: a route on a new EgressNetwork is accepted the round after the network is).
        accepted = _condition("Accepted", False, "NoMatchingParent", f"EgressNetwork {ns}/{parent.name} is not "
                                                                     "accepted (its status)")
    elif winner is not None:
        same = "Server" if rtype is kinds.SERVER else f"{what} port"
        accepted = _condition("Accepted", False, "RouteReasonConflicted",
                              f"{winner} is on the same {same} ({winner.partition(' ')[0]}s take precedence "
                              f"over {kind}s)")
    else:
        accepted = _condition("Accepted", True, "Accepted")
    if rtype is kinds.SERVER:
        # Accepted alone, as Linkerd writes a Server's entry (and its inbound index warns of any other type).
        return {"parentRef": _linkerd_parent_ref(rtype, parent, ns), "controllerName": CONTROLLER_NAME,
                "conditions": [accepted]}
    missing = [f"{b.namespace or route.namespace}/{b.name}" for rule in route.spec.rules for b in rule.backend_refs
               if b.targets(kinds.SERVICE) and ((b.namespace or route.namespace), b.name) not in services]
    resolved = (_condition("ResolvedRefs", False, "BackendNotFound", "no Service " + ", ".join(missing))
                if missing else _condition("ResolvedRefs", True, "ResolvedRefs"))
    return {"parentRef": _linkerd_parent_ref(rtype, parent, ns), "controllerName": CONTROLLER_NAME,
            "conditions": [accepted, resolved]}


def _invalid_kind(parent: Any) -> str:
    """Why a parent is of no kind this controller knows, naming its group: a Service without ``group`` is the
    usual slip (the CRDs default a missing group to the route's own, so it names no Service)."""
    return (f"{parent.group or 'core'}/{parent.kind} is not a Server or EgressNetwork (policy.linkerd.io) or a "
            "Service (core); a parentRef without group is in its route's group")


def _winning_route_on(kind: str, parent: Any, namespace: str, inbound: InboundIndex) -> str | None:
    """A route of a kind that takes precedence over ``kind`` on the same Server, or Service or EgressNetwork
    and port (either port unset: any), as ``Kind ns/name``.  Linkerd's status controller applies the rule to
    every parent kind (``parent_has_conflicting_routes``), so an HTTPRoute on a Server a GRPCRoute also has
    is not accepted there, and the inbound index, reading that back, leaves it out."""
    rtype = next(t for t in (kinds.SERVER, kinds.SERVICE, kinds.EGRESS_NETWORK) if parent.targets(t))
    for winner in _PRECEDED_BY[kind]:
        for routes in inbound.objects[winner.key].values():
            for other in sorted(routes.values(), key=lambda r: r.order):
                for ref in other.spec.parent_refs:
                    if (ref.targets(rtype) and (ref.name, ref.namespace or other.namespace) == (parent.name, namespace)
                            and (not ref.port or not parent.port or ref.port == parent.port)):
                        return f"{winner.kind} {other.namespace}/{other.name}"
    return None


def desired_statuses(inbound: InboundIndex, services: Mapping[tuple[str, str], Any],
                     egress: Mapping[tuple[str, str], Any]) -> dict[Key, Status]:
    """What this controller's part of each status should be (``parents`` or ``conditions``)."""
    out: dict[Key, Status] = {}
    for rtype in ROUTE_KINDS:
        for routes in inbound.objects[rtype.key].values():
            for route in routes.values():
                out[(rtype.key, route.namespace, route.name)] = {"parents": [
                    _route_parent(rtype.kind, route, parent, inbound, services, egress)
                    for parent in route.spec.parent_refs]}
    limit_kind = kinds.HTTP_LOCAL_RATE_LIMIT_POLICY
    for namespace, policies in inbound.objects[limit_kind.key].items():
        servers = inbound.objects[kinds.SERVER.key].get(namespace, {})
        for policy in policies.values():
            target = policy.spec.target_ref.name
            winner = inbound.ratelimit_winner(namespace, target)
            if target not in servers:
                condition = _condition("Accepted", False, "NoMatchingTarget", f"Server {namespace}/{target} "
                                                                              "does not exist")
            elif winner is not None and winner.name != policy.name:
                condition = _condition("Accepted", False, "RateLimitReasonAlreadyExists",
                                       f"HTTPLocalRateLimitPolicy {winner.name} already targets Server {target}")
            else:
                condition = _condition("Accepted", True, "Accepted")
            out[(limit_kind.key, namespace, policy.name)] = {"conditions": [condition]}
    for (namespace, name), network in egress.items():
        out[(kinds.EGRESS_NETWORK.key, namespace, name)] = {"conditions": [
            _egress_condition(network.networks, inbound.config.cluster_networks)]}
    return out


def _egress_condition(networks: tuple[Network, ...] | None, cluster: tuple[Network, ...]) -> dict[str, Any]:
    """``Accepted``, unless the EgressNetwork names addresses of the cluster (its default, everything outside
    the cluster networks, never does): ``EgressReasonNetworkOverlap``, as Linkerd."""
    if any(n.overlaps(c.cidr) for n in networks or () for c in cluster):
        return _condition("Accepted", False, "EgressReasonNetworkOverlap", "networks overlap with clusterNetworks")
    return _condition("Accepted", True, "Accepted")


def _strip_times(conditions: list[Any]) -> list[Any]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions if isinstance(c, dict)]


def _stamp(new: list[dict[str, Any]], old: list[Any], now: str) -> list[dict[str, Any]]:
    """``new`` conditions with ``lastTransitionTime``: kept from ``old`` where the status did not change."""
    before = {c.get("type"): c for c in old if isinstance(c, dict)}
    out = []
    for condition in new:
        previous = before.get(condition["type"])
        same = previous is not None and previous.get("status") == condition["status"]
        out.append({**condition, "lastTransitionTime": previous.get("lastTransitionTime", now) if same else now})
    return out


def merged_status(current: Mapping[str, Any] | None, desired: Status, now: str) -> dict[str, Any] | None:
    """The object's new ``status`` with our part replaced, or None when nothing would change."""
    current = dict(current or {})
    if "parents" in desired:
        old_parents = [p for p in current.get("parents") or [] if isinstance(p, dict)]
        ours = [p for p in old_parents if p.get("controllerName") == CONTROLLER_NAME]
        others = [p for p in old_parents if p.get("controllerName") != CONTROLLER_NAME]
        old_by_ref = {repr(sorted(p.get("parentRef", {}).items())): p for p in ours}
        if [(p["parentRef"], _strip_times(p["conditions"])) for p in desired["parents"]] == [
                (p.get("parentRef"), _strip_times(p.get("conditions") or [])) for p in ours]:
            return None
        parents = []
        for parent in desired["parents"]:
            old = old_by_ref.get(repr(sorted(parent["parentRef"].items())), {})
            parents.append({**parent, "conditions": _stamp(parent["conditions"], old.get("conditions") or [], now)})
        return {**current, "parents": [*others, *parents]}
    old_conditions = [c for c in current.get("conditions") or [] if isinstance(c, dict)]
    ours = {c["type"] for c in desired["conditions"]}
    others = [c for c in old_conditions if c.get("type") not in ours]  # conditions of types we do not own stay
    mine = [c for c in old_conditions if c.get("type") in ours]
    if _strip_times(desired["conditions"]) == _strip_times(mine):
        return None
    return {**current, "conditions": [*others, *_stamp(desired["conditions"], mine, now)]}


class StatusWriteFailed(Exception):
    """A status write did not happen (a conflict, the platform unreachable or refusing); the next round retries."""


class StatusWriter(Protocol):
    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        """Replace the object's ``status``, guarded by ``resource_version`` (empty: unguarded).

        Returns the object's new resourceVersion, or None when the object is gone;
        raises ``StatusWriteFailed`` otherwise (a conflict included).
        """
        ...

    def close(self) -> None:
        """Release what the writer holds (called once the status loop has ended)."""
        ...


class LocalStatusWriter:
    """Status on the local platform: the object replaced in the store, guarded by its resourceVersion.

    Opens its own ``Store`` on ``path`` and writes from a worker thread: a connection shared with
    the watches would make them wait for this writer's lock while it waits for another process's.
    A write the controller gave up on (``--patch-timeout-ms``) may still be running in its thread
    when the next begins: the lock keeps them (and ``close``) one at a time on the connection.
    """

    def __init__(self, path: Path, *, busy_timeout: float = 30.0) -> None:
        self._store = Store(path, busy_timeout=busy_timeout)
        self._lock = threading.Lock()

    async def write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        return await asyncio.to_thread(self._write, key, resource_version, status)

    def close(self) -> None:
        with self._lock:
            self._store.close()

    def _write(self, key: Key, resource_version: str, status: dict[str, Any]) -> str | None:
        type_key, namespace, name = key
        with self._lock:
            try:
                obj = self._store.get(type_key, namespace, name)
                if obj is None:
                    return None
                metadata = dict(obj["metadata"])
                if resource_version:
                    metadata["resourceVersion"] = resource_version  # Conflict if the object moved on
                stored = self._store.apply({**obj, "metadata": metadata, "status": status})
            except (StoreError, ValidationError) as exc:  # a stored object that no longer validates included
                raise StatusWriteFailed(str(exc)) from None
        return str(stored["metadata"]["resourceVersion"])


STATUS_KEYS = frozenset(t.key for t in (*ROUTE_KINDS, kinds.HTTP_LOCAL_RATE_LIMIT_POLICY, kinds.EGRESS_NETWORK))


def _older(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` precedes ``than`` (both numbers, as both platforms give them)."""
    try:
        return int(version) < int(than)
    except ValueError:
        return False  # opaque versions: take the event, the newest the watch has seen


class StatusController:
    """Reconciles the statuses after changes (``changed``) and every ``period`` seconds.

    The objects' current statuses come from the watch (``observe``), so a round compares in
    memory and writes only what differs.  With ``leading`` (a Lease's event on Kubernetes)
    it writes only while that is set, as Linkerd's one elected writer.
    """

    def __init__(self, inbound: InboundIndex, services: Callable[[], Mapping[tuple[str, str], Any]],
                 egress: Callable[[], Mapping[tuple[str, str], Any]], writer: StatusWriter, metrics: PolicyMetrics,
                 period: float = RECONCILE_PERIOD_S, *, leading: asyncio.Event | None = None,
                 patch_timeout: float = 5.0, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._inbound = inbound
        self._services = services
        self._egress = egress
        self._writer = writer
        self._metrics = metrics
        self._period = period
        self._patch_timeout = patch_timeout
        self._leading = leading
        self._clock = clock
        self._current: dict[Key, tuple[str, Any]] = {}  # (resourceVersion, status) as last seen or written
        # (resourceVersion, desired) of each object whose status at that version was found to need nothing:
        # the next round skips merging while neither moves (most objects, most rounds).
        self._settled: dict[Key, tuple[str, Status]] = {}
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()  # set while the loop waits for a change or to lead (nothing being written)
        self.rounds = 0

    def observe(self, type_key: str, event: ResourceEvent) -> None:
        """Keep the status of every object this controller writes, as the watch delivers it."""
        if type_key not in STATUS_KEYS or event.object is None:
            return
        namespace, name = event.key
        key = (type_key, namespace or "default", name)
        if event.type == "DELETED":
            self._current.pop(key, None)
            self._settled.pop(key, None)
            return
        version = str(event.object["metadata"].get("resourceVersion") or "")
        known = self._current.get(key)
        if known is not None and _older(version, known[0]):
            return  # an event from before our own write, which already told us the newer state
        self._current[key] = (version, event.object.get("status"))

    def changed(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._idle_during(self._next_change(), idle=not self._wake.is_set())
            if self._leading is not None and not self._leading.is_set():
                # Another replica writes; this one takes over (and reconciles at once) when it stops.
                await self._idle_during(self._leading.wait(), idle=True)
            await asyncio.sleep(0)  # let the rest of a burst of events land first
            try:
                await self.reconcile()
            except Exception:  # a bug here must not stop status for good: log it, retry next round
                log.exception("status reconciliation failed")

    async def _next_change(self) -> None:
        try:
            async with asyncio.timeout(self._period):  # not wait_for: see the module's docstring
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    async def _idle_during(self, waiting: Awaitable[Any], *, idle: bool) -> None:
        if idle:
            self.idle.set()
        try:
            await waiting
        finally:
            self.idle.clear()

    async def reconcile(self) -> int:
        """Write every status that differs from what the watch last showed; return how many were written."""
        written = 0
        desired = desired_statuses(self._inbound, self._services(), self._egress())
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        for key, wanted in desired.items():
            current = self._current.get(key)
            if current is None:
                continue  # not seen by the watch (yet, or any more)
            version, status = current
            if version and self._settled.get(key) == (version, wanted):
                continue
            new = merged_status(status, wanted, now)
            if new is None:
                self._settled[key] = (version, wanted)
                continue
            kind = key[0].partition(".")[0]
            try:
                async with asyncio.timeout(self._patch_timeout):  # Linkerd's --patch-timeout-ms, per write
                    new_version = await self._writer.write(key, version, new)
            except TimeoutError:
                # The write may still land; the watch then shows it, else the next round writes again.
                self._metrics.status_timeouts.labels(kind).inc()
                log.warning("status of %s %s/%s not written within %.0f ms (next round retries)", kind, key[1],
                            key[2], self._patch_timeout * 1000)
                continue
            except StatusWriteFailed as exc:
                # One object's failure must not hold up the others': count it, log it, and go on.
                self._metrics.status_errors.labels(kind).inc()
                log.info("status of %s %s/%s not written (next round retries): %s", kind, key[1], key[2], exc)
                continue
            if new_version is not None:
                self._current[key] = (new_version, new)
                written += 1
                self._metrics.status_patches.labels(kind).inc()
        self.rounds += 1
        return written
