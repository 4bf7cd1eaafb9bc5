"""Several ``core.http.StreamObserver``s told the same events: tap and the access log on one side."""

from __future__ import annotations

from collections.abc import Sequence

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.errors import ProxyError
from tether.proxy.core.http import ClientAddr, StreamObserver

Header = tuple[bytes, bytes]


class Observers:
    """Tells each observer every event, in order."""

    def __init__(self, *observers: StreamObserver) -> None:
        self.observers = observers

    def begin(self, stream: object, request: RequestHead, client: ClientAddr | None, client_id: str | None) -> None:
        for observer in self.observers:
            observer.begin(stream, request, client, client_id)

    def request(self, stream: object, request: RequestHead, labels: str, client: ClientAddr | None) -> None:
        for observer in self.observers:
            observer.request(stream, request, labels, client)

    def response(self, stream: object, status: int, headers: Sequence[Header]) -> None:
        for observer in self.observers:
            observer.response(stream, status, headers)

    def end(self, stream: object, status: int | None, error: ProxyError | None, grpc_status: int | None = None,
            response_bytes: int = 0, trailers: Sequence[Header] = (), reset_code: int | None = None) -> None:
        for observer in self.observers:
            observer.end(stream, status, error, grpc_status, response_bytes, trailers, reset_code)


def combined(*observers: StreamObserver | None) -> StreamObserver | None:
    """The observers given (None: not there) as one: None for none, the one itself for one."""
    present = [o for o in observers if o is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else Observers(*present)
