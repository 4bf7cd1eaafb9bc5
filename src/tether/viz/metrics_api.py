"""Linkerd viz's metrics API: StatSummary, TopRoutes, Edges and Authz, answered from Prometheus.

Each answer joins two sources, as Linkerd's does: the platform's objects
(which deployments, pods, namespaces and services exist, how many of their pods
are meshed, which ServiceProfiles name their routes, which identity a pod's
service account has) and Prometheus' series, queried with the PromQL of
``tether.viz.promql``.  The objects come through ``Objects``, a read-only view
the caller fills from the local store (or the Kubernetes API), so this module
does no discovery of its own.

Rows carry raw numbers; ``tether.viz.tables`` formats them.  Callers: the
``tether viz`` commands and the dashboard.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.naming import DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_PLANE_NS, DEFAULT_TRUST_DOMAIN, WorkloadIdentity
from tether.naming import InvalidName
from tether.resources.errors import ValidationError
from tether.resources.selectors import LabelSelector
from tether.viz import promql
from tether.viz.prometheus import Prometheus, Sample, count
from tether.viz.targets import AUTHORITY, DEPLOYMENT, NAMESPACE, POD, SERVICE, Target
from tether.viz.workloads import MESHED_LABEL, select

Obj = Mapping[str, Any]
DEFAULT_ROUTE = "[DEFAULT]"
NO_TLS_MESSAGES = {
    "disabled": "Disabled",
    "loopback": "Loopback",
    "no_authority_in_http_request": "No Authority In HTTP Request",
    "not_http": "Not HTTP",
    "not_provided_by_remote": "Not Provided By Remote",
    "not_provided_by_service_discovery": "Not Provided By Service Discovery",
}


class Objects(Protocol):
    """The platform's objects of one kind (every namespace when ``namespace`` is None)."""

    def list(self, kind: str, namespace: str | None) -> list[Obj]: ...


@dataclass(slots=True)
class Stats:
    success: int = 0
    failure: int = 0
    mtls: int = 0  # responses to requests that arrived (or left) over mTLS
    latency_ms: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(promql.QUANTILES))
    tcp_open: int | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    actual_success: int | None = None
    actual_failure: int | None = None
    allowed: int | None = None
    denied: int | None = None
    timeouts: int | None = None  # stat-outbound: requests that ended in a timeout of the route
    retries: int | None = None  # stat-outbound: retries made on the route
    attempts: int | None = None  # stat-outbound: requests sent to one backend (each try)

    @property
    def requests(self) -> int:
        return self.success + self.failure

    def success_rate(self) -> float | None:
        return self.success / self.requests if self.requests else None

    def actual_success_rate(self) -> float | None:
        if self.actual_success is None or self.actual_failure is None:
            return None
        total = self.actual_success + self.actual_failure
        return self.actual_success / total if total else None

    def mtls_share(self) -> float | None:
        return self.mtls / self.requests if self.requests else None


@dataclass(slots=True)
class Row:
    kind: str
    namespace: str
    name: str
    stats: Stats | None  # None: no traffic in the window
    meshed: int | None = None
    total: int | None = None
    extra: dict[str, str] = field(default_factory=dict)  # route, authority, server, authorization ...


@dataclass(slots=True)
class Edge:
    src_namespace: str
    src: str
    dst_namespace: str
    dst: str
    kind: str
    client_id: str
    server_id: str
    no_tls_reason: str  # Linkerd's message ("Not Provided By Remote"), empty when mTLS


@dataclass(frozen=True, slots=True)
class Mesh:
    control_plane_ns: str = DEFAULT_CONTROL_PLANE_NS
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN


def window_seconds(window: str) -> float:
    """A Prometheus duration (``30s``, ``1m``, ``1h30m``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total, number = 0.0, ""
    i = 0
    while i < len(window):
        c = window[i]
        if c.isdigit():
            number += c
            i += 1
            continue
        unit = "ms" if window.startswith("ms", i) else c
        if unit not in units or not number:
            raise ValueError(f"{window!r} is not a duration such as 30s, 1m or 1h")
        total += int(number) * units[unit]
        number = ""
        i += len(unit)
    if number or total <= 0:
        raise ValueError(f"{window!r} is not a duration such as 30s, 1m or 1h")
    return total


# -- folding samples into stats -------------------------------------------------------------------


def _key(labels: Mapping[str, str], group: Sequence[str]) -> tuple[str, str]:
    """(namespace, name) of a sample, from the query's group labels (namespace first, name last)."""
    name = labels.get(group[-1], "")
    return (labels.get(group[0], "") if len(group) > 1 else name, name)


def fold(results: Mapping[str, Sequence[Sample]], key_of) -> dict[Any, Stats]:  # noqa: ANN001 - a key function
    """Samples of a query set, folded into ``Stats`` by ``key_of(labels)``."""
    out: dict[Any, Stats] = {}
    for name, samples in results.items():
        for sample in samples:
            key = key_of(sample.labels)
            stats = out.setdefault(key, Stats())
            value = sample.value
            if name == promql.REQUESTS:
                n = count(value)
                if sample.labels.get("classification") == "success":
                    stats.success += n
                elif sample.labels.get("classification") == "failure":
                    stats.failure += n
                if sample.labels.get("tls") == "true":
                    stats.mtls += n
            elif name == promql.ACTUAL_REQUESTS:
                n = count(value)
                if sample.labels.get("classification") == "success":
                    stats.actual_success = (stats.actual_success or 0) + n
                    stats.actual_failure = stats.actual_failure or 0
                elif sample.labels.get("classification") == "failure":
                    stats.actual_failure = (stats.actual_failure or 0) + n
                    stats.actual_success = stats.actual_success or 0
            elif name in promql.QUANTILES:
                stats.latency_ms[name] = None if math.isnan(value) else value
            elif name == promql.TCP_CONNECTIONS:
                stats.tcp_open = count(value)
            elif name == promql.TCP_READ:
                stats.read_bytes = count(value)
            elif name == promql.TCP_WRITE:
                stats.write_bytes = count(value)
            elif name == promql.ALLOWED:
                stats.allowed = count(value)
            elif name == promql.DENIED:
                stats.denied = count(value)
    return out


# -- StatSummary ----------------------------------------------------------------------------------


def _name(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name", ""))


def _rows_of_objects(objects: Objects, target: Target) -> list[Row]:
    """One row per existing object of the target's kind, with its meshed/total pod counts."""
    ns = target.namespace
    names = [target.name] if target.name else []
    if target.kind in (DEPLOYMENT, POD, NAMESPACE):
        pods = objects.list("Pod", None if target.kind == NAMESPACE else ns)
        kw: dict[str, Any] = {}
        if target.kind == DEPLOYMENT:
            kw["deployments"] = objects.list("Deployment", ns)
        elif target.kind == NAMESPACE:
            kw["namespaces"] = objects.list("Namespace", None)
        return [Row(target.kind, w.namespace, w.name, None, w.meshed, w.total)
                for w in select(target.kind, pods, names=names, **kw)]
    if target.kind == SERVICE:
        return [Row(SERVICE, *_name(s), None) for s in objects.list("Service", ns)
                if not names or _name(s)[1] in names]
    return []


def stat_summary(prometheus: Prometheus, objects: Objects, target: Target, window: str, *,
                 to: Target | None = None, from_: Target | None = None, mesh: Mesh = Mesh()) -> list[Row]:
    """Linkerd's StatSummary for one resource kind: every object's row (or, with --to/--from, those with traffic)."""
    if from_ is not None and from_.kind == SERVICE:
        raise ValueError("a service has no proxy of its own, so it cannot be a --from resource")
    queries = promql.stat(target, window, to=to, from_=from_, cluster_domain=mesh.cluster_domain)
    results = prometheus.query_all(queries.queries)
    by_key = fold(results, lambda labels: _key(labels, queries.group_by))
    if target.kind == NAMESPACE:
        by_key = {(name, name): s for (_, name), s in by_key.items()}
    rows = _rows_of_objects(objects, target)
    if target.kind == AUTHORITY or to is not None or from_ is not None:
        known = {(r.namespace, r.name): r for r in rows}
        rows = []
        for (ns, name), stats in sorted(by_key.items()):
            if target.name and name != target.name:
                continue
            if target.kind != AUTHORITY and target.kind != NAMESPACE and target.namespace and ns != target.namespace:
                continue
            base = known.get((ns, name))
            rows.append(Row(target.kind, ns, name, stats, base.meshed if base else None,
                            base.total if base else None))
        return rows
    for row in rows:
        row.stats = by_key.get((row.namespace, row.name))
    return rows


# -- stat-inbound ---------------------------------------------------------------------------------


def stat_inbound(prometheus: Prometheus, target: Target, window: str) -> list[Row]:
    """Per server, port and route of the inbound policy of ``target``'s proxies, as ``linkerd viz stat-inbound``."""
    if target.kind in (SERVICE, AUTHORITY):
        raise ValueError(f"stat-inbound shows what serves traffic (deploy, po, ns), not a {target.kind}")
    queries = promql.stat_inbound(target, window)

    def key(labels: Mapping[str, str]) -> tuple[str, ...]:
        server = "[default]" if labels.get("srv_kind") == "default" else labels.get("srv_name", "")
        route = "[default]" if labels.get("route_name") == "default" else labels.get("route_name", "")
        route_type = "" if labels.get("route_kind") == "default" else labels.get("route_kind", "")
        name = labels.get(target.label if target.kind != NAMESPACE else "namespace", "")
        return (labels.get("namespace", ""), name, server, labels.get("target_port", ""), route, route_type)

    by_key = fold(prometheus.query_all(queries.queries), key)
    return [Row(target.kind, ns, name, stats, extra={"server": server, "port": port, "route": route,
                                                      "route_type": route_type})
            for (ns, name, server, port, route, route_type), stats in sorted(by_key.items()) if stats.requests]


TIMEOUT_ERRORS = frozenset({"REQUEST_TIMEOUT", "RESPONSE_HEADERS_TIMEOUT"})


def stat_outbound(prometheus: Prometheus, target: Target, window: str) -> list[Row]:
    """What ``target``'s proxies sent per Service port and route of their client policy, as ``linkerd viz
    stat-outbound``: a row per route (success, latency, timeouts, retries), then one per backend it drew (its
    tries, and the success, latency and timeouts of their responses). A request or a try fails with a 5xx, a
    gRPC status other than OK, or an error of the proxy's (Linkerd's rule)."""
    if target.kind in (SERVICE, AUTHORITY):
        raise ValueError(f"stat-outbound shows what sends traffic (deploy, po, ns), not a {target.kind}")
    results = prometheus.query_all(promql.stat_outbound(target, window).queries)
    routes: dict[tuple[str, ...], Stats] = {}
    backends: dict[tuple[str, ...], dict[tuple[str, str], Stats]] = {}
    backend_quantiles = {v: k for k, v in promql.BACKEND_QUANTILES.items()}

    def outcome(stats: Stats, statuses: str, labels: Mapping[str, str], n: int) -> None:
        error = labels.get("error", "")
        failed = bool(error) or (labels.get("http_status", "").startswith("5") if statuses == "http"
                                 else labels.get("grpc_status") != "OK")
        if failed:
            stats.failure += n
        else:
            stats.success += n
        if error in TIMEOUT_ERRORS:
            stats.timeouts = (stats.timeouts or 0) + n

    def key(labels: Mapping[str, str]) -> tuple[str, ...]:
        route = "[default]" if labels.get("route_name") == "default" else labels.get("route_name", "")
        route_type = "" if labels.get("route_kind") == "default" else labels.get("route_kind", "")
        name = labels.get(target.label if target.kind != NAMESPACE else "namespace", "")
        return (labels.get("namespace", ""), name, labels.get("parent_name", ""), labels.get("parent_port", ""),
                route, route_type)

    backend_queries = (promql.BACKEND_REQUESTS, promql.BACKEND_HTTP_STATUSES, promql.BACKEND_GRPC_STATUSES,
                       *backend_quantiles)
    for name, samples in results.items():
        for sample in samples:
            labels, k = sample.labels, key(sample.labels)
            stats = routes.setdefault(k, Stats(timeouts=0, retries=0))
            if name in backend_queries:
                backend = (labels.get("backend_name", ""), labels.get("backend_port", ""))
                stats = backends.setdefault(k, {}).setdefault(backend, Stats(timeouts=0, attempts=0))
            if name in (promql.HTTP_STATUSES, promql.BACKEND_HTTP_STATUSES):
                outcome(stats, "http", labels, count(sample.value))
            elif name in (promql.GRPC_STATUSES, promql.BACKEND_GRPC_STATUSES):
                outcome(stats, "grpc", labels, count(sample.value))
            elif name == promql.RETRIES:
                stats.retries = (stats.retries or 0) + count(sample.value)
            elif name == promql.BACKEND_REQUESTS:
                stats.attempts = (stats.attempts or 0) + count(sample.value)
            elif name in promql.QUANTILES or name in backend_quantiles:
                quantile = backend_quantiles.get(name, name)
                stats.latency_ms[quantile] = None if math.isnan(sample.value) else sample.value * 1000
    rows = []
    for k, stats in sorted(routes.items()):
        if not stats.requests:
            continue
        ns, name, service, port, route, route_type = k
        base = {"service": service, "port": port, "route": route, "route_type": route_type}
        rows.append(Row(target.kind, ns, name, stats, extra={**base, "backend": "", "backend_port": ""}))
        for (backend, backend_port), drawn in sorted(backends.get(k, {}).items()):
            rows.append(Row(target.kind, ns, name, drawn,
                            extra={**base, "backend": backend, "backend_port": backend_port}))
    return rows


# -- TopRoutes ------------------------------------------------------------------------------------


def _pods_of(objects: Objects, target: Target) -> list[Obj]:
    pods = objects.list("Pod", None if target.kind == NAMESPACE else target.namespace)
    if target.kind == NAMESPACE:
        return [p for p in pods if not target.name or _name(p)[0] == target.name]
    if target.kind == POD:
        return [p for p in pods if not target.name or _name(p)[1] == target.name]
    if target.kind == DEPLOYMENT:
        wanted = [target.name] if target.name else []
        workloads = select(DEPLOYMENT, pods, deployments=objects.list("Deployment", target.namespace), names=wanted)
        names = {(p.namespace, p.name) for w in workloads for p in w.pods}
        return [p for p in pods if _name(p) in names]
    return []


def _services_for(objects: Objects, pods: Iterable[Obj]) -> list[Obj]:
    """Services whose selector picks any of the pods."""
    pods = list(pods)
    out = []
    for ns in sorted({_name(p)[0] for p in pods}):
        labels = [(p.get("metadata") or {}).get("labels") or {} for p in pods if _name(p)[0] == ns]
        for svc in objects.list("Service", ns):
            sel = (svc.get("spec") or {}).get("selector") or {}
            if sel and any(all(lbl.get(k) == v for k, v in sel.items()) for lbl in labels):
                out.append(svc)
    return out


def _profiles(objects: Objects, services: Iterable[Obj], client_ns: str | None, mesh: Mesh) -> dict[str, Obj | None]:
    """Profile name -> the ServiceProfile (the client namespace's first, as Linkerd looks them up), or None."""
    out: dict[str, Obj | None] = {}
    for svc in services:
        ns, name = _name(svc)
        fqdn = f"{name}.{ns}.svc.{mesh.cluster_domain}"
        found = None
        for look_in in ([client_ns] if client_ns else []) + [ns]:
            found = next((p for p in objects.list("ServiceProfile", look_in) if _name(p)[1] == fqdn), None)
            if found:
                break
        out[fqdn] = found
    return out


def top_routes(prometheus: Prometheus, objects: Objects, target: Target, window: str, *, to: Target | None = None,
               mesh: Mesh = Mesh()) -> list[Row]:
    """Per-route stats of the ServiceProfiles of what ``target`` serves (or of ``to``, as ``target``'s client).

    With ``to`` the counts are the client's (after retries) and the actual ones (each try) come with them.
    """
    if target.kind == AUTHORITY:
        raise ValueError("an authority cannot be the target of routes; use it with --to instead")
    if to is not None and target.kind == SERVICE:
        raise ValueError("a service sends no traffic: use the client's deploy or pod with --to")
    destination = to or target
    client_ns = target.namespace if to is not None else None
    if destination.kind == AUTHORITY:
        host = destination.name.rpartition(":")[0] if ":" in destination.name else destination.name
        candidates = [p for p in objects.list("ServiceProfile", client_ns)
                      if not host or _name(p)[1] == host]
        profiles: dict[str, Obj | None] = {_name(p)[1]: p for p in candidates}
    else:
        if destination.kind == SERVICE:
            services = [s for s in objects.list("Service", destination.namespace)
                        if not destination.name or _name(s)[1] == destination.name]
        else:
            services = _services_for(objects, _pods_of(objects, destination))
        profiles = _profiles(objects, services, client_ns, mesh)
    found = {k: v for k, v in profiles.items() if v is not None}
    if not found and to is not None and destination.kind != AUTHORITY:
        policy = _policy_routes(prometheus, objects, target, window, {_name(s) for s in services})
        if policy:
            return policy
    if not found and to is None and target.kind not in (SERVICE, AUTHORITY):
        served = _inbound_policy_routes(prometheus, objects, target, window)
        if served:
            return served
    if not found:
        where = f" in namespace {destination.namespace}" if destination.namespace else ""
        asked_policy = destination.kind != AUTHORITY and (to is not None or target.kind != SERVICE)
        also = " (nor an HTTPRoute or GRPCRoute of it, nor traffic on one)" if asked_policy else ""
        raise LookupError(f"no ServiceProfile found for {destination}{where}{also}")
    queries = promql.routes(target, window, sorted(found), to=to)
    results = prometheus.query_all(queries.queries)
    by_key = fold(results, lambda labels: (labels.get("dst", "").split(":")[0], labels.get("rt_route", "")))
    rows = []
    for fqdn, profile in sorted(found.items()):
        names = [str(r.get("name", "")) for r in ((profile or {}).get("spec") or {}).get("routes") or ()]
        for route in [*names, ""]:
            rows.append(Row("route", _name(profile or {})[0], route or DEFAULT_ROUTE, by_key.get((fqdn, route)),
                            extra={"authority": fqdn.split(".")[0], "profile": fqdn}))
    return rows


ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")  # the policy routes ``routes`` lists (both HTTPRoute groups)


def _declared_routes(objects: Objects, namespaces: Iterable[str], parent_kind: str,
                     parents: set[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """``(parent, namespace, name, kind)`` of the HTTPRoutes and GRPCRoutes in ``namespaces`` whose parentRefs name
    one of ``parents`` (``(namespace, name)`` of a ``parent_kind``; a ref's namespace defaults to the route's), in
    order: the routes the policy holds, whether or not they carried traffic."""
    found: set[tuple[str, str, str, str]] = set()
    for kind in ROUTE_KINDS:
        for ns in sorted(set(namespaces)):
            for route in objects.list(kind, ns):
                route_ns, name = _name(route)
                for ref in (route.get("spec") or {}).get("parentRefs") or ():
                    parent = (ref.get("namespace") or route_ns, ref.get("name"))
                    if ref.get("kind") == parent_kind and parent in parents:
                        found.add((str(parent[1]), route_ns, name, kind))
    return sorted(found)


def _servers_of(objects: Objects, pods: list[Obj]) -> set[tuple[str, str]]:
    """``(namespace, name)`` of the Servers whose podSelector picks any of ``pods``."""
    out: set[tuple[str, str]] = set()
    for ns in sorted({_name(p)[0] for p in pods}):
        labels = [(p.get("metadata") or {}).get("labels") or {} for p in pods if _name(p)[0] == ns]
        for server in objects.list("Server", ns):
            try:
                selector = LabelSelector.from_spec((server.get("spec") or {}).get("podSelector"), "spec.podSelector")
            except ValidationError:
                continue  # admission refuses it; nothing to show
            if any(selector.matches(lbl) for lbl in labels):
                out.add(_name(server))
    return out


def _inbound_policy_routes(prometheus: Prometheus, objects: Objects, target: Target, window: str) -> list[Row]:
    """Without a ServiceProfile or ``--to``, the routes of ``target``'s inbound policy (HTTPRoute, GRPCRoute,
    default) that served traffic in the window, from ``stat_inbound``'s rows: the SERVICE column is the Server;
    then, without figures, the routes of the Servers selecting its pods that served none."""
    rows = [Row("route", row.namespace, row.extra["route"], row.stats,
                extra={"authority": row.extra["server"], "route_type": row.extra["route_type"]})
            for row in stat_inbound(prometheus, target, window)]
    servers = _servers_of(objects, _pods_of(objects, target))
    return rows + _without_traffic(rows, _declared_routes(objects, {ns for ns, _ in servers}, "Server", servers))


def _without_traffic(rows: list[Row], declared: list[tuple[str, str, str, str]]) -> list[Row]:
    """Rows without figures for the ``declared`` routes (``_declared_routes``) that have no row in ``rows``."""
    seen = {(r.extra["authority"], r.name) for r in rows}
    return [Row("route", ns, name, None, extra={"authority": parent, "route_type": kind})
            for parent, ns, name, kind in declared if (parent, name) not in seen]


def _policy_routes(prometheus: Prometheus, objects: Objects, target: Target, window: str,
                   services: set[tuple[str, str]]) -> list[Row]:
    """Without a ServiceProfile, the client policy's routes (HTTPRoute, GRPCRoute, default) to ``services`` that
    carried traffic in the window, from the outbound route families (``stat_outbound``'s rows): effective success
    and latency per route, and its tries (the backends' requests and responses) as the actual rate and success;
    then, without figures, the Services' HTTPRoutes and GRPCRoutes (the producer's and the client namespace's)
    that carried none."""
    rows: list[Row] = []
    names = {name for _, name in services}
    for row in stat_outbound(prometheus, target, window):
        x = row.extra
        if x["service"] not in names or row.stats is None:
            continue
        if not x["backend"]:
            rows.append(Row("route", row.namespace, x["route"], row.stats,
                            extra={"authority": x["service"], "route_type": x["route_type"]}))
        elif rows and rows[-1].stats is not None:
            # The tries: what the backends were sent and answered (ACTUAL_SUCCESS), before retries hid failures.
            route = rows[-1].stats
            route.attempts = (route.attempts or 0) + (row.stats.attempts or 0)
            route.actual_success = (route.actual_success or 0) + row.stats.success
            route.actual_failure = (route.actual_failure or 0) + row.stats.failure
    namespaces = {ns for ns, _ in services} | ({target.namespace} if target.namespace else set())
    return rows + _without_traffic(rows, _declared_routes(objects, namespaces, "Service", services))


# -- Edges ----------------------------------------------------------------------------------------


def _identity(objects: Objects, namespace: str, pod_name: str, mesh: Mesh) -> str:
    pod = next((p for p in objects.list("Pod", namespace) if _name(p)[1] == pod_name), None)
    if pod is None:
        return ""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if MESHED_LABEL not in labels:
        return ""
    sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    try:
        return WorkloadIdentity(sa, namespace, mesh.control_plane_ns, mesh.trust_domain).dns_name
    except InvalidName:
        return ""


def edges(prometheus: Prometheus, objects: Objects, kind: str, namespace: str | None,
          mesh: Mesh = Mesh()) -> list[Edge]:
    """Who holds open connections to whom among resources of ``kind``, with both identities or why not mTLS."""
    if kind not in (DEPLOYMENT, POD):
        raise ValueError(f"edges are shown between deployments or pods, not {kind}s")
    query = promql.edges(kind)
    (samples,) = prometheus.query_all(query.queries).values()
    out: dict[tuple[str, str, str, str], Edge] = {}
    dst_label = f"dst_{kind}"
    for s in samples:
        if s.value == 0:
            continue
        src_ns, dst_ns = s.labels.get("namespace", ""), s.labels.get("dst_namespace", "")
        if namespace is not None and namespace not in (src_ns, dst_ns):
            continue
        key = (src_ns, s.labels.get(kind, ""), dst_ns, s.labels.get(dst_label, ""))
        if key in out:
            continue
        out[key] = Edge(src_ns, key[1], dst_ns, key[3], kind,
                        _identity(objects, src_ns, s.labels.get("pod", ""), mesh),
                        s.labels.get("server_id", ""),
                        NO_TLS_MESSAGES.get(s.labels.get("no_tls_reason", ""), s.labels.get("no_tls_reason", "")))
    return [out[k] for k in sorted(out)]


# -- Authz ----------------------------------------------------------------------------------------


def authz(prometheus: Prometheus, target: Target, window: str) -> list[Row]:
    """Requests to ``target`` per server, route and authorization of its inbound policy, allowed and denied."""
    if target.kind in (SERVICE, AUTHORITY):
        raise ValueError(f"authz is shown for what serves traffic (deploy, po, ns), not a {target.kind}")
    queries = promql.authz(target, window)
    results = prometheus.query_all(queries.queries)
    by_key = fold(results, lambda labels: tuple(labels.get(k, "") for k in promql.AUTHZ_GROUP))
    rows = []
    for key, stats in sorted(by_key.items()):
        extra = dict(zip(promql.AUTHZ_GROUP, key, strict=True))
        rows.append(Row("authz", target.namespace or "", target.name, stats, extra=extra))
    return rows
