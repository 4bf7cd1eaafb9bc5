"""Protocol detection on an accepted socket by peeking: the bytes stay in the kernel for whoever reads next.

``detect(sock, tls=..., timeout=...)`` feeds what ``MSG_PEEK`` shows into a
``codec.detect.Detector`` until it has a verdict, as Linkerd peeks. When the
first bytes are not enough, ``SO_RCVLOWAT`` makes the socket readable only once
more bytes (or EOF) are there, so nothing spins. Nothing is consumed, so a TLS
stack (or the app, or an HTTP server) then reads the connection from its first
byte.

Callers: ``io.driver`` (the inbound and outbound ``Detect`` command) and
``io.admin`` (mesh TLS and HTTP detection on the admin port).
"""

from __future__ import annotations

import asyncio
import socket

from tether.proxy.codec import detect
from tether.proxy.codec.client_hello import MAX_CLIENT_HELLO_SIZE
from tether.proxy.codec.common import NEED_DATA


async def detect_on(sock: socket.socket, *, tls: bool, timeout: float) -> detect.Verdict:
    """The verdict on ``sock``'s first bytes (TLS first when ``tls``), or the detector's on timeout."""
    detector = detect.Detector(tls=tls)
    limit = MAX_CLIENT_HELLO_SIZE if tls else detect.HTTP_SNIFF_BYTES
    seen = 0
    lowat = False
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    data = sock.recv(limit, socket.MSG_PEEK)
                except BlockingIOError:
                    await readable(sock)
                    continue
                except OSError:
                    data = b""
                if len(data) == seen:
                    # Readable, yet nothing new: the client closed (or reset) after what it sent.
                    answer = detector.receive_data(b"")
                else:
                    answer = detector.receive_data(data[seen:])
                    seen = len(data)
                if answer is not NEED_DATA:
                    assert isinstance(answer, detect.Verdict)
                    return answer
                # Readable again only with more bytes than we have seen, or at EOF.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, seen + 1)
                lowat = True
                await readable(sock)
    except TimeoutError:
        return detector.on_timeout()
    finally:
        if lowat:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:
                pass


def readable(sock: socket.socket) -> asyncio.Future[None]:
    """Done when ``sock`` is readable (per its ``SO_RCVLOWAT``)."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    waiter: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, set_once, waiter)
    waiter.add_done_callback(lambda _: loop.remove_reader(fd))
    return waiter


def set_once(waiter: asyncio.Future[None]) -> None:
    """Complete ``waiter`` unless it is done (a reader or writer callback may fire again before removal)."""
    if not waiter.done():
        waiter.set_result(None)
