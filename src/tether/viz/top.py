"""``viz top``: tap events folded into a table of the busiest request paths (``linkerd viz top``).

``Top.add(event)`` pairs each stream's request-init with its response-init and
response-end (by stream id) and counts, per (source, destination, method,
path): requests, the best, worst and last latency (request start to response
start) and the success rate (a response is a failure when its status is 5xx or
its gRPC status is non-zero, or when the stream was reset).  ``rows()`` is the
table sorted by count, as Linkerd's top sorts it.

Pure.  Callers: the ``tether viz top`` command and tests.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tether.api import tap_pb2
from tether.api.addresses import InvalidAddress, from_tcp_address
from tether.viz.tables import method_name

COLUMNS = ("SOURCE", "DESTINATION", "METHOD", "PATH", "COUNT", "BEST", "WORST", "LAST", "SUCCESS RATE")
MAX_PENDING = 10_000  # streams whose end has not been seen; the oldest are forgotten first


@dataclass(slots=True)
class _Row:
    count: int = 0
    successes: int = 0
    failures: int = 0
    best_ms: float | None = None
    worst_ms: float | None = None
    last_ms: float | None = None


@dataclass(slots=True)
class _Pending:
    key: tuple[str, str, str, str]
    latency_ms: float | None = None
    status: int = 0


def _ip(addr: object) -> str:
    try:
        return from_tcp_address(addr)[0]  # type: ignore[arg-type]
    except (InvalidAddress, ValueError):
        return "-"


class Top:
    def __init__(self) -> None:
        self.table: dict[tuple[str, str, str, str], _Row] = {}
        self._pending: OrderedDict[tuple[int, int], _Pending] = OrderedDict()

    def add(self, event: tap_pb2.TapEvent) -> None:
        kind = event.http.WhichOneof("event")
        if kind == "request_init":
            r = event.http.request_init
            key = (_ip(event.source), _ip(event.destination), method_name(r.method), r.path)
            self._pending[(r.id.base, r.id.stream)] = _Pending(key)
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        elif kind == "response_init":
            rsp = event.http.response_init
            pending = self._pending.get((rsp.id.base, rsp.id.stream))
            if pending is not None:
                pending.latency_ms = rsp.since_request_init.ToNanoseconds() / 1e6
                pending.status = rsp.http_status
        elif kind == "response_end":
            end = event.http.response_end
            pending = self._pending.pop((end.id.base, end.id.stream), None)
            if pending is None:
                return
            failed = (pending.status >= 500 or pending.status == 0
                      or end.eos.WhichOneof("end") == "reset_error_code"
                      or (end.eos.WhichOneof("end") == "grpc_status_code" and end.eos.grpc_status_code != 0))
            row = self.table.setdefault(pending.key, _Row())
            row.count += 1
            row.failures += failed
            row.successes += not failed
            latency = pending.latency_ms if pending.latency_ms is not None else (
                end.since_request_init.ToNanoseconds() / 1e6)
            row.last_ms = latency
            row.best_ms = latency if row.best_ms is None else min(row.best_ms, latency)
            row.worst_ms = latency if row.worst_ms is None else max(row.worst_ms, latency)

    def rows(self, limit: int | None = None) -> list[list[str]]:
        def ms(value: float | None) -> str:
            return "-" if value is None else (f"{value:.0f}ms" if value >= 1 else f"{value * 1000:.0f}µs")

        ordered = sorted(self.table.items(), key=lambda kv: (-kv[1].count, kv[0]))[:limit]
        return [[src, dst, method, path, str(r.count), ms(r.best_ms), ms(r.worst_ms), ms(r.last_ms),
                 f"{100 * r.successes / r.count:.2f}%"] for (src, dst, method, path), r in ordered]
