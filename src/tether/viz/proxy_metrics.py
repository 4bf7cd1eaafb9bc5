"""One scrape of one proxy, reduced to the counters ``stat`` needs (Linkerd's legacy metric names).

What is read (proxy reference §9.2, §9.3), inbound only -- a workload's stats
are what its own proxies served, as in ``linkerd viz stat``:

| counter | series |
|---|---|
| ``success`` / ``failure`` | ``response_total{direction="inbound",classification=...}`` |
| ``latency`` | ``response_latency_ms_bucket{direction="inbound"}``, summed by ``le`` |
| ``tcp_opened`` / ``tcp_open`` | ``tcp_open_total`` / ``tcp_open_connections{direction="inbound",peer="src"}`` |
| ``read_bytes`` / ``write_bytes`` | ``tcp_{read,write}_bytes_total{direction="inbound",peer="src"}`` |
| ``clients`` | open inbound connections by TLS status and client identity |
| ``start_time`` | ``process_start_time_seconds`` (a new value means the counters restarted) |

Series whose ``target_port`` is the proxy's own admin or tap port (4191,
4190) are left out, so the scrapes that feed this view, and probes, are not
counted as the workload's traffic.  ``has_requests`` says whether the proxy
exports request metrics at all (older proxies have only the TCP family); when
it does not, stat shows "-" for the request columns.

Pure.  Callers: ``tether.viz.scrape`` (after parsing), ``tether.viz.window``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.viz.exposition import Exposition

ADMIN_PORTS = frozenset({"4190", "4191"})

RESPONSE_TOTAL = "response_total"
REQUEST_TOTAL = "request_total"
LATENCY_BUCKET = "response_latency_ms_bucket"
TCP_OPEN_TOTAL = "tcp_open_total"
TCP_OPEN_CONNECTIONS = "tcp_open_connections"
TCP_READ = "tcp_read_bytes_total"
TCP_WRITE = "tcp_write_bytes_total"
START_TIME = "process_start_time_seconds"

# A client as its connections' TLS labels name it: ("true", client id), ("no_identity", reason), ...
Client = tuple[str, str]


@dataclass(slots=True)
class PodCounters:
    start_time: float | None = None
    has_requests: bool = False
    success: float = 0.0
    failure: float = 0.0
    latency: dict[float, float] = field(default_factory=dict)  # le (ms) -> cumulative count
    tcp_opened: float = 0.0
    tcp_opened_mtls: float = 0.0
    tcp_open: float = 0.0
    tcp_open_mtls: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    clients: dict[Client, float] = field(default_factory=dict)  # open inbound connections

    @classmethod
    def from_exposition(cls, exp: Exposition) -> PodCounters:
        out = cls()
        for s in exp.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == START_TIME:
                out.start_time = value
                continue
            if labels.get("direction") != "inbound" or labels.get("target_port") in ADMIN_PORTS:
                continue
            if name == RESPONSE_TOTAL:
                out.has_requests = True
                if labels.get("classification") == "success":
                    out.success += value
                else:
                    out.failure += value
            elif name == LATENCY_BUCKET:
                out.has_requests = True
                le = _le(labels)
                if le is not None:
                    out.latency[le] = out.latency.get(le, 0.0) + value
            elif name == REQUEST_TOTAL:
                out.has_requests = True
            elif labels.get("peer") != "src":
                continue
            elif name == TCP_OPEN_TOTAL:
                out.tcp_opened += value
                if labels.get("tls") == "true":
                    out.tcp_opened_mtls += value
            elif name == TCP_OPEN_CONNECTIONS:
                out.tcp_open += value
                if labels.get("tls") == "true":
                    out.tcp_open_mtls += value
                if value:
                    client = client_of(labels)
                    out.clients[client] = out.clients.get(client, 0.0) + value
            elif name == TCP_READ:
                out.read_bytes += value
            elif name == TCP_WRITE:
                out.write_bytes += value
        return out


def client_of(labels: Mapping[str, str]) -> Client:
    """Who is on the other end of an accepted connection, as its TLS labels say."""
    tls = labels.get("tls", "")
    detail = {"true": "client_id", "no_identity": "no_tls_reason", "opaque": "sni"}.get(tls)
    return tls, labels.get(detail, "") if detail else ""


def _le(labels: Mapping[str, str]) -> float | None:
    try:
        return float(labels["le"])
    except (KeyError, ValueError):
        return None
