"""The metrics API's rows as ``linkerd viz`` prints them: table cells and JSON.

Formats follow Linkerd's: ``92.50%``, ``3.9rps``, ``2ms``, ``-`` for unknown.

| command | columns (``-o wide`` adds) |
|---|---|
| stat | [NAMESPACE] NAME MESHED SUCCESS RPS LATENCY_P50 LATENCY_P95 LATENCY_P99 TCP_CONN (READ_BYTES/SEC WRITE_BYTES/SEC MTLS) |
| routes | ROUTE SERVICE SUCCESS RPS LATENCY_P50 LATENCY_P95 LATENCY_P99; with --to wide: EFFECTIVE_SUCCESS EFFECTIVE_RPS ACTUAL_SUCCESS ACTUAL_RPS |
| edges | SRC DST SRC_NS DST_NS SECURED (CLIENT_ID SERVER_ID MSG) |
| stat-inbound | NAME SERVER ROUTE TYPE SUCCESS RPS LATENCY_P50 LATENCY_P95 LATENCY_P99 |
| authz | SERVER ROUTE AUTHORIZATION ALLOWED DENIED SUCCESS RPS LATENCY_P50 LATENCY_P95 LATENCY_P99 |
| tap | one line per event: ``req``/``rsp``/``end id=<base>:<stream> proxy=in|out src= dst= tls= ...`` |

Pure.  Callers: the ``tether viz`` CLI and the dashboard (JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.api import http_types_pb2, tap_pb2
from tether.api.addresses import InvalidAddress, from_tcp_address
from tether.viz.metrics_api import Edge, Row, Stats

DASH = "-"
LATENCY_COLUMNS = ("LATENCY_P50", "LATENCY_P95", "LATENCY_P99")


def percent(value: float | None, digits: int = 2) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def rps(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}rps"


def latency(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.0f}ms" if value >= 1 else f"{value:.1f}ms"


def number(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}"


def bytes_rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}B/s"


def _rate(n: int | None, seconds: float) -> float | None:
    return None if n is None else n / seconds


def _golden(stats: Stats | None, seconds: float) -> list[str]:
    if stats is None:
        return [DASH] * 5
    return [percent(stats.success_rate()), rps(stats.requests / seconds),
            *(latency(stats.latency_ms.get(q)) for q in ("0.5", "0.95", "0.99"))]


def meshed(row: Row) -> str:
    return DASH if row.total is None else f"{row.meshed}/{row.total}"


def stat_table(rows: Sequence[Row], seconds: float, *, all_namespaces: bool, wide: bool) -> list[list[str]]:
    header = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "MESHED", "SUCCESS", "RPS", *LATENCY_COLUMNS,
                                                        "TCP_CONN"]
    if wide:
        header += ["READ_BYTES/SEC", "WRITE_BYTES/SEC", "MTLS"]
    out = [header]
    for r in rows:
        s = r.stats
        cells = ([r.namespace] if all_namespaces else []) + [r.name, meshed(r), *_golden(s, seconds),
                                                             number(s.tcp_open if s else None)]
        if wide:
            cells += [bytes_rate(_rate(s.read_bytes, seconds) if s else None),
                      bytes_rate(_rate(s.write_bytes, seconds) if s else None),
                      percent(s.mtls_share() if s else None, 0)]
        out.append(cells)
    return out


def routes_table(rows: Sequence[Row], seconds: float, *, outbound: bool, wide: bool) -> list[list[str]]:
    if outbound and wide:
        header = ["ROUTE", "SERVICE", "EFFECTIVE_SUCCESS", "EFFECTIVE_RPS", "ACTUAL_SUCCESS", "ACTUAL_RPS",
                  *LATENCY_COLUMNS]
    else:
        header = ["ROUTE", "SERVICE", "SUCCESS", "RPS", *LATENCY_COLUMNS]
    out = [header]
    for r in rows:
        s = r.stats
        golden = _golden(s, seconds)
        cells = [r.name, r.extra.get("authority", "")]
        if outbound and wide:
            # A profile's route counts each try's response; a client-policy route, each try sent (its backends').
            actual_total = None if s is None else (s.attempts if s.actual_success is None else
                                                   s.actual_success + (s.actual_failure or 0))
            cells += golden[:2] + [percent(s.actual_success_rate() if s else None),
                                   rps(_rate(actual_total, seconds))] + golden[2:]
        else:
            cells += golden
        out.append(cells)
    return out


def stat_inbound_table(rows: Sequence[Row], seconds: float) -> list[list[str]]:
    out = [["NAME", "SERVER", "ROUTE", "TYPE", "SUCCESS", "RPS", *LATENCY_COLUMNS]]
    for r in rows:
        x = r.extra
        out.append([r.name, f"{x['server']}:{x['port']}", x["route"], x["route_type"], *_golden(r.stats, seconds)])
    return out


def stat_outbound_table(rows: Sequence[Row], seconds: float) -> list[list[str]]:
    """Linkerd's layout: a route's row, then an arrow to each backend it drew (``└`` for the last)."""
    out = [["NAME", "SERVICE", "ROUTE", "TYPE", "BACKEND", "SUCCESS", "RPS", *LATENCY_COLUMNS, "TIMEOUTS", "RETRIES"]]
    for i, r in enumerate(rows):
        x, s = r.extra, r.stats
        assert s is not None
        if not x["backend"]:
            tried = s.requests + (s.retries or 0)
            out.append([r.name, f"{x['service']}:{x['port']}", x["route"], x["route_type"], "",
                        *_golden(s, seconds), percent((s.timeouts or 0) / s.requests if s.requests else None),
                        percent((s.retries or 0) / tried if tried else None)])
            continue
        last = i + 1 == len(rows) or not rows[i + 1].extra["backend"]
        arrow = ("└" if last else "├") + "─" * max(0, len(x["route"]) - 1)
        answered = s.requests  # tries that ended (answered, or failed with an error of the proxy's)
        out.append(["", "", arrow, "────────►", f"{x['backend']}:{x['backend_port']}", percent(s.success_rate()),
                    rps(_rate(s.attempts, seconds)), *(latency(s.latency_ms.get(q)) for q in ("0.5", "0.95", "0.99")),
                    percent((s.timeouts or 0) / answered if answered else None), ""])
    return out


def secured(edge: Edge) -> str:
    return "√" if edge.server_id else (edge.no_tls_reason or "no identity")


def short_identity(identity: str) -> str:
    """``web.emojivoto`` for ``web.emojivoto.serviceaccount.identity.linkerd.cluster.local``."""
    return identity.split(".serviceaccount.", 1)[0] if identity else DASH


def edges_table(edges: Sequence[Edge], *, wide: bool) -> list[list[str]]:
    header = ["SRC", "DST", "SRC_NS", "DST_NS", "SECURED"] + (["CLIENT_ID", "SERVER_ID", "MSG"] if wide else [])
    out = [header]
    for e in edges:
        cells = [e.src, e.dst, e.src_namespace, e.dst_namespace, secured(e)]
        if wide:
            cells += [short_identity(e.client_id), short_identity(e.server_id), e.no_tls_reason or DASH]
        out.append(cells)
    return out


def authz_table(rows: Sequence[Row], seconds: float) -> list[list[str]]:
    out = [["SERVER", "ROUTE", "AUTHORIZATION", "ALLOWED", "DENIED", "SUCCESS", "RPS", *LATENCY_COLUMNS]]
    for r in rows:
        s, x = r.stats, r.extra
        out.append([f"{x.get('srv_kind') or DASH}/{x.get('srv_name') or DASH}",
                    f"{x.get('route_kind') or DASH}/{x.get('route_name') or DASH}",
                    f"{x.get('authz_kind') or DASH}/{x.get('authz_name') or DASH}",
                    rps(_rate(s.allowed, seconds) if s else None), rps(_rate(s.denied, seconds) if s else None),
                    *_golden(s, seconds)])
    return out


def plain(grid: Sequence[Sequence[str]]) -> str:
    """Cells aligned in columns three spaces apart, as ``tether get`` prints them."""
    widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in grid)


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def stats_json(s: Stats | None, seconds: float) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "success_count": s.success, "failure_count": s.failure, "success": _r(s.success_rate()),
        "rps": _r(s.requests / seconds, 3), "mtls_share": _r(s.mtls_share()),
        "latency_ms_p50": _r(s.latency_ms.get("0.5"), 3), "latency_ms_p95": _r(s.latency_ms.get("0.95"), 3),
        "latency_ms_p99": _r(s.latency_ms.get("0.99"), 3),
        "tcp_open_connections": s.tcp_open, "tcp_read_bytes": s.read_bytes, "tcp_write_bytes": s.write_bytes,
        "actual_success_count": s.actual_success, "actual_failure_count": s.actual_failure,
        "allowed_count": s.allowed, "denied_count": s.denied,
        "timeout_count": s.timeouts, "retry_count": s.retries, "backend_request_count": s.attempts,
    }


def row_json(r: Row, seconds: float) -> dict[str, Any]:
    return {"kind": r.kind, "namespace": r.namespace, "name": r.name,
            "meshed": None if r.total is None else f"{r.meshed}/{r.total}", **r.extra,
            "stats": stats_json(r.stats, seconds)}


def edge_json(e: Edge) -> dict[str, Any]:
    return {"kind": e.kind, "src": e.src, "src_namespace": e.src_namespace, "dst": e.dst,
            "dst_namespace": e.dst_namespace, "client_id": e.client_id, "server_id": e.server_id,
            "no_tls_reason": e.no_tls_reason, "secured": bool(e.server_id)}


def _addr(addr: Any) -> str:
    try:
        ip, port = from_tcp_address(addr)
    except (InvalidAddress, ValueError):
        return DASH
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _micros(duration: Any) -> int:
    return int(duration.ToNanoseconds() // 1000)


def method_name(method: http_types_pb2.HttpMethod) -> str:
    """A tap event's method as text: ``GET``, or the unregistered one as sent."""
    if method.WhichOneof("type") == "unregistered":
        return method.unregistered
    return http_types_pb2.HttpMethod.Registered.Name(method.registered)


SHORT_KINDS = {"deployment": "deploy", "pod": "po", "namespace": "ns"}


def _resources(event: tap_pb2.TapEvent, kind: str) -> str:
    """``-o wide``'s tail, as ``linkerd viz tap`` prints it: each peer's resource of the tapped ``kind`` (else its
    pod) and namespace, then the route's labels."""
    out = ""
    for direction, meta in (("src", event.source_meta), ("dst", event.destination_meta)):
        labels = meta.labels
        if kind in labels:
            out += f" {direction}_res={SHORT_KINDS.get(kind, kind)}/{labels[kind]}"
        elif "pod" in labels:
            out += f" {direction}_pod={labels['pod']}"
        if kind != "namespace" and "namespace" in labels:
            out += f" {direction}_ns={labels['namespace']}"
    return out + "".join(f" rt_{k}={v}" for k, v in sorted(event.route_meta.labels.items()))


def tap_line(event: tap_pb2.TapEvent, wide_kind: str | None = None) -> str:
    """One event as ``linkerd viz tap`` prints it; with ``wide_kind`` (the tapped resource's kind: ``deployment``,
    ``pod``, ``namespace``) as ``-o wide`` prints it."""
    inbound = event.proxy_direction == tap_pb2.TapEvent.INBOUND
    meta = event.source_meta if inbound else event.destination_meta
    head = (f"proxy={'in' if inbound else 'out'} src={_addr(event.source)} dst={_addr(event.destination)} "
            f"tls={meta.labels.get('tls', '')}")
    tail = _resources(event, wide_kind) if wide_kind else ""
    kind = event.http.WhichOneof("event")
    if kind == "request_init":
        r = event.http.request_init
        return (f"req id={r.id.base}:{r.id.stream} {head} :method={method_name(r.method)} :authority={r.authority} "
                f":path={r.path}{tail}")
    if kind == "response_init":
        r = event.http.response_init
        return (f"rsp id={r.id.base}:{r.id.stream} {head} :status={r.http_status} "
                f"latency={_micros(r.since_request_init)}µs{tail}")
    if kind == "response_end":
        r = event.http.response_end
        end = r.eos.WhichOneof("end")
        eos = (f" grpc-status={r.eos.grpc_status_code}" if end == "grpc_status_code"
               else f" reset-error={r.eos.reset_error_code}" if end == "reset_error_code" else "")
        return (f"end id={r.id.base}:{r.id.stream} {head}{eos} duration={_micros(r.since_response_init)}µs "
                f"response-length={r.response_bytes}B{tail}")
    return f"unknown event {head}"
