"""The PromQL of Linkerd viz's metrics API, one builder per question (control-plane reference §9).

| question | series | grouped by |
|---|---|---|
| stat (inbound) | ``response_total``, ``response_latency_ms_bucket``, ``tcp_*`` with ``direction="inbound"`` | ``namespace``, the kind's label |
| stat ``--to`` | the same with ``direction="outbound"`` and ``dst_<kind>``/``dst_namespace`` | the source's labels |
| stat ``--from`` | ``direction="outbound"`` of the source's pods | ``dst_namespace``, ``dst_<kind>`` |
| stat-inbound | ``response_total``, ``response_latency_ms_bucket`` with ``direction="inbound"`` | ``srv_*``, ``route_*``, ``target_port``, the kind's label |
| stat-outbound | ``outbound_{http,grpc}_route_request_statuses_total``, ``..._request_duration_seconds_bucket``, ``..._retry_requests_total``, ``..._backend_requests_total``, ``..._backend_response_statuses_total``, ``..._backend_response_duration_seconds_bucket`` | ``parent_name``, ``parent_port``, ``route_name``, ``route_kind`` (``backend_*``), the kind's label |
| stat svc | ``direction="outbound"``, ``authority=~"^<svc>.<ns>.svc.<domain>.+"`` | ``dst_namespace``, ``dst_service`` |
| routes | ``route_response_total``, ``route_actual_response_total``, ``route_response_latency_ms_bucket`` | ``rt_route``, ``dst`` |
| edges | ``tcp_open_connections{direction="outbound"}`` | both sides' labels, ``pod``, ``server_id``, ``no_tls_reason`` |
| authz | ``response_total`` and ``inbound_http_authz_{allow,deny}_total`` | ``route_*``, ``authz_*``, ``srv_*`` |

Counts are ``sum(increase(...[window]))``; latencies are
``histogram_quantile(q, sum(irate(..._bucket[window])) by (le, ...))`` for
p50, p95 and p99.  Label sets are rendered sorted, so a query is a stable
string (tests compare them).

Pure.  Callers: ``tether.viz.metrics_api``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tether.viz.targets import AUTHORITY, NAMESPACE, SERVICE, Target

QUANTILES = ("0.5", "0.95", "0.99")

REQUESTS = "requests"
ACTUAL_REQUESTS = "actual_requests"
TCP_CONNECTIONS = "tcp_connections"
TCP_READ = "tcp_read_bytes"
TCP_WRITE = "tcp_write_bytes"
ALLOWED = "allowed"
DENIED = "denied"
HTTP_STATUSES = "http_statuses"
GRPC_STATUSES = "grpc_statuses"
RETRIES = "retries"
BACKEND_REQUESTS = "backend_requests"
BACKEND_HTTP_STATUSES = "backend_http_statuses"
BACKEND_GRPC_STATUSES = "backend_grpc_statuses"
BACKEND_QUANTILES = {q: f"backend_{q}" for q in QUANTILES}  # a backend's response latency, by quantile

AUTHZ_GROUP = ("route_kind", "route_name", "authz_kind", "authz_name", "srv_kind", "srv_name")


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: ``name="v"``, ``name!="v"``, ``name=~"re"``."""

    name: str
    value: str
    op: str = "="

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


def selector(labels: Mapping[str, str], *extra: Matcher) -> str:
    """``{a="x", b!=""}``: equality matchers from ``labels`` and the extra ones, sorted."""
    parts = sorted([str(Matcher(k, v)) for k, v in labels.items()] + [str(m) for m in extra])
    return "{" + ", ".join(parts) + "}"


def by(names: Sequence[str]) -> str:
    return ", ".join(names)


@dataclass(frozen=True, slots=True)
class QuerySet:
    """Named queries (``requests``, ``tcp_connections``, the quantiles ...) and the labels rows are keyed by."""

    queries: Mapping[str, str]
    group_by: tuple[str, ...]


# -- label sets of a resource -------------------------------------------------------------------


def query_labels(target: Target) -> dict[str, str]:
    """The resource as a source: ``deployment="web", namespace="emojivoto"`` (Linkerd's promQueryLabels)."""
    out: dict[str, str] = {}
    if target.name and target.kind != SERVICE:
        out[target.label] = target.name
    if target.kind != NAMESPACE and target.namespace:
        out["namespace"] = target.namespace
    return out


def dst_query_labels(target: Target) -> dict[str, str]:
    """The resource as a destination: ``dst_deployment="web", dst_namespace="emojivoto"``."""
    out: dict[str, str] = {}
    if target.name:
        if target.kind == AUTHORITY:
            out[AUTHORITY] = target.name
        else:
            out[f"dst_{target.label}"] = target.name
            if target.kind != NAMESPACE and target.namespace:
                out["dst_namespace"] = target.namespace
    return out


def group_by(target: Target) -> tuple[str, ...]:
    return ("namespace",) if target.kind == NAMESPACE else ("namespace", target.label)


def dst_group_by(target: Target) -> tuple[str, ...]:
    if target.kind == AUTHORITY:
        return ("dst_namespace", AUTHORITY)
    return ("dst_namespace",) if target.kind == NAMESPACE else ("dst_namespace", f"dst_{target.label}")


# -- stat -----------------------------------------------------------------------------------------


def _golden(labels: str, window: str, group: tuple[str, ...]) -> dict[str, str]:
    g = by(group)
    out = {REQUESTS: f"sum(increase(response_total{labels}[{window}])) by ({g}, classification, tls)"}
    for q in QUANTILES:
        out[q] = f"histogram_quantile({q}, sum(irate(response_latency_ms_bucket{labels}[{window}])) by (le, {g}))"
    return out


def stat(target: Target, window: str, *, to: Target | None = None, from_: Target | None = None,
         cluster_domain: str = "cluster.local") -> QuerySet:
    """Golden metrics (and TCP figures) of ``target``, inbound, or on the edge ``--to``/``--from`` another."""
    if target.kind == SERVICE or (to is not None and to.kind == SERVICE):
        return _service_stat(target, window, to=to, from_=from_, cluster_domain=cluster_domain)
    if to is not None:
        group = group_by(target)
        labels = {**dst_query_labels(to), **query_labels(target), "direction": "outbound"}
        peer = "dst"
    elif from_ is not None:
        group = dst_group_by(target)
        labels = {**query_labels(from_), **dst_query_labels(target), "direction": "outbound"}
        peer = "dst"
    else:
        group = group_by(target)
        labels = {**query_labels(target), "direction": "inbound"}
        peer = "src"
    rendered = selector(labels)
    queries = _golden(rendered, window, group)
    if target.kind != AUTHORITY:
        g = by(group)
        tcp = selector({**labels, "peer": peer})
        queries[TCP_CONNECTIONS] = f"sum(tcp_open_connections{rendered}) by ({g})"
        queries[TCP_READ] = f"sum(increase(tcp_read_bytes_total{tcp}[{window}])) by ({g})"
        queries[TCP_WRITE] = f"sum(increase(tcp_write_bytes_total{tcp}[{window}])) by ({g})"
    return QuerySet(queries, group)


def _service_stat(target: Target, window: str, *, to: Target | None, from_: Target | None,
                  cluster_domain: str) -> QuerySet:
    """A service's traffic is what its clients sent to its authority (a service has no proxy of its own)."""
    labels: dict[str, str] = {"direction": "outbound"}
    service = target
    if to is not None:
        service = to
        labels.update(query_labels(target))
    elif from_ is not None:
        labels.update(query_labels(from_))
    name = service.name or "[^.]+"
    namespace = service.namespace or "[^.]+"
    authority = Matcher(AUTHORITY, f"^{name}\\.{namespace}\\.svc\\.{cluster_domain}.+", "=~")
    group = ("dst_namespace", "dst_service") if to is None else group_by(target)
    return QuerySet(_golden(selector(labels, authority), window, group), group)


# -- stat-inbound ---------------------------------------------------------------------------------

INBOUND_GROUP = ("srv_name", "srv_kind", "route_name", "route_kind", "target_port")


def stat_inbound(target: Target, window: str) -> QuerySet:
    """What ``target``'s proxies served, per server, port and route of their inbound policy (``stat-inbound``)."""
    rendered = selector({**query_labels(target), "direction": "inbound"})
    group = INBOUND_GROUP + group_by(target)
    g = by(group)
    queries = {REQUESTS: f"sum(increase(response_total{rendered}[{window}])) by ({g}, classification)"}
    for q in QUANTILES:
        queries[q] = f"histogram_quantile({q}, sum(irate(response_latency_ms_bucket{rendered}[{window}])) by (le, {g}))"
    return QuerySet(queries, group)


# -- stat-outbound --------------------------------------------------------------------------------

OUTBOUND_GROUP = ("parent_name", "parent_port", "route_name", "route_kind")


def stat_outbound(target: Target, window: str) -> QuerySet:
    """What ``target``'s proxies sent, per Service (port) and route of their client policy (``stat-outbound``):
    Linkerd 2.20's outbound route families, HTTP and gRPC (a route is of one or the other)."""
    rendered = selector(query_labels(target))
    group = OUTBOUND_GROUP + group_by(target)
    g = by(group)

    def both(expr: str) -> str:  # ``PROTO`` in ``expr`` stands for http, then grpc
        return f"{expr.replace('PROTO', 'http')} or {expr.replace('PROTO', 'grpc')}"

    queries = {
        HTTP_STATUSES: f"sum(increase(outbound_http_route_request_statuses_total{rendered}[{window}])) "
                       f"by ({g}, http_status, error)",
        GRPC_STATUSES: f"sum(increase(outbound_grpc_route_request_statuses_total{rendered}[{window}])) "
                       f"by ({g}, grpc_status, error)",
        RETRIES: both(f"sum(increase(outbound_PROTO_route_retry_requests_total{rendered}[{window}])) by ({g})"),
        BACKEND_REQUESTS: both(f"sum(increase(outbound_PROTO_route_backend_requests_total{rendered}[{window}])) "
                               f"by ({g}, backend_name, backend_port)"),
        # Each try's response, under the backend that answered it: the backend rows' success and latency.
        BACKEND_HTTP_STATUSES: f"sum(increase(outbound_http_route_backend_response_statuses_total{rendered}"
                               f"[{window}])) by ({g}, backend_name, backend_port, http_status, error)",
        BACKEND_GRPC_STATUSES: f"sum(increase(outbound_grpc_route_backend_response_statuses_total{rendered}"
                               f"[{window}])) by ({g}, backend_name, backend_port, grpc_status, error)",
    }
    for q in QUANTILES:  # seconds, as the route families measure
        queries[q] = both(f"histogram_quantile({q}, sum(irate(outbound_PROTO_route_request_duration_seconds_bucket"
                          f"{rendered}[{window}])) by (le, {g}))")
        queries[BACKEND_QUANTILES[q]] = both(
            f"histogram_quantile({q}, sum(irate(outbound_PROTO_route_backend_response_duration_seconds_bucket"
            f"{rendered}[{window}])) by (le, {g}, backend_name, backend_port))")
    return QuerySet(queries, group)


# -- routes ---------------------------------------------------------------------------------------


def routes(target: Target, window: str, dsts: Sequence[str], *, to: Target | None = None) -> QuerySet:
    """Per-route figures of the profiles ``dsts`` (their names, ``web.ns.svc.cluster.local``)."""
    direction = "outbound" if to is not None else "inbound"
    labels = {**query_labels(target), "direction": direction}
    extra = [Matcher("dst", f"({'|'.join(dsts)})(:\\d+)?", "=~")] if dsts else []
    rendered = selector(labels, *extra)
    group = ("rt_route",)
    queries = {REQUESTS: f"sum(increase(route_response_total{rendered}[{window}])) by (rt_route, dst, classification)"}
    if to is not None:
        queries[ACTUAL_REQUESTS] = (f"sum(increase(route_actual_response_total{rendered}[{window}])) "
                                    "by (rt_route, dst, classification)")
    for q in QUANTILES:
        queries[q] = (f"histogram_quantile({q}, sum(irate(route_response_latency_ms_bucket{rendered}[{window}])) "
                      "by (le, dst, rt_route))")
    return QuerySet(queries, group)


# -- edges ----------------------------------------------------------------------------------------


def edges(kind_label: str) -> QuerySet:
    """Open outbound connections between resources of one kind, with the server identity or why not mTLS."""
    dst = f"dst_{kind_label}"
    labels = selector({"direction": "outbound"}, Matcher(kind_label, "", "!="), Matcher(dst, "", "!="))
    group = (kind_label, dst, "pod", "server_id", "namespace", "dst_namespace", "no_tls_reason")
    return QuerySet({TCP_CONNECTIONS: f"sum(tcp_open_connections{labels}) by ({by(group)})"}, group)


# -- authz ----------------------------------------------------------------------------------------


def authz(target: Target, window: str) -> QuerySet:
    """Requests per route, server and authorization of the target's inbound policy, and allow/deny counts."""
    labels = query_labels(target)
    inbound = selector({**labels, "direction": "inbound"})
    plain = selector(labels)
    g = by(AUTHZ_GROUP)
    queries = _golden(inbound, window, AUTHZ_GROUP)
    queries[ALLOWED] = f"sum(increase(inbound_http_authz_allow_total{plain}[{window}])) by ({g})"
    queries[DENIED] = f"sum(increase(inbound_http_authz_deny_total{plain}[{window}])) by ({g})"
    return QuerySet(queries, AUTHZ_GROUP)
