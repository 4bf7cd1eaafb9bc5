"""The open streams of one gRPC service: how each is written until it ends, and how all end on shutdown.

``StreamSet`` is what the destination's and the policy controller's handlers
share: a handler makes an ``UpdateStream`` with ``new_stream``, subscribes its
translator, then awaits ``run``, which writes the stream until the client
leaves, its queue overflows (the RPC ends with ``RESOURCE_EXHAUSTED``) or the
server shuts down (status OK); ``release`` undoes the subscriptions as soon as
the stream ends, before the status goes out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from prometheus_client import Gauge

from tether.serving.stream import DEFAULT_MAX_BYTES, EndReason, UpdateStream

class Rejected(Exception):
    """A request refused before its stream starts, with the status to end it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def passthrough(message: bytes) -> bytes:
    """The response serializer of handlers that write pre-encoded bytes (one encoding shared by many streams)."""
    return message


# How long an overflowed stream's handler waits for its status to go out before leaving it queued.
ABORT_WAIT = 1.0


class StreamSet:
    """Every open stream of a service, with the bounds each new one gets."""

    def __init__(self, capacity: int, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._streams: set[UpdateStream] = set()
        self.stopping = False

    def __len__(self) -> int:
        return len(self._streams)

    def new_stream(
        self, on_sent: Callable[[float | None], None] | None = None, on_overflow: Callable[[], None] | None = None
    ) -> UpdateStream:
        return UpdateStream(self.capacity, max_bytes=self.max_bytes, on_sent=on_sent, on_overflow=on_overflow)

    def shutdown(self) -> None:
        """End every open stream (cleanly, status OK); callers refuse new ones once ``stopping``."""
        self.stopping = True
        for stream in list(self._streams):
            stream.end(EndReason.SHUTDOWN)

    async def run(
        self, stream: UpdateStream, context: grpc.aio.ServicerContext, release: Callable[[], None],
        gauge: Gauge | None = None,
    ) -> None:
        """Write ``stream`` until it ends; ``release`` undoes its subscriptions as soon as it does."""
        self._streams.add(stream)
        if gauge is not None:
            gauge.inc()
        try:
            reason = await stream.run(context.write)
        finally:
            release()
            self._streams.discard(stream)
            if gauge is not None:
                gauge.dec()
        if reason is EndReason.OVERFLOW:
            message = (f"stream ended: {reason.value} (queue of {self.capacity} updates or "
                       f"{self.max_bytes} bytes overflowed); reconnect for a fresh snapshot")
            try:
                await asyncio.wait_for(context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message), ABORT_WAIT)
            except TimeoutError:
                # The status is queued behind data the client has not read; it gets it when it reads
                # (or resets the stream).  This handler does not wait for that.
                raise asyncio.CancelledError() from None
