"""The inbound HTTP access log (``LINKERD2_PROXY_ACCESS_LOG=apache|json``), as linkerd2-proxy writes it.

One line per request the inbound proxy serves, written to the proxy's standard
error (``write``) once the response head is known -- or, for a request that
got none (the client left, the stream was reset), when it ends, with what is
known. The fields are linkerd2-proxy's (``linkerd/http/access-log``):
``client.addr``, ``client.id`` (``-`` without one), ``timestamp`` (the
request's arrival, RFC 3339, UTC), ``method``, ``uri`` (HTTP/1: the request
target as sent; HTTP/2: ``http://<authority><path>``), ``version``
(``HTTP/1.1``, ``HTTP/2.0``...), ``trace_id`` (``x-b3-traceid``, else
``x-request-id``, else ``x-amzn-trace-id``), ``request_bytes`` and
``response_bytes`` (the ``content-length`` headers, empty without),
``status``, ``total_ns`` (arrival to response head), ``processing_ns``,
``user_agent`` and ``host``.

``apache`` is Apache's common log format, as linkerd2-proxy's: ``<client.addr>
<client.id> - [<timestamp>] "<method> <uri> <version>" <status>``. ``json`` is
one JSON object per line with every field (keys sorted; ``status`` a number,
the rest strings, as linkerd2-proxy's tracing JSON writes them).

``processing_ns``: linkerd2-proxy counts the time its own code ran for the
request before the response head; here, the time from the request's arrival to
its going upstream (or to the proxy's own answer): routing, policy and the
wait for a connection, not the app's time.

Sans-IO: an ``AccessLog`` is the ``core.http.StreamObserver`` of the inbound
side, told of each request's stages by the HTTP cores, with an injected clock
and writer.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.errors import ProxyError

Header = tuple[bytes, bytes]
ClientAddr = tuple[str, int]

_TRACE_HEADERS = (b"x-b3-traceid", b"x-request-id", b"x-amzn-trace-id")  # the first present is the trace id
_VERSIONS = {b"1.1": "HTTP/1.1", b"1.0": "HTTP/1.0", b"2": "HTTP/2.0", b"0.9": "HTTP/0.9"}


class Format(enum.Enum):
    APACHE = "apache"
    JSON = "json"

    @classmethod
    def parse(cls, text: str) -> Format:
        """Linkerd's spelling, in any case; else ``ValueError`` with linkerd2-proxy's words."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError("expected either 'apache' or 'json'") from None


class _Entry:
    __slots__ = ("fields", "arrived", "sent", "status", "response_bytes", "answered")

    def __init__(self, fields: dict[str, str], arrived: float) -> None:
        self.fields = fields
        self.arrived = arrived
        self.sent: float | None = None  # when the request went upstream
        self.status: int | None = None
        self.response_bytes = ""
        self.answered: float | None = None  # when the response head was known


def _header(headers: Sequence[Header], name: bytes) -> str:
    for n, v in headers:
        if n.lower() == name:
            return v.decode("latin-1")
    return ""


def _client(client: ClientAddr | None) -> str:
    if client is None:
        return "-"
    ip, port = client
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _timestamp(wall: float) -> str:
    text = datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


class AccessLog:
    """``core.http.StreamObserver`` writing the access log of the requests it is told of (see the module)."""

    def __init__(self, fmt: Format, write: Callable[[str], None], clock: Callable[[], float],
                 wall_clock: Callable[[], float]) -> None:
        self.format = fmt
        self.write = write
        self.clock = clock  # monotonic seconds: durations
        self.wall_clock = wall_clock  # seconds since the epoch: the timestamp
        self._open: dict[int, _Entry] = {}

    def begin(self, stream: object, request: RequestHead, client: ClientAddr | None, client_id: str | None) -> None:
        headers = request.headers
        host = _header(headers, b"host")
        target = request.target.decode("latin-1")
        if request.version == b"2" and target.startswith("/"):
            target = f"http://{host}{target}"
        trace = ""
        for name in _TRACE_HEADERS:
            trace = _header(headers, name)
            if trace:
                break
        fields = {
            "client.addr": _client(client), "client.id": client_id or "-",
            "timestamp": _timestamp(self.wall_clock()), "method": request.method.decode("latin-1"),
            "uri": target, "version": _VERSIONS.get(request.version, "HTTP/" + request.version.decode("latin-1")),
            "trace_id": trace, "request_bytes": _header(headers, b"content-length"),
            "user_agent": _header(headers, b"user-agent"), "host": host,
        }
        self._open[id(stream)] = _Entry(fields, self.clock())

    def request(self, stream: object, request: RequestHead, labels: str, client: ClientAddr | None) -> None:
        entry = self._open.get(id(stream))
        if entry is not None and entry.sent is None:
            entry.sent = self.clock()

    def response(self, stream: object, status: int, headers: Sequence[Header]) -> None:
        entry = self._open.pop(id(stream), None)
        if entry is not None:
            entry.status, entry.response_bytes, entry.answered = status, _header(headers, b"content-length"), \
                self.clock()
            self._write(entry)

    def end(self, stream: object, status: int | None, error: ProxyError | None, grpc_status: int | None = None,
            response_bytes: int = 0, trailers: Sequence[Header] = (), reset_code: int | None = None) -> None:
        entry = self._open.pop(id(stream), None)
        if entry is None:  # written at its response head
            return
        if status is not None:  # the proxy's own answer (an error), content-length: 0
            entry.status, entry.response_bytes, entry.answered = status, "0", self.clock()
        self._write(entry)

    def _write(self, entry: _Entry) -> None:
        fields: dict[str, str | int] = dict(entry.fields)
        end = entry.answered if entry.answered is not None else self.clock()
        if entry.status is not None:
            fields["status"] = entry.status
            fields["response_bytes"] = entry.response_bytes
        fields["total_ns"] = str(round((end - entry.arrived) * 1e9))
        fields["processing_ns"] = str(round(((entry.sent or end) - entry.arrived) * 1e9))
        if self.format is Format.JSON:
            self.write(json.dumps(fields, sort_keys=True))
        else:
            f = entry.fields
            line = (f'{f["client.addr"]} {f["client.id"]} - [{f["timestamp"]}] '
                    f'"{f["method"]} {f["uri"]} {f["version"]}"')
            self.write(line if entry.status is None else f"{line} {entry.status}")
