"""The proxy's one I/O driver: runs a connection's layer, doing each command it yields on real sockets.

``Driver.run`` takes an accepted socket and its layer (``core.inbound`` or
``core.outbound``), sends each reply back into the layer, and raises on a
command it does not know. Everything that waits on a socket is here:

- ``Detect`` peeks (``MSG_PEEK``) instead of reading, as Linkerd does, so the
  bytes stay in the kernel for whoever comes next -- the TLS stack or the app.
  When the first bytes are not enough, ``SO_RCVLOWAT`` makes the socket
  readable only once more bytes (or EOF) are there, so nothing spins.
- ``AcceptTls`` and ``Connect`` hand the socket to the event loop's native TLS
  transport (uvloop's, in the proxy). Measured with bench/proxy_tcp.py
  ``--compare-tls``: native TLS forwarding costs about a quarter less CPU per
  byte than TLS over memory BIOs driven from Python (STYLE: where speed wins).
- ``Forward`` links two ``Stream`` protocols: each read is written straight to
  the other side's transport; a full write buffer pauses reading on the other
  side until it drains. EOF is passed on as a half-close where the other side
  can write one (plain TCP). The loop's TLS transports cannot send close_notify
  and keep reading, nor write after receiving one, so an EOF that crosses a TLS
  side ends the whole connection once buffered bytes are written: a client that
  half-closes and then waits for an answer across the mesh does not get it --
  a documented limit (docs/proxy.md).

HTTP (``tether.proxy.core.http_commands``): ``ServeHttp1`` and ``ServeHttp2``
hand the accepted connection to a push-driven core over its sink
(``io.http1_io``, ``io.http2_io``), which the transports' callbacks feed;
upstream connections come from ``io.pool.Pool`` or are opened as ``Connect``
does (``open_upstream``, metered until they close), and a discovery wait or a
connect runs as a task that calls back (``Driver.run_then``).

Graceful shutdown (``tether.proxy.app``): ``drain`` tells every connection
served as HTTP (and each one that becomes HTTP from then on) to finish and
close; ``cut`` resets the HTTP/2 streams left at the end of the grace period.

Metrics: a ``Meter`` per connection side (``tether.proxy.core.metrics``); ``Refuse``
counts ``<direction>_tcp_errors_total{error}``.

Caller: ``tether.proxy.app`` (one ``Driver``; ``run`` is one task per connection).
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from tether.proxy.core import commands as cmd
from tether.proxy.core import labels
from tether.proxy.codec.addrs import SocketAddr
from tether.proxy.core import http_commands as http_cmd
from tether.proxy.io.http1_io import Http1Io, IdleClients
from tether.proxy.io.http2_io import Http2Io
from tether.proxy.io.peek import detect_on, set_once
from tether.proxy.io.streams import Stream, abort, errno_name, link
from tether.proxy.io.pool import IDLE_TIMEOUT, MAX_IDLE, Pool, Waiter
from tether.proxy.io.upgrade_io import Upgrades
from tether.proxy.core.metrics import Meter, Registry
from tether.proxy.codec import detect
from tether.proxy.codec.common import NEED_DATA, RemoteProtocolError
from tether.proxy.codec.transport_header import (
    ALPN_PROTOCOL,
    HeaderReceived,
    TransportHeaderDecoder,
)
from tether.proxy.io.tls import TlsState, client_identity, server_matches
from tether.proxy.io import sockopts
from tether.proxy.core.config import TcpOptions

NO_OPTIONS = TcpOptions()  # a direction the proxy was not configured for (tests' drivers): the OS's defaults

log = logging.getLogger(__name__)

TRANSPORT_ALPN = ALPN_PROTOCOL.decode()

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # linux/in.h
# An HTTP/1 client connection idle between requests is closed after this long (to twice as long; see
# io.http1_io.IdleClients). Linkerd has no such setting (hyper keeps an idle connection for ever); this is
# above the peers' pool idle timeout (*_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT, 3 s), so a proxy's pooled
# connection is closed by its owner first, and near nginx's keepalive_timeout (75 s).
HTTP1_CLIENT_IDLE_TIMEOUT = 60.0

HELP = {
    "inbound_tcp_errors_total": "The total number of inbound TCP connections that could not be processed due to a "
                                "proxy error.",
    "outbound_tcp_errors_total": "The total number of outbound TCP connections that could not be processed due to "
                                 "a proxy error.",
    "inbound_tcp_authz_allow_total": "The total number of inbound TCP connections that were authorized.",
    "inbound_tcp_authz_deny_total": "The total number of inbound TCP connections that were denied.",
    "inbound_tcp_transport_header_connections_total": "The number of connections with a transport header.",
    "inbound_http_errors_total": "The total number of inbound HTTP requests that could not be processed due to a "
                                 "proxy error.",
    "outbound_http_errors_total": "The total number of outbound HTTP requests that could not be processed due to a "
                                  "proxy error.",
}


class _Conn:
    """What the driver holds for one accepted connection."""

    __slots__ = ("direction", "sock", "down", "up", "accept_labels", "target", "down_meter", "up_meter",
                 "checked_out", "jobs")

    def __init__(self, direction: str, sock: socket.socket, target: SocketAddr) -> None:
        self.direction = direction
        self.sock: socket.socket | None = sock  # until a transport owns it
        self.down: Stream | None = None
        self.up: Stream | None = None
        self.accept_labels: str | None = None
        self.target = target
        self.down_meter: Meter | None = None
        self.up_meter: Meter | None = None
        self.checked_out: set[http_cmd.Upstream] = set()  # pooled connections this connection's requests hold
        self.jobs: dict[asyncio.Future[Any], cmd.Command] = {}  # what the cores run in the background


class _NoBytes:
    """The counts of a side that never became a stream."""

    rx = 0
    tx = 0


class Driver:
    """Executes connection layers. One per proxy; ``run`` is called once per accepted connection."""

    def __init__(self, metrics: Registry, tls: TlsState, *, source_ip: str | None = None,
                 pool_idle_timeouts: dict[str, float] | None = None,
                 pool_max_idle: dict[str, int] | None = None,
                 client_idle_timeout: float = HTTP1_CLIENT_IDLE_TIMEOUT,
                 connect_options: dict[str, TcpOptions] | None = None) -> None:
        self._metrics = metrics
        # Per direction, the socket options of the connections that side makes (Connect.inbound says which).
        self._connect_options = connect_options or {}
        self._tls = tls
        # Without iptables (tests on loopback), connections leave from the pod's IP, as they would in a pod.
        self._local_addr = (source_ip, 0) if source_ip else None
        # (local, dialed) addresses of the connections this proxy made: one coming back in is a redirection loop.
        self._own_sources: set[tuple[str, int, str, int]] = set()
        self._errors = {d: metrics.counter(f"{d}_tcp_errors_total", HELP[f"{d}_tcp_errors_total"])
                        for d in ("inbound", "outbound")}
        self._blocking: dict[type[cmd.Command], Callable[[_Conn, Any], Awaitable[Any]]] = {
            cmd.Detect: self._detect,
            cmd.AcceptTls: self._accept_tls,
            cmd.Sniff: self._sniff,
            cmd.ReadHeader: self._read_header,
            cmd.Connect: self._connect,
            cmd.Forward: self._forward,
            cmd.Wait: self._wait,
            http_cmd.ServeHttp1: self._serve_http1,
            http_cmd.ServeHttp2: self._serve_http2,
        }
        self._immediate: dict[type[cmd.Command], Callable[[_Conn, Any], None]] = {
            cmd.SetLabels: self._set_labels,
            cmd.Count: self._count,
            cmd.Send: self._send,
            cmd.Refuse: self._refuse,
        }
        # Idle HTTP/1 connections, per direction: each has its own idle timeout (*_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT)
        # and bound per endpoint (*MAX_IDLE_CONNS_PER_ENDPOINT).
        timeouts, bounds = pool_idle_timeouts or {}, pool_max_idle or {}
        self._pools = {d: Pool(timeouts.get(d, IDLE_TIMEOUT), bounds.get(d, MAX_IDLE))
                       for d in ("inbound", "outbound")}
        self._idle_clients = {d: IdleClients(client_idle_timeout) for d in ("inbound", "outbound")}
        # The l5d-orig-proto upgrade's HTTP/2 connections (app.py sets their HTTP/2 client settings).
        self.upgrades = Upgrades(self.open_connection)
        # The accepted connections served as HTTP, for the graceful shutdown (``drain``, ``cut``).
        self._serving: set[Http1Io | Http2Io] = set()
        self.draining = False

    def is_own_connection(self, peer: SocketAddr, target: SocketAddr) -> bool:
        """Whether an accepted connection is one this proxy made, which iptables sent back to it."""
        return (str(peer.ip), peer.port, str(target.ip), target.port) in self._own_sources

    def refuse_loop(self, direction: str, sock: socket.socket, target: SocketAddr) -> None:
        conn = _Conn(direction, sock, target)
        self._refuse(conn, cmd.Refuse("loop"))

    async def run(self, direction: str, sock: socket.socket, target: SocketAddr, layer: cmd.Layer) -> None:
        """Drive ``layer`` for the accepted ``sock`` until it ends; always closes what it opened."""
        conn = _Conn(direction, sock, target)
        reply: Any = None
        try:
            while True:
                try:
                    command = layer.send(reply)
                except StopIteration:
                    break
                kind = type(command)
                immediate = self._immediate.get(kind)
                if immediate is not None:
                    immediate(conn, command)
                    reply = None
                    continue
                blocking = self._blocking.get(kind)
                if blocking is None:
                    raise TypeError(f"the driver does not know the command {command!r}")
                reply = await blocking(conn, command)
        except asyncio.CancelledError:
            raise
        except Exception:  # the one place that catches everything: a bug must not take the proxy down
            log.exception("%s connection to %s failed unexpectedly", direction, target)
            if conn.accept_labels is not None and conn.down_meter is None:
                self._refuse(conn, cmd.Refuse("unexpected"))
        finally:
            layer.close()
            self._close(conn)

    # -- commands on the accepted side ----------------------------------------------------------------------------

    async def _detect(self, conn: _Conn, command: cmd.Detect) -> detect.Verdict:
        sock = conn.sock
        assert sock is not None, "Detect after the socket was handed to a transport"
        return await detect_on(sock, tls=command.tls, timeout=command.timeout)

    async def _accept_tls(self, conn: _Conn, command: cmd.AcceptTls) -> cmd.TlsAccepted | cmd.Failed:
        contexts = self._tls.current
        sock = conn.sock
        assert sock is not None, "AcceptTls after the socket was handed to a transport"
        if contexts is None:
            return cmd.Failed("no identity")
        ctx = contexts.server_transport if command.alpn else contexts.server
        loop = asyncio.get_running_loop()
        stream = Stream(loop, tls=True)
        conn.sock = None  # the transport owns it now, even if the handshake fails
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: stream, sock, ssl=ctx, ssl_handshake_timeout=command.timeout
            )
        except ssl.SSLCertVerificationError as exc:
            log.debug("TLS client refused: %s", exc)
            return cmd.Failed("untrusted client certificate")
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
            log.debug("TLS handshake with a client failed: %r", exc)
            return cmd.Failed("tls handshake", errno_name(exc))
        conn.down = stream
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        return cmd.TlsAccepted(client_identity(ssl_object), alpn)

    async def _sniff(self, conn: _Conn, command: cmd.Sniff) -> detect.Verdict:
        stream = conn.down
        assert stream is not None, "Sniff needs a terminated session"
        detector = detect.Detector(tls=False)
        try:
            async with asyncio.timeout(command.timeout):
                await stream.readable()
        except TimeoutError:
            return detector.on_timeout()
        verdict = detector.receive_data(bytes(stream.buffer[: detect.HTTP_SNIFF_BYTES]))
        assert isinstance(verdict, detect.Verdict)
        return verdict

    async def _read_header(self, conn: _Conn, command: cmd.ReadHeader) -> object:
        stream = conn.down
        assert stream is not None, "ReadHeader needs a terminated session"
        decoder = TransportHeaderDecoder()
        try:
            async with asyncio.timeout(command.timeout):
                while True:
                    await stream.readable()
                    answer = decoder.receive_data(stream.take() if stream.buffer else b"")
                    if answer is NEED_DATA:
                        continue
                    if isinstance(answer, HeaderReceived):
                        # The app's first bytes go back in front of anything read since.
                        stream.buffer[:0] = answer.trailing_data
                    return answer
        except TimeoutError:
            return cmd.Failed("transport header timeout")
        except RemoteProtocolError as exc:
            log.debug("bad transport header: %s", exc)
            return cmd.Failed("invalid transport header")

    def _set_labels(self, conn: _Conn, command: cmd.SetLabels) -> None:
        conn.accept_labels = command.labels

    def _count(self, conn: _Conn, command: cmd.Count) -> None:
        self.count(command.name, command.labels)

    def _refuse(self, conn: _Conn, command: cmd.Refuse) -> None:
        accept = command.labels or conn.accept_labels
        if accept is not None:
            self._metrics.tcp.open(accept, conn.down or _NoBytes()).close()
        self._errors[conn.direction].inc(labels.join(labels.render(("error", command.error)),
                                                     labels.target(conn.target)))
        log.debug("%s connection to %s refused: %s", conn.direction, conn.target, command.error)
        self._close(conn)

    # -- commands on the connected side -------------------------------------------------------------------------

    async def _connect(self, conn: _Conn, command: cmd.Connect) -> cmd.Connected | cmd.Failed:
        opened = await self._open(command)
        if isinstance(opened, cmd.Failed):
            return opened
        stream, connected = opened
        if conn.up is not None:  # a previous attempt's stream (only ever when retrying)
            conn.up.transport.abort()
        conn.up = stream
        conn.up_meter = self._metrics.tcp.open(command.labels, stream)
        return connected

    async def _open(self, command: cmd.Connect) -> tuple[Stream, cmd.Connected] | cmd.Failed:
        """TCP, then TLS if asked, with the peer's identity checked: a stream not yet metered nor linked."""
        ctx = None
        tls = command.tls
        if tls is not None:
            contexts = self._tls.current
            if contexts is None:
                return cmd.Failed("no identity")
            ctx = contexts.client_transport if tls.alpn else contexts.client
        loop = asyncio.get_running_loop()
        stream = Stream(loop, tls=ctx is not None)
        start = loop.time()
        addr = command.addr
        sock = socket.socket(socket.AF_INET6 if addr.ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
        key = None
        try:
            async with asyncio.timeout(command.timeout):
                # The local port is known once connect() is issued: registered before the accept side can see
                # the connection, should iptables send it back to this proxy (see is_own_connection).
                options = self._connect_options.get("inbound" if command.inbound else "outbound", NO_OPTIONS)
                key = await self._tcp_connect(sock, addr, options)
                transport, _ = await loop.create_connection(
                    lambda: stream,
                    sock=sock,
                    ssl=ctx,
                    server_hostname=tls.sni if tls is not None else None,
                    ssl_handshake_timeout=command.timeout if ctx is not None else None,
                )
        except TimeoutError:
            return self._connect_failed(sock, key, cmd.Failed("connect timeout", "ETIMEDOUT", timed_out=True))
        except ssl.SSLCertVerificationError as exc:
            log.debug("TLS server %s refused: %s", addr, exc)
            return self._connect_failed(sock, key, cmd.Failed("untrusted server certificate"))
        except ssl.SSLError as exc:
            log.debug("TLS handshake with %s failed: %s", addr, exc)
            return self._connect_failed(sock, key, cmd.Failed("tls handshake"))
        except OSError as exc:
            return self._connect_failed(sock, key, cmd.Failed("i/o", errno_name(exc)))
        elapsed = loop.time() - start
        stream.source = key
        alpn = None
        if ctx is not None:
            assert tls is not None
            ssl_object = transport.get_extra_info("ssl_object")
            if not server_matches(ssl_object, tls.server_id):
                log.debug("TLS server %s is not %s", addr, tls.server_id)
                transport.abort()
                if key is not None:
                    self._own_sources.discard(key)
                return cmd.Failed("unexpected server identity")
            alpn = ssl_object.selected_alpn_protocol()
        return stream, cmd.Connected(alpn, elapsed)

    async def _tcp_connect(self, sock: socket.socket, addr: SocketAddr,
                           options: TcpOptions) -> tuple[str, int, str, int]:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sockopts.apply(sock, options)
        if self._local_addr is not None and addr.ip.version == 4:
            # Pick the port at connect(), as an unbound socket would (no port reserved for every destination).
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind(self._local_addr)
        err = sock.connect_ex((str(addr.ip), addr.port))
        if err not in (0, errno_mod.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        host, port = sock.getsockname()[:2]
        key = (_unmapped(host), port, str(addr.ip), addr.port)
        self._own_sources.add(key)
        if err == errno_mod.EINPROGRESS:
            await _writable(sock)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
        return key

    def _connect_failed(self, sock: socket.socket, key: tuple[str, int, str, int] | None,
                        failed: cmd.Failed) -> cmd.Failed:
        if key is not None:
            self._own_sources.discard(key)
        if sock.fileno() != -1:  # not yet handed to a transport (which closes it itself)
            sock.close()
        return failed

    def _send(self, conn: _Conn, command: cmd.Send) -> None:
        up = conn.up
        assert up is not None, "Send before Connect"
        up.tx += len(command.data)
        up.transport.write(command.data)

    async def _forward(self, conn: _Conn, command: cmd.Forward) -> None:
        up = conn.up
        assert up is not None, "Forward before Connect"
        down = await self._ensure_down(conn)
        if down is None:
            return
        link(down, up)
        stop = command.authz.watch(partial(abort, down, up)) if command.authz is not None else None
        try:
            await down.done
            await up.done
        finally:
            if stop is not None:
                stop()

    async def _wait(self, conn: _Conn, command: cmd.Wait) -> Any:
        return await command.source.wait(command.timeout)

    # -- HTTP: the accepted connection handed to a push-driven core (io.http1_io, io.http2_io) ------------------------

    async def _ensure_down(self, conn: _Conn) -> Stream | None:
        down = conn.down
        if down is None:
            sock = conn.sock
            assert sock is not None
            loop = asyncio.get_running_loop()
            down = Stream(loop)
            conn.sock = None
            try:
                await loop.connect_accepted_socket(lambda: down, sock)
            except OSError as exc:
                log.debug("accepted socket unusable: %s", exc)
                return None
            conn.down = down
        if conn.down_meter is None:
            conn.down_meter = self._metrics.tcp.open(conn.accept_labels or "", down)
        return down

    async def _serve_http1(self, conn: _Conn, command: http_cmd.ServeHttp1) -> None:
        """HTTP/1, push-driven: the connection's reads go straight into an ``Http1Proxy`` until it is over."""
        down = await self._ensure_down(conn)
        if down is None:
            return
        served = Http1Io(self, conn, down, command.router, command.settings, self._idle_clients[conn.direction])
        served.start()
        await self._served(served)

    async def _serve_http2(self, conn: _Conn, command: http_cmd.ServeHttp2) -> None:
        """HTTP/2, push-driven: the connection's reads go straight into an ``Http2Proxy`` until it is over."""
        down = await self._ensure_down(conn)
        if down is None:
            return
        served = Http2Io(self, conn, down, command.router, command.settings, command.downgrade)
        served.start()
        await self._served(served)

    async def _served(self, served: Http1Io | Http2Io) -> None:
        """Until the connection is over; drained at once if the proxy is already shutting down."""
        self._serving.add(served)
        try:
            if self.draining:
                served.core.drain()
            await served.finished
        finally:
            self._serving.discard(served)

    def drain(self) -> None:
        """The proxy is shutting down: every HTTP connection finishes what it has in hand and closes (HTTP/1:
        at once when idle, else after the response, with ``connection: close``; HTTP/2: GOAWAY, see
        ``Http2Proxy.drain``), as do those that become HTTP from now on. Opaque connections go on."""
        self.draining = True
        for served in list(self._serving):
            served.core.drain()

    def cut(self) -> None:
        """The shutdown grace period is over: HTTP/2 streams still open are reset (the connections are closed
        next, with every other)."""
        for served in list(self._serving):
            if isinstance(served, Http2Io):
                served.core.cut()

    def pooled(self, direction: str, connect: cmd.Connect) -> http_cmd.Upstream | None:
        """An idle pooled connection for ``connect`` (same address and TLS), or None."""
        return self._pools[direction].take(connect.pool_key)

    def pool_put(self, direction: str, up: http_cmd.Upstream) -> None:
        self._pools[direction].put(up)

    def pool(self, direction: str) -> Pool:
        """The direction's pool (``io.http1_io`` asks it directly for every request)."""
        return self._pools[direction]

    def pool_wait(self, direction: str, connect: cmd.Connect, header: bytes | None,
                  done: Callable[[http_cmd.Upstream | cmd.Failed], None]) -> Waiter:
        """Wait for a connection for ``connect`` (``io.pool.Pool.wait``): the next one checked in, or a new one."""
        return self._pools[direction].wait(connect.pool_key, partial(self.open_upstream, connect, header), done)

    def count(self, name: str, labels: str) -> None:
        self._metrics.counter(name, HELP[name]).inc(labels)

    def run_then(self, conn: _Conn, command: cmd.Command, done: Callable[[Any], None]) -> None:
        """Do a blocking command for a push-driven core (a router's ``Wait``) in the background; ``done`` gets
        its reply, unless the connection ended first (``_end_jobs`` cancels it)."""
        handler = self._blocking.get(type(command))
        if handler is None:
            raise TypeError(f"the driver does not know the command {command!r}")
        job = asyncio.ensure_future(handler(conn, command))
        conn.jobs[job] = command

        def finished(j: asyncio.Future[Any]) -> None:
            if conn.jobs.pop(j, None) is not None and not j.cancelled():
                done(j.result())

        job.add_done_callback(finished)

    async def open_upstream(self, connect: cmd.Connect, header: bytes | None) -> http_cmd.Upstream | cmd.Failed:
        """A new upstream connection for HTTP (pooled or not): metered until it closes, its transport header sent
        when ALPN agreed to one. For the l5d-orig-proto upgrade (``connect.upgrade``), a new leg on the
        endpoint's shared HTTP/2 connection (``io.upgrade_io``)."""
        if connect.upgrade:
            return await self.upgrades.open(connect, header)
        return await self.open_connection(connect, header)

    async def open_connection(self, connect: cmd.Connect, header: bytes | None) -> http_cmd.Upstream | cmd.Failed:
        """A new upstream connection: metered until it closes, its transport header sent when ALPN agreed."""
        opened = await self._open(connect)
        if isinstance(opened, cmd.Failed):
            return opened
        stream, connected = opened
        meter = self._metrics.tcp.open(connect.labels, stream)
        stream.done.add_done_callback(partial(self._pooled_closed, stream, meter))
        if header is not None and connected.alpn == TRANSPORT_ALPN:
            stream.tx += len(header)
            stream.transport.write(header)
        return http_cmd.Upstream(connect.pool_key, stream, connected.elapsed, reused=False)

    def _pooled_closed(self, stream: Stream, meter: Meter, _: object = None) -> None:
        meter.close(stream.errno)
        if stream.source is not None:
            self._own_sources.discard(stream.source)

    def close_idle(self) -> None:
        """Close the pooled idle upstream connections (tests settling metrics); the pools keep serving."""
        for pool in self._pools.values():
            pool.close_idle()
        self.upgrades.close_idle()

    def close(self) -> None:
        """The proxy stops: idle connections closed (and those still being opened once they are), timers
        cancelled."""
        for pool in self._pools.values():
            pool.close()
        self.upgrades.close()
        for clients in self._idle_clients.values():
            clients.close()

    def _end_jobs(self, conn: _Conn) -> None:
        """The connection is over: discovery waits are cancelled; connects finish, and what they open is closed."""
        for job, command in conn.jobs.items():
            if isinstance(command, cmd.Wait):
                job.cancel()
            else:
                job.add_done_callback(_close_opened)
        conn.jobs.clear()

    # -- the end ------------------------------------------------------------------------------------------------

    def _close(self, conn: _Conn) -> None:
        self._end_jobs(conn)
        for up in conn.checked_out:
            if not up.io.lost:
                up.io.transport.close()
        conn.checked_out.clear()
        if conn.sock is not None:
            conn.sock.close()
            conn.sock = None
        for stream in (conn.down, conn.up):
            if stream is not None and not stream.lost:
                stream.transport.close()
        if conn.up is not None and conn.up.source is not None:
            self._own_sources.discard(conn.up.source)
        if conn.down_meter is not None and conn.down is not None:
            conn.down_meter.close(conn.down.errno)
            conn.down_meter = None
        if conn.up_meter is not None and conn.up is not None:
            conn.up_meter.close(conn.up.errno)
            conn.up_meter = None


def _close_opened(job: asyncio.Future[Any]) -> None:
    """A background connect that finished after its connection ended: close what it opened."""
    if job.cancelled() or job.exception() is not None:
        return
    up = job.result()
    if isinstance(up, http_cmd.Upstream) and not up.io.lost:
        up.io.transport.close()


def _unmapped(host: str) -> str:
    return host[7:] if host.startswith("::ffff:") and "." in host else host


def _writable(sock: socket.socket) -> asyncio.Future[None]:
    """Done when ``sock`` is writable (a non-blocking connect has finished, well or not)."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    waiter: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, set_once, waiter)
    waiter.add_done_callback(lambda _: loop.remove_writer(fd))
    return waiter

