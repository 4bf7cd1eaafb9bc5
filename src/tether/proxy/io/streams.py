"""A proxied connection's side as the event loop sees it: ``Stream``, and ``link`` to join two of them.

A ``Stream`` buffers what it reads until
something takes it: the driver's commands before a connection is settled
(detection, the transport header), ``link`` (every read written straight to
the peer, with backpressure), or a push-driven ``handler``
(``io.http1_io.Http1Io``) that gets every read, EOF, loss and write-buffer
change as it happens.

Callers: ``io.driver``, ``io.http1_io``, ``io.pool``.
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
from collections.abc import Awaitable
from typing import Protocol

from tether.proxy.codec.transport_header import MAX_HEADER_LENGTH

# Bytes a stream buffers before it is linked (transport header, sniffed bytes, a server's first words).
PRELINK_LIMIT = MAX_HEADER_LENGTH + 1024


class StreamHandler(Protocol):
    """What a push-driven owner of a stream is told (``io.http1_io.Http1Io``)."""

    def on_data(self, stream: Stream, data: bytes) -> None: ...

    def on_eof(self, stream: Stream) -> None: ...

    def on_lost(self, stream: Stream) -> None: ...

    def on_write_paused(self, stream: Stream) -> None: ...

    def on_write_resumed(self, stream: Stream) -> None: ...


def errno_name(exc: BaseException | None) -> str:
    """``ECONNRESET`` and the like for a socket error; empty for a clean close or a non-OS error."""
    if isinstance(exc, OSError) and exc.errno:
        return errno_mod.errorcode.get(exc.errno, str(exc.errno))
    return ""


# Every read of a TLS connection lands here first (asyncio.BufferedProtocol): the loop reads into it and calls
# buffer_updated at once, before any other callback, so one buffer serves every connection. uvloop's TLS
# transport otherwise allocates a fresh 256 KiB bytes object per read (mmap, mremap, munmap each time: measured in
# the HTTP benchmark). A plaintext connection is a plain asyncio.Protocol: uvloop reads it into a buffer of its own
# and hands over a bytes object of the read's size, with one Python call per read (data_received) where a
# BufferedProtocol takes two (get_buffer, buffer_updated).
READ_BUFFER = memoryview(bytearray(256 * 1024))


class Stream(asyncio.Protocol):
    """One side of a proxied connection: buffers until linked, then writes every read to its peer.

    ``Stream(loop, tls=True)`` makes a ``_TlsStream``: the same, read as an ``asyncio.BufferedProtocol`` (see
    ``READ_BUFFER``). The TLS setting is known whenever a stream is made (before its transport exists)."""

    __slots__ = ("transport", "peer", "rx", "tx", "buffer", "eof", "lost", "errno", "tls", "done", "_waiter",
                 "source", "paused", "_drain", "_loop", "reading_paused", "handler")

    def __new__(cls, loop: asyncio.AbstractEventLoop, *, tls: bool = False) -> Stream:
        return object.__new__(_TlsStream if tls else cls)

    def __init__(self, loop: asyncio.AbstractEventLoop, *, tls: bool = False) -> None:
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.peer: Stream | None = None
        self.rx = 0  # bytes read from this socket
        self.tx = 0  # bytes written to it
        self.buffer = bytearray()
        self.eof = False
        self.lost = False
        self.errno = ""
        self.tls = tls
        self.done: asyncio.Future[None] = loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self.source: tuple[str, int, str, int] | None = None  # (local, dialed) address of a connection we made
        self.paused = False  # the transport's write buffer is over its high-water mark (HTTP writes wait)
        self._drain: asyncio.Future[None] | None = None
        self._loop = loop  # not asyncio.get_running_loop(): that costs a getpid() per call
        self.reading_paused = False  # by us, for a full buffer (not by a linked peer's backpressure)
        # A push-driven owner (io.http1_io.Http1Io): every read, EOF, loss and write-buffer change goes to it.
        self.handler: StreamHandler | None = None

    # -- asyncio.BufferedProtocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        n = len(data)
        self.rx += n
        handler = self.handler
        if handler is not None:
            handler.on_data(self, data)
            return
        peer = self.peer
        if peer is not None:
            peer.tx += n
            try:
                peer.transport.write(data)
            except RuntimeError:  # the other side's handle is already closed
                self.transport.close()
            return
        self.buffer += data
        if len(self.buffer) > PRELINK_LIMIT and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        handler = self.handler
        if handler is not None:
            handler.on_eof(self)
            return not self.tls
        peer = self.peer
        if peer is None:
            self._wake()
            return not self.tls
        if peer.eof:
            # Both directions are finished.
            self.transport.close()
            peer.transport.close()
            return False
        _pass_eof(peer)
        return not self.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.errno = errno_name(exc)
        if not self.done.done():
            self.done.set_result(None)
        self._wake()
        self._drained()
        handler = self.handler
        if handler is not None:
            self.handler = None
            handler.on_lost(self)
        peer = self.peer
        if peer is not None:
            self.peer = None
            if not peer.lost:
                peer.transport.close()  # after what is buffered for it has been written
        # Nothing more comes from a lost connection, so it lets go of what it pointed to (its handler, its
        # peer), and a TLS transport of it: uvloop's TLS protocol keeps this stream's bound get_buffer and
        # buffer_updated after the connection is lost, a cycle through the transport this stream holds. Each
        # would leave every closed connection to the cyclic garbage collector (docs/benchmarks.md).
        if self.tls:
            self.transport.set_protocol(_LOST)

    def pause_writing(self) -> None:
        self.paused = True
        handler = self.handler
        if handler is not None:
            handler.on_write_paused(self)
        peer = self.peer
        if peer is not None and not peer.lost:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self._drained()
        handler = self.handler
        if handler is not None:
            handler.on_write_resumed(self)
        peer = self.peer
        if peer is not None and not peer.lost:
            peer.transport.resume_reading()

    # -- before linking -----------------------------------------------------------------------------------------

    def readable(self) -> Awaitable[None]:
        """Done when there are buffered bytes, or EOF, or the connection is gone."""
        waiter = self._loop.create_future()
        if self.buffer or self.eof or self.lost:
            waiter.set_result(None)
        else:
            self._waiter = waiter
        return waiter

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        if self.reading_paused:
            self.reading_paused = False
            if not self.lost and not self.transport.is_closing():
                self.transport.resume_reading()
        return data

    def drain(self) -> Awaitable[None]:
        """Done once the write buffer is below its low-water mark again (or the connection is gone)."""
        waiter = self._drain
        if waiter is None:
            waiter = self._drain = self._loop.create_future()
        return waiter

    def _drained(self) -> None:
        waiter = self._drain
        if waiter is not None:
            self._drain = None
            if not waiter.done():
                waiter.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class _TlsStream(Stream, asyncio.BufferedProtocol):
    """A ``Stream`` over TLS: every read lands in ``READ_BUFFER`` first."""

    __slots__ = ()

    def get_buffer(self, sizehint: int) -> memoryview:
        return READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        data = READ_BUFFER[:nbytes].tobytes()
        handler = self.handler
        if handler is not None:  # data_received's first case, here: one call less per read of an HTTP connection
            self.rx += nbytes
            handler.on_data(self, data)
            return
        self.data_received(data)


def client_addr(stream: Stream) -> tuple[str, int] | None:
    """The (ip, port) of ``stream``'s peer: what tap reports as a request's source. None when the transport
    does not say (it is closing)."""
    peer = stream.transport.get_extra_info("peername") if stream.transport is not None else None
    if not (isinstance(peer, tuple) and len(peer) >= 2):
        return None
    ip = str(peer[0])
    # An IPv4 client of a dual-stack listener shows as ::ffff:a.b.c.d; Linkerd reports it as IPv4.
    return (ip[7:] if ip.startswith("::ffff:") and "." in ip else ip), int(peer[1])


class _Lost(asyncio.BufferedProtocol):
    """What a lost TLS stream's transport is left pointing to (see ``Stream.connection_lost``)."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return READ_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        pass


_LOST = _Lost()


def abort(*streams: Stream) -> None:
    """A joined connection no longer authorized: each side closed at once, what is buffered dropped."""
    for stream in streams:
        if not stream.lost:
            stream.transport.abort()


def link(a: Stream, b: Stream) -> None:
    """Join two streams: what each buffered goes to the other first, then every read."""
    a.peer, b.peer = b, a
    for src, dst in ((a, b), (b, a)):
        if src.buffer and not dst.lost:
            data = src.take()
            dst.tx += len(data)
            dst.transport.write(data)
    for src, dst in ((a, b), (b, a)):
        if src.lost:
            if not dst.lost:
                dst.transport.close()
        elif src.eof:
            if dst.eof:
                src.transport.close()
                dst.transport.close()
            else:
                _pass_eof(dst)


def _pass_eof(dst: Stream) -> None:
    """The other side said EOF: half-close towards ``dst`` where TCP allows it, else end its TLS session."""
    if dst.lost:
        return
    if dst.transport.can_write_eof():
        dst.transport.write_eof()
    else:
        # A TLS transport cannot send close_notify and go on reading: end the session (after what is buffered).
        dst.transport.close()


