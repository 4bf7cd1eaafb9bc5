"""A server-streaming gRPC call as the control-plane tests read it (``tests/destination``, ``tests/policy``): each
message awaited within a bound (never a sleep), the failure the call ends with, its status code.

A module of ``tests/`` itself: pytest puts ``tests/`` on ``sys.path`` for its ``conftest.py``, so every
directory's tests import it as ``grpc_streams``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

WAIT = 10.0  # seconds any single expected message may take (generous: CI machines are shared)


async def next_message(call: Any, timeout: float = WAIT) -> Any:
    """The call's next message; fails if the stream ends instead."""
    message = await asyncio.wait_for(call.read(), timeout)
    assert message is not grpc.aio.EOF, "the stream ended"
    return message


class ServerStream:
    """One open call, read a message at a time; ``next`` gives each as ``to_dict`` makes it, ``raw`` as sent."""

    def __init__(self, call: Any, to_dict: Callable[[Any], dict[str, Any]]) -> None:
        self.call = call
        self._to_dict = to_dict

    async def next(self, timeout: float = WAIT) -> dict[str, Any]:
        return self._to_dict(await next_message(self.call, timeout))

    async def raw(self, timeout: float = WAIT) -> Any:
        return await next_message(self.call, timeout)

    async def error(self, timeout: float = WAIT) -> grpc.aio.AioRpcError:
        """Read until the call fails; return the failure."""
        async def drain() -> grpc.aio.AioRpcError:
            try:
                while await self.call.read() is not grpc.aio.EOF:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc
            raise AssertionError("the stream ended with OK")
        return await asyncio.wait_for(drain(), timeout)

    async def code(self, timeout: float = WAIT) -> grpc.StatusCode:
        return await asyncio.wait_for(self.call.code(), timeout)

    def cancel(self) -> None:
        self.call.cancel()
