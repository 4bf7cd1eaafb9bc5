"""The admin server (port 4191): metrics, readiness, liveness, the environment, log level, shutdown (proxy.md §10.1).

A small HTTP/1.1 server on asyncio streams, with bounded heads (16 KiB) and
bodies (64 KiB), keep-alive, and Linkerd's answers (requests are read by
``tether.http_request``, as the control plane's small servers read theirs):

- ``/live``: 200 ``live``; ``/ready``: 200 ``ready`` once the proxy has its
  certificate, else 503 ``not ready``;
- ``/metrics``: the registry in Prometheus text (gzip when asked);
- ``/env.json``: the proxy's environment, or only the variables named in the
  query (``?A&B``; unset ones are null);
- ``/proxy-log-level`` (GET, PUT) and ``/shutdown`` (POST, only when
  ``LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED``) answer only to localhost,
  whatever the port's policy says.

The admin port is a port of the pod like any other for inbound policy, as in
linkerd2-proxy (``linkerd/app/admin/src/stack.rs``): each connection goes
through mesh TLS detection (1 s, by peeking: ``io.peek``) -- a ClientHello for
the proxy's own name is terminated with its current certificate and the
client's identity is its certificate's first SAN; one for another name, or
bytes that are not HTTP, close the connection -- then each request is routed
and authorized under the admin port's current policy (``AdminPolicy``: the
policy controller's ``WatchPort`` answer for this port, watched from startup,
else the default policy) by ``core.inbound_authz``, exactly as inbound HTTP
is: no route 404, no authorization 403, counted in
``inbound_http_route_not_found_total`` / ``inbound_http_authz_deny_total`` and
``inbound_http_authz_allow_total`` with the admin port's ``srv_*`` labels; an
admitted request is recorded in ``request_total``, ``response_total`` and
``response_latency_ms`` with inbound labels and its permit's, as Linkerd's. The
kubelet's probes pass under a locked-down policy through the policy
controller's ``probe`` route (GET on the pod's HTTP probe paths, from the probe
networks), as in Linkerd; localhost passes through every discovered policy's
``default:localhost``. HTTP/1 and HTTP/2 are served, in plaintext (the peek
tells them apart) and inside mesh TLS (the first bytes do, one read within
1 s; none means HTTP/2, as linkerd2-proxy guesses for a meshed client): a
meshed Prometheus' proxy upgrades its scrapes to HTTP/2 (``io.admin_h2``).

Each connection whose TLS detection ended (TLS for any name, or plaintext
whatever its bytes; not one that timed out, nor a failed handshake) counts in
the transport metrics (``tcp_open_total``...) with the inbound server's labels
(``peer="src"``, ``target_*``, its TLS, the admin port's ``srv_*``), as
linkerd2-proxy's admin stack puts its transport metrics layer after TLS
detection; the bytes are those read and written inside TLS, a refused
connection's none. Each of them then counts in
``inbound_tcp_detect_http_results_total`` / ``_duration_seconds`` with the
admin port's ``srv_*``, whatever its policy, as linkerd2-proxy's admin stack
detects HTTP on every connection: in plaintext the peek's verdict (how long
it took), inside mesh TLS the first read's (``read_timeout`` when nothing
came within 1 s), and ``not_http`` for TLS for another name (its bytes are a
ClientHello).

Caller: ``tether.proxy.app``.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import json
import logging
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from tether.http_request import HttpError, read_request
from tether.http_response import response as http_response
from tether.proxy.codec import detect
from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.codec.http2 import DEFAULT_PARAMS, Http2Params
from tether.proxy.core import labels
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy, server_labels
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.logs import LogFilter
from tether.proxy.core.metrics import Meter, Registry
from tether.proxy.core.policy_metrics import DetectMetrics
from tether.proxy.core.server_policy import ServerPolicy
from tether.proxy.io.admin_h2 import Answer, Http2Server
from tether.proxy.io.listeners import local_addr, peer_addr
from tether.proxy.io.peek import detect_on
from tether.proxy.io.streams import errno_name
from tether.proxy.io.tls import TlsState, client_identity

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
DETECT_TIMEOUT = 1.0  # linkerd2-proxy's admin server: mesh TLS detection, the TLS handshake, HTTP detection


@dataclass(frozen=True, slots=True)
class AdminPolicy:
    """What the admin port's requests are authorized under, and what mesh TLS on it needs."""

    policy: Callable[[int], ServerPolicy]  # a port's current policy (io.policy_client), looked up per request
    registry: Registry  # where inbound_http_authz_* and the transport metrics go
    http_metrics: HttpMetrics  # request_total, response_total, response_latency_ms of the requests admitted
    detect: DetectMetrics  # inbound_tcp_detect_http_*: the inbound servers' (one family)
    tls: TlsState  # the current certificate's contexts (None before the first: TLS is then refused)
    local_name: str  # the SNI the proxy terminates
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    client: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


class AdminServer:
    def __init__(
        self,
        *,
        registry: Registry,
        ready: Callable[[], bool],
        env: Mapping[str, str],
        log_filter: LogFilter,
        shutdown_enabled: bool,
        on_shutdown: Callable[[], None],
        policy: AdminPolicy,
        h2: Http2Params = DEFAULT_PARAMS,
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._env = dict(env)
        self._log_filter = log_filter
        self._shutdown_enabled = shutdown_enabled
        self._on_shutdown = on_shutdown
        self._policy = policy
        self._h2 = h2  # HTTP/2 SETTINGS: the inbound server's, as linkerd2-proxy's admin server
        self._connections: set[asyncio.Task[None]] = set()

    def accept(self, sock: socket.socket) -> None:
        """Serve one accepted connection (``io.listeners.Listener.serve`` hands them over)."""
        task = asyncio.get_running_loop().create_task(self._connection(sock))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def idle(self) -> None:
        """Until every connection open now has closed (tests read settled metrics after it)."""
        if self._connections:
            await asyncio.wait(set(self._connections))

    async def close(self) -> None:
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, sock: socket.socket) -> None:
        try:
            opened = await self._open(sock)
        except BaseException:
            sock.close()
            raise
        if opened is None:
            sock.close()
            return
        wire, transport, facts, version = opened
        try:
            if version is None:
                version = await self._sniff(wire, facts.port)
            authorization = InboundRequestPolicy(lambda: self._policy.policy(facts.port), facts,
                                                 clock=self._policy.clock)
            if isinstance(version, detect.Http1):
                wire.speak_http1()
                writer = asyncio.StreamWriter(transport, wire, wire.reader, asyncio.get_running_loop())
                await self._serve(wire, writer, facts, authorization)
            elif isinstance(version, detect.Http2):
                wire.speak_http2(Http2Server(transport, self._http2_answer(facts, authorization), MAX_BODY, wire,
                                             self._h2))
                await wire.lost
            else:
                log.debug("admin: non-HTTP connection from %s", facts.client_ip)
        finally:
            transport.close()
        await wire.lost  # its meter closes with it: a connection whose task ended is counted closed

    async def _open(self, sock: socket.socket) -> tuple[_Wire, asyncio.Transport, ConnectionFacts,
                                                        detect.Verdict | None] | None:
        """Mesh TLS detection, then the connection's transport and the facts its requests are authorized on,
        and its HTTP version if known already (plaintext: the peek told it); None: the connection is closed
        (TLS for another name, not HTTP, or the handshake failed)."""
        client, local = peer_addr(sock), local_addr(sock)
        if client is None:
            return None
        began = self._policy.detect.clock()
        verdict = await detect_on(sock, tls=True, timeout=DETECT_TIMEOUT)
        plaintext = labels.no_tls(labels.NO_TLS_FROM_REMOTE)
        context: ssl.SSLContext | None = None
        if isinstance(verdict, detect.TlsTimeout):  # no verdict: uncounted, as Linkerd's TLS detection failing
            log.debug("admin: TLS detection timed out on a connection from %s", client)
            return None
        if not isinstance(verdict, detect.Tls):  # plaintext: the one peek told TLS from HTTP
            self._detected(local.port, verdict, self._policy.detect.clock() - began)
        if isinstance(verdict, detect.Tls):
            contexts = self._policy.tls.current
            if verdict.client_hello.server_name != self._policy.local_name:
                log.debug("admin: unexpected TLS connection to %s from %s (SNI %s)", local, client,
                          verdict.client_hello.server_name)
                self._refused(local, labels.tls_passthrough(verdict.client_hello.server_name or ""))
                self._detected(local.port, detect.Opaque(), 0.0)  # a ClientHello, already read: not HTTP
                return None
            if contexts is None:
                log.debug("admin: TLS connection from %s before the proxy has a certificate", client)
                return None
            context = contexts.server
        elif not isinstance(verdict, (detect.Http1, detect.Http2)):
            log.debug("admin: %s connection from %s closed", type(verdict).__name__, client)
            self._refused(local, plaintext)
            return None
        loop = asyncio.get_running_loop()
        wire = _Wire(loop)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: wire, sock, ssl=context, ssl_handshake_timeout=DETECT_TIMEOUT if context else None)
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
            log.debug("admin: TLS handshake with %s failed: %r", client, exc)
            return None
        client_id = client_identity(transport.get_extra_info("ssl_object")) if context else None
        tls_labels = labels.tls_accepted(client_id) if context else plaintext
        wire.metered(self._policy.registry.tcp.open(self._accept_labels(local, tls_labels), wire))
        facts = ConnectionFacts(port=local.port, client_ip=client.ip, mesh_tls=context is not None,
                                client_id=client_id, target_labels=labels.target(local), tls_labels=tls_labels,
                                registry=self._policy.registry)
        return wire, transport, facts, None if context else verdict

    def _accept_labels(self, local: SocketAddr, tls_labels: str) -> str:
        """The connection's transport metric labels: the inbound server's, under the admin port's policy."""
        return labels.accept_inbound(local, tls_labels, server_labels(self._policy.policy(local.port), local.port))

    def _refused(self, local: SocketAddr, tls_labels: str) -> None:
        """Count a connection closed after its TLS detection, before anything was read from it."""
        self._policy.registry.tcp.open(self._accept_labels(local, tls_labels), _Unread()).close()

    def _detected(self, port: int, verdict: detect.Verdict, seconds: float) -> None:
        """``inbound_tcp_detect_http_*`` for one connection, under the admin port's ``srv_*``."""
        self._policy.detect.detected(server_labels(self._policy.policy(port), port), verdict, seconds)

    async def _sniff(self, wire: _Wire, port: int) -> detect.Verdict:
        """HTTP detection inside mesh TLS: the first bytes say HTTP/1 or HTTP/2 (one read, as Linkerd's);
        none within the detect timeout means HTTP/2, as linkerd2-proxy's admin server guesses for a meshed
        connection (its client was most likely a proxy, which speaks HTTP/2 to meshed endpoints)."""
        began = self._policy.detect.clock()
        verdict: detect.Verdict
        try:
            await asyncio.wait_for(asyncio.shield(wire.arrived), DETECT_TIMEOUT)
        except TimeoutError:
            verdict = detect.ReadTimeout()
        else:
            answer = detect.Detector(tls=False).receive_data(wire.first(detect.HTTP_SNIFF_BYTES))
            assert isinstance(answer, detect.Verdict)
            verdict = answer
        self._detected(port, verdict, self._policy.detect.clock() - began)
        return detect.Http2() if isinstance(verdict, detect.ReadTimeout) else verdict

    async def _serve(self, wire: _Wire, writer: asyncio.StreamWriter, facts: ConnectionFacts,
                     authorization: InboundRequestPolicy) -> None:
        try:
            while True:
                request = await _read_request(wire.reader, facts.client_ip)
                if isinstance(request, Response):
                    wire.tx += _write(writer, request, keep_alive=False)
                    break
                if request is None:
                    break
                response, close = self._answer(request, authorization, facts)
                keep_alive = request.keep_alive and not close
                wire.tx += _write(writer, response, keep_alive=keep_alive,
                                  gzip_ok="gzip" in request.headers.get("accept-encoding", ""))
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    def _http2_answer(self, facts: ConnectionFacts, authorization: InboundRequestPolicy) -> Answer:
        def answer(method: str, target: str, headers: dict[str, str],
                   body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            path, _, query = target.partition("?")
            response, _ = self._answer(Request(method, path, query, headers, body, facts.client_ip), authorization,
                                       facts)
            payload, extra = _encoded(response, gzip_ok="gzip" in headers.get("accept-encoding", ""))
            return response.status, [("content-type", response.content_type), *extra], payload

        return answer

    def _answer(self, request: Request, authorization: InboundRequestPolicy,
                facts: ConnectionFacts) -> tuple[Response, bool]:
        """The port's policy on ``request`` (core.inbound_authz), then the endpoint's answer; and whether the
        connection closes after it (a refusal that says so)."""
        start = self._policy.clock()
        refused = authorization.check(_head(request))
        if not isinstance(refused, ProxyError):
            # Recorded with inbound labels and the permit's, as linkerd2-proxy's admin stack records them (its
            # endpoint metrics sit under the policy: refused requests are counted by the authz metrics only).
            endpoint = labels.join('direction="inbound"', facts.target_labels, facts.tls_labels, authorization.permit)
            metrics = self._policy.http_metrics
            metrics.request(endpoint)
            response = self.handle(request)
            metrics.response(endpoint, response.status, response.status < 500,
                             int((self._policy.clock() - start) * 1000))
            return response, False
        # linkerd2-proxy tells only meshed clients why it refused (l5d-proxy-error).
        informational = facts.mesh_tls and facts.client_id is not None
        headers = (("l5d-proxy-error", refused.message),) if informational else ()
        return Response(refused.status, headers=headers), refused.close

    def handle(self, request: Request) -> Response:
        """The answer to one request (no I/O)."""
        route = {
            "/live": self._live,
            "/ready": self._ready_route,
            "/metrics": self._metrics,
            "/env.json": self._env_json,
            "/proxy-log-level": self._log_level,
            "/shutdown": self._shutdown,
        }.get(request.path)
        if route is None:
            return Response(404)
        return route(request)

    def _live(self, request: Request) -> Response:
        return Response(200, b"live\n")

    def _ready_route(self, request: Request) -> Response:
        return Response(200, b"ready\n") if self._ready() else Response(503, b"not ready\n")

    def _metrics(self, request: Request) -> Response:
        return Response(200, self._registry.render().encode(), "text/plain; version=0.0.4")

    def _env_json(self, request: Request) -> Response:
        if request.method != "GET":
            return Response(405)
        accept = request.headers.get("accept", "*/*")
        if not any(t.split(";")[0].strip() in ("*/*", "application/*", "application/json")
                   for t in accept.split(",")):
            return Response(406)
        if not request.query:
            return _json(self._env)
        selected: dict[str, str | None] = {}
        for item in request.query.split("&"):
            if not item:
                continue
            if "=" in item:
                return Response(400, b"env.json query must be variable names, not key=value pairs\n")
            name = unquote(item)
            selected[name] = self._env.get(name)
        return _json(selected)

    def _log_level(self, request: Request) -> Response:
        if not _is_localhost(request.client):
            return Response(403, b"Requests are only permitted from localhost.")
        if request.method == "GET":
            return Response(200, self._log_filter.text.encode())
        if request.method == "PUT":
            try:
                self._log_filter.set(request.body.decode().strip())
            except (UnicodeDecodeError, ValueError) as exc:
                return Response(400, f"{exc}\n".encode())
            for target in self._log_filter.unmatched:
                log.warning("/proxy-log-level: target %r names no logger of this proxy", target)
            return Response(204)
        return Response(405)

    def _shutdown(self, request: Request) -> Response:
        if request.method != "POST":
            return Response(405)
        if not _is_localhost(request.client):
            return Response(403, b"Requests are only permitted from localhost.")
        if not self._shutdown_enabled:
            return Response(404, b"shutdown endpoint is not enabled\n")
        asyncio.get_running_loop().call_soon(self._on_shutdown)
        return Response(200, b"shutdown\n")


async def _read_request(
    reader: asyncio.StreamReader, client: ipaddress.IPv4Address | ipaddress.IPv6Address | None
) -> Request | Response | None:
    """The next request; None at a clean EOF; an error ``Response`` for a request we will not read."""
    try:
        request = await read_request(reader, MAX_BODY)
    except HttpError as exc:
        return Response(exc.status)
    if request is None:
        return None
    return Request(request.method, request.path, request.query, request.headers, request.body, client,
                   request.keep_alive)


def _head(request: Request) -> RequestHead:
    """The request as route matching reads it (``core.server_policy``)."""
    target = f"{request.path}?{request.query}" if request.query else request.path
    return RequestHead(request.method.encode("latin-1"), target.encode("latin-1"),
                       tuple((name.encode("latin-1"), value.encode("latin-1"))
                             for name, value in request.headers.items()))


def _write(writer: asyncio.StreamWriter, response: Response, *, keep_alive: bool, gzip_ok: bool = False) -> int:
    """Write ``response``; returns its length in bytes."""
    body, headers = _encoded(response, gzip_ok)
    data = http_response(response.status, body, response.content_type, keep_alive=keep_alive, headers=headers)
    writer.write(data)
    return len(data)


def _encoded(response: Response, gzip_ok: bool) -> tuple[bytes, list[tuple[str, str]]]:
    """The body to send (gzip when the client accepts it and it is worth it) and the headers beyond the type."""
    body, headers = response.body, list(response.headers)
    if gzip_ok and len(body) > 1024:
        body = gzip.compress(body, compresslevel=5)
        headers.append(("content-encoding", "gzip"))
    return body, headers


class _Unread:
    """The byte counts of a connection refused before the admin server read from it."""

    rx = 0
    tx = 0


class _Wire(asyncio.StreamReaderProtocol):
    """An admin connection's bytes: held until its HTTP version is known (inside mesh TLS they cannot be
    peeked), then fed to the HTTP/1 reader (asyncio's streams) or to the HTTP/2 server. It counts them for
    the transport metrics (``rx``; the servers add what they write to ``tx``) and closes its meter when
    the connection is lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = asyncio.StreamReader(limit=MAX_HEAD, loop=loop)
        super().__init__(self.reader, loop=loop)
        self.arrived: asyncio.Future[None] = loop.create_future()  # the first bytes (or EOF) are here
        self.lost: asyncio.Future[None] = loop.create_future()  # the connection is gone
        self._held: bytearray | None = bytearray()  # None once a server takes the bytes
        self._held_eof = False
        self._http2: Http2Server | None = None
        self.rx = 0  # bytes read (inside TLS)
        self.tx = 0  # bytes written (inside TLS)
        self._meter: Meter | None = None

    def metered(self, meter: Meter) -> None:
        """Counted under ``meter`` until the connection is lost (at once if it is already)."""
        if self.lost.done():
            meter.close()
        else:
            self._meter = meter

    def first(self, n: int) -> bytes:
        return bytes(self._held[:n]) if self._held is not None else b""

    def speak_http1(self) -> None:
        held, self._held = self._held, None
        if held:
            super().data_received(bytes(held))
        if self._held_eof:
            super().eof_received()

    def speak_http2(self, server: Http2Server) -> None:
        held, self._held = self._held, None
        self._http2 = server
        if held:
            server.received(bytes(held))
        if self._held_eof:
            server.closed()

    def data_received(self, data: bytes) -> None:
        self.rx += len(data)
        if self._http2 is not None:
            self._http2.received(data)
        elif self._held is None:
            super().data_received(data)
        else:
            self._held += data
            _settle(self.arrived)

    def eof_received(self) -> bool:
        if self._http2 is not None:
            self._http2.closed()
            return False
        if self._held is None:
            return bool(super().eof_received())
        self._held_eof = True
        _settle(self.arrived)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._meter is not None:
            self._meter.close(errno_name(exc))
            self._meter = None
        _settle(self.arrived)
        _settle(self.lost)
        super().connection_lost(exc)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _json(value: object) -> Response:
    return Response(200, json.dumps(value).encode(), "application/json")


def _is_localhost(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    return ip is not None and ip.is_loopback
