"""Cross-process wake-ups for watches: a directory of unix datagram sockets beside the store file.

Each ``Store`` that has watches running in an event loop binds one socket in
``<store file>-watch/`` (a ``Listener``); every writer, after its commit, sends
one byte to each socket there (``WakeDir.notify``) and removes the sockets
nobody is bound to any more (their process is gone).  A wake-up carries no data:
the woken watches read the new events from SQLite themselves, so a lost or
merged wake-up costs latency, never correctness (watches also poll slowly).

Used only by ``tether.store.store``.  Sockets are addressed through
``/proc/self/fd/<dirfd>/<name>`` so that a deep state directory never runs into
the 108-byte limit on unix socket paths (Linux only, like the local platform).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from pathlib import Path

from tether.store.errors import StoreError

_SUFFIX = ".sock"


class WakeDir:
    """The watch directory of one store file, held open by descriptor for the life of a ``Store``."""

    def __init__(self, path: Path) -> None:
        try:
            path.mkdir(exist_ok=True)
            self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise StoreError(f"{path}: cannot open the watch directory ({e.strerror})") from None
        self.path = path
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)

    def address(self, name: str) -> str:
        return f"/proc/self/fd/{self._fd}/{name}"

    def notify(self) -> None:
        """Wake every listener of this store, in any process; never fails (the commit already happened)."""
        try:
            names = os.listdir(self._fd)
        except OSError:
            return  # the watchers' slow poll covers it
        for name in names:
            if not name.endswith(_SUFFIX):
                continue
            try:
                self._sender.sendto(b"\x01", self.address(name))
            except ConnectionRefusedError:
                # Nobody is bound: the listener's process died without cleaning up.
                self.remove(name)
            except OSError:
                # A full queue (EAGAIN) means wake-ups are already pending there; a
                # vanished socket means its listener closed.  Anything else is left to
                # the watchers' slow poll rather than failing a committed write.
                continue

    def remove(self, name: str) -> None:
        """Remove a socket file; one that is already gone or can't be removed is only clutter."""
        try:
            os.unlink(name, dir_fd=self._fd)
        except OSError:
            pass

    def close(self) -> None:
        self._sender.close()
        os.close(self._fd)


class Listener:
    """One bound socket serving every watch of a ``Store`` in one event loop.

    Each watch subscribes an ``asyncio.Event``; a datagram sets all of them, and
    so does a timer every ``poll_interval`` seconds, the fallback for a lost
    wake-up (one timer for all watches rather than a timeout per wait).
    """

    def __init__(self, wake_dir: WakeDir, loop: asyncio.AbstractEventLoop, poll_interval: float) -> None:
        self._dir = wake_dir
        self._loop = loop
        self._name = f"{os.getpid()}-{secrets.token_hex(6)}{_SUFFIX}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setblocking(False)
            self._sock.bind(wake_dir.address(self._name))
        except OSError as e:
            self._sock.close()
            raise StoreError(f"{wake_dir.path}: cannot bind a watch socket ({e.strerror})") from None
        self._subscribers: set[asyncio.Event] = set()
        loop.add_reader(self._sock.fileno(), self._on_readable)
        self._poll_interval = poll_interval
        self._poll = loop.call_later(poll_interval, self._on_poll)

    def _on_readable(self) -> None:
        try:
            while self._sock.recv(64):
                pass
        except BlockingIOError:
            pass
        self.wake_all()

    def _on_poll(self) -> None:
        self._poll = self._loop.call_later(self._poll_interval, self._on_poll)
        self.wake_all()

    def wake_all(self) -> None:
        for event in self._subscribers:
            event.set()

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        self._subscribers.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> bool:
        """Drop one subscriber; True when none is left."""
        self._subscribers.discard(event)
        return not self._subscribers

    def close(self) -> None:
        self._poll.cancel()
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._dir.remove(self._name)
