"""One client stream's bounded outbox and its single writer: why a slow client can never hurt the server.

Translators (destination and policy) call ``send`` from the index's callbacks;
it never blocks: it appends encoded bytes to a queue of at most ``capacity``
messages and ``max_bytes`` bytes, or, when either bound would be passed, ends
the stream (``OVERFLOW``) and drops what was queued.  Bounding bytes as well as
messages matters: a few hundred unread streams of 30 KB profiles, 100 deep,
held a gigabyte before the message bound ever tripped.  A single message
larger than ``max_bytes`` still goes out when the queue is empty (a snapshot
must always be deliverable).  The RPC handler (``tether.serving.rpc``) runs
``run`` as the stream's only writer; it returns why the stream ended.  A write stuck on a client that
stopped reading is interrupted by the overflow, so the handler can end the RPC
with a status at once instead of waiting for the client.  Shutdown ends every
stream the same way with ``SHUTDOWN``.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from typing import Any


class EndReason(enum.Enum):
    OVERFLOW = "the client did not read its updates fast enough"
    SHUTDOWN = "the server is shutting down"
    GONE = "the target no longer exists"


DEFAULT_MAX_BYTES = 1 << 20  # per stream: ~30 large profiles, thousands of endpoint diffs


class UpdateStream:
    """``send`` encoded messages; ``run`` writes them in order until the stream is ended."""

    # Slots, a list and a bare future (rather than a deque and an asyncio.Event, ~1 KiB more):
    # a server holds thousands of these.
    __slots__ = ("_capacity", "_max_bytes", "_bytes", "_items", "_waiter", "_end", "_writer", "_writing",
                 "_on_sent", "_on_overflow")

    def __init__(
        self,
        capacity: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_sent: Callable[[float | None], None] | None = None,
        on_overflow: Callable[[], None] | None = None,
    ) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: list[tuple[bytes, float | None]] = []
        self._waiter: asyncio.Future[None] | None = None
        self._end: EndReason | None = None
        self._writer: asyncio.Task[Any] | None = None
        self._writing = False
        self._on_sent = on_sent
        self._on_overflow = on_overflow

    @property
    def queued(self) -> int:
        return len(self._items)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def ended(self) -> EndReason | None:
        return self._end

    def send(self, message: bytes, at: float | None) -> None:
        """Queue ``message`` (caused by a change seen at monotonic time ``at``, if any); never blocks."""
        if self._end is not None:
            return
        if len(self._items) >= self._capacity or (self._items and self._bytes + len(message) > self._max_bytes):
            self._finish(EndReason.OVERFLOW)
            if self._on_overflow is not None:
                self._on_overflow()
            return
        self._items.append((message, at))
        self._bytes += len(message)
        self._wake()

    def end(self, reason: EndReason = EndReason.SHUTDOWN) -> None:
        self._finish(reason)

    def _finish(self, reason: EndReason) -> None:
        if self._end is not None:
            return
        self._end = reason
        self._items.clear()
        self._bytes = 0
        self._wake()
        if self._writing and self._writer is not None:
            self._writer.cancel()  # the write waits on a client that does not read: give up on it

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run(self, write: Callable[[bytes], Awaitable[None]]) -> EndReason:
        """Write queued messages with ``write`` until the stream ends; return why it ended.

        Cancellation from outside (the client went away) propagates.
        """
        self._writer = asyncio.current_task()
        loop = asyncio.get_running_loop()
        try:
            while self._end is None:
                if not self._items:
                    self._waiter = loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                    continue
                message, at = self._items.pop(0)  # at most ``capacity`` items: cheap
                self._bytes -= len(message)
                self._writing = True
                try:
                    await write(message)
                finally:
                    self._writing = False
                if self._on_sent is not None:
                    self._on_sent(None if at is None else time.monotonic() - at)
        except asyncio.CancelledError:
            if self._end is None or self._writer is None:
                raise
            self._writer.uncancel()  # our own cancellation of a stuck write: the stream has ended
        return self._end
