"""Routes from tap (``linkerd viz profile --tap``): the distinct requests a resource's proxies received.

Only inbound request heads count -- what the tapped resource *served* -- and
the path ``/`` is left out, as Linkerd does; each distinct method and path is
one route, named ``METHOD /path``.  ``add`` says when ``limit`` distinct routes
were seen (the caller then stops tapping); ``routes`` lists them by name.

Pure.  Callers: ``tether viz profile --tap``; tests.
"""

from __future__ import annotations

from tether.api import tap_pb2
from tether.viz.tables import method_name


class TappedRoutes:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[tuple[str, str]] = set()

    def add(self, event: tap_pb2.TapEvent) -> bool:
        """Take ``event``; True once ``limit`` routes were seen."""
        if event.proxy_direction == tap_pb2.TapEvent.INBOUND and event.http.WhichOneof("event") == "request_init":
            request = event.http.request_init
            if request.path != "/":
                self._seen.add((method_name(request.method), request.path))
        return len(self._seen) >= self.limit

    def routes(self) -> list[tuple[str, str]]:
        """(method, path) of each route, in the order of their names."""
        return sorted(self._seen, key=lambda route: f"{route[0]} {route[1]}")
