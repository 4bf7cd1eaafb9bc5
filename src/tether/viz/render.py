"""``StatRow``s as table cells (``linkerd viz stat``'s columns) and as JSON.

Columns: [NAMESPACE] NAME MESHED SUCCESS RPS LATENCY_P50 LATENCY_P95
LATENCY_P99 TCP_CONN MTLS, and with ``wide`` READ_BYTES/SEC WRITE_BYTES/SEC
CLIENTS.  Formats follow Linkerd's: ``92.50%``, ``3.9rps``, ``2ms``; MTLS is
the share of inbound connections that are mTLS (``100%``); CLIENTS lists who
holds the open inbound connections -- the service-account name of each mTLS
peer (``web.emojivoto``), or ``plaintext (<reason>)``.  "-" means unknown.

Pure.  Callers: ``tether.cli.stat_cmd``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.viz.proxy_metrics import Client
from tether.viz.stat import StatRow
from tether.viz.tables import DASH, bytes_rate, latency, number, percent, plain, rps
from tether.viz.window import Golden
from tether.viz.workloads import NAMESPACE

COLUMNS = ("NAME", "MESHED", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99", "TCP_CONN", "MTLS")
WIDE_COLUMNS = ("READ_BYTES/SEC", "WRITE_BYTES/SEC", "CLIENTS")
count = number  # the old name, for the stat table


def client_name(client: Client) -> str:
    """``web.emojivoto`` for an mTLS identity ``web.emojivoto.serviceaccount.identity...``."""
    tls, detail = client
    if tls == "true":
        return detail.split(".serviceaccount.", 1)[0] if detail else "mTLS (no client identity)"
    if tls == "no_identity":
        return f"plaintext ({detail})" if detail else "plaintext"
    if tls == "opaque":
        return f"TLS passthrough ({detail})"
    return tls or "unknown"


def clients(g: Golden) -> str:
    if not g.clients:
        return DASH
    parts = sorted(f"{client_name(c)}" + (f"×{n:.0f}" if n > 1 else "") for c, n in g.clients.items() if n > 0)
    return ", ".join(parts) or DASH


def header(*, all_namespaces: bool, wide: bool) -> list[str]:
    return (["NAMESPACE"] if all_namespaces else []) + list(COLUMNS) + (list(WIDE_COLUMNS) if wide else [])


def cells(row: StatRow, *, all_namespaces: bool, wide: bool) -> list[str]:
    w, g = row.workload, row.golden
    p50, p95, p99 = g.latency_ms
    out = [w.name, f"{w.meshed}/{w.total}", percent(g.success_rate), rps(g.rps), latency(p50), latency(p95),
           latency(p99), count(g.tcp_open), percent(g.mtls, 0)]
    if all_namespaces:
        out.insert(0, w.namespace)
    if wide:
        out += [bytes_rate(g.read_rate), bytes_rate(g.write_rate), clients(g)]
    return out


def table(rows: Sequence[StatRow], *, all_namespaces: bool, wide: bool) -> list[list[str]]:
    """The header row and one row per workload (of one kind)."""
    return [header(all_namespaces=all_namespaces, wide=wide)] + [
        cells(r, all_namespaces=all_namespaces, wide=wide) for r in rows]


def tables(rows: Sequence[StatRow], *, all_namespaces: bool, wide: bool) -> list[tuple[str, list[list[str]]]]:
    """One ``(kind, grid)`` per kind, in the order the kinds first appear; namespaces get no NAMESPACE column."""
    kinds: dict[str, list[StatRow]] = {}
    for r in rows:
        kinds.setdefault(r.workload.kind, []).append(r)
    return [(kind, table(members, all_namespaces=all_namespaces and kind != NAMESPACE, wide=wide))
            for kind, members in kinds.items()]


def plain_tables(rows: Sequence[StatRow], *, all_namespaces: bool, wide: bool) -> str:
    """Every kind's table as text; with several kinds each is headed by its kind, as in ``linkerd viz stat``."""
    grids = tables(rows, all_namespaces=all_namespaces, wide=wide)
    if len(grids) == 1:
        return plain(grids[0][1])
    return "\n\n".join(f"==> {kind} <==\n{plain(grid)}" for kind, grid in grids)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def as_json(row: StatRow) -> dict[str, Any]:
    """One row as ``linkerd viz stat -o json`` names its fields, plus mTLS and clients."""
    w, g = row.workload, row.golden
    p50, p95, p99 = g.latency_ms
    return {
        "namespace": w.namespace,
        "kind": w.kind,
        "name": w.name,
        "meshed": f"{w.meshed}/{w.total}",
        "success": _round(g.success_rate, 6),
        "rps": _round(g.rps, 3),
        "latency_ms_p50": _round(p50, 3),
        "latency_ms_p95": _round(p95, 3),
        "latency_ms_p99": _round(p99, 3),
        "tcp_open_connections": None if g.tcp_open is None else int(g.tcp_open),
        "tcp_read_bytes_rate": _round(g.read_rate, 3),
        "tcp_write_bytes_rate": _round(g.write_rate, 3),
        "mtls": _round(g.mtls, 6),
        "clients": [{"tls": c[0], "identity" if c[0] == "true" else "detail": c[1], "open": int(n)}
                    for c, n in sorted(g.clients.items())],
        "errors": list(row.errors),
    }
