"""The gRPC contracts of emoji and voting: method names, a JSON codec, servers and clients.

Messages are JSON objects carried in ordinary gRPC frames, so the wire is real
gRPC over HTTP/2 (paths ``/emojivoto.v1.EmojiService/ListAll`` and so on,
``grpc-status`` trailers) without generated code.  Servers are grpcio generic
handlers; clients are grpcio multi-callables with the same codec.

Callers: ``emojivoto.emoji``, ``emojivoto.voting`` (servers), ``emojivoto.web``
(clients) and the tests.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

# The pods' resolv.conf names no DNS server; service names are in /etc/hosts.
# gRPC's own resolver (c-ares) would ask a server, the native one reads /etc/hosts.
os.environ.setdefault("GRPC_DNS_RESOLVER", "native")

import grpc  # noqa: E402 - after the resolver choice

EMOJI_SERVICE = "emojivoto.v1.EmojiService"
VOTING_SERVICE = "emojivoto.v1.VotingService"

Message = dict[str, Any]
Method = Callable[[Message, grpc.ServicerContext], Message]

# Re-exported so the apps import grpc only through this module (after the resolver choice).
Context = grpc.ServicerContext
Handler = grpc.GenericRpcHandler
RpcError = grpc.RpcError
StatusCode = grpc.StatusCode

# How long web waits for a back end before answering 504 (seconds).
DEFAULT_DEADLINE = 2.0


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def decode(data: bytes) -> Message:
    if not data:
        return {}
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("a message must be a JSON object")
    return value


def service_handler(service: str, methods: Mapping[str, Method]) -> grpc.GenericRpcHandler:
    """A generic handler serving ``/<service>/<method>`` for each unary method."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=decode, response_serializer=encode)
        for name, fn in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)


def serve(address: str, handler: grpc.GenericRpcHandler, workers: int = 8) -> tuple[grpc.Server, int]:
    """Start a server on ``address`` (``host:port``; port 0 picks one); returns it and the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server, port


class _Client:
    service = ""

    def __init__(self, target: str, deadline: float = DEFAULT_DEADLINE) -> None:
        self.target = target
        self.deadline = deadline
        self.channel = grpc.insecure_channel(target)

    def _call(self, method: str, request: Message) -> Message:
        stub = self.channel.unary_unary(f"/{self.service}/{method}", request_serializer=encode,
                                        response_deserializer=decode)
        return stub(request, timeout=self.deadline)

    def close(self) -> None:
        self.channel.close()


class EmojiClient(_Client):
    service = EMOJI_SERVICE

    def list_all(self) -> list[Message]:
        return list(self._call("ListAll", {}).get("list", []))

    def find(self, shortcode: str) -> Message | None:
        return self._call("FindByShortcode", {"shortcode": shortcode}).get("emoji")


class VotingClient(_Client):
    service = VOTING_SERVICE

    def vote(self, shortcode: str) -> None:
        self._call("Vote", {"shortcode": shortcode})

    def results(self) -> list[Message]:
        return list(self._call("Results", {}).get("results", []))


def wait_for_signal() -> None:
    """Block until SIGTERM or SIGINT (the platform stops a container with SIGTERM)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1):
            pass
    except KeyboardInterrupt:
        pass
