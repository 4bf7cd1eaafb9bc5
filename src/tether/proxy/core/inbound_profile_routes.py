"""The ServiceProfile route of an inbound request (proxy.md §8.4): the logical service it names, and the wait.

linkerd2-proxy's inbound side names each request's logical service by its
``l5d-dst-canonical`` (``name:port``, set by the client's proxy), else by the
authority of its URI (HTTP/2's ``:authority``, an HTTP/1 absolute-form
target's), else by its ``Host`` (port 80 when none is given) -- only a DNS
name counts, never an IP literal, and a canonical header that does not parse
falls back to the next. When that name is under
``LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES``, the service's profile
gives the request its route: classification, timeout and the ``route_*``
families with ``direction="inbound"``.

A service's first requests wait for the first profile answer, at most
``LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT`` (500 ms) from the
first of them (linkerd2-proxy's ``SwitchReady``); once that time is up, the
following ones go on without a route until the answer is in, and none waits
again. ``ProfileSource`` (``io.inbound_profiles``) keeps the watches and
says which case a name is in.

Pure. Caller: ``core.inbound_route_metrics`` (``InboundRouteMetrics.routed``
asks ``route`` once a request is routed to the app).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.commands import Wait
from tether.proxy.core.http import logical_names
from tether.proxy.core.profiles import Profile, Route, discoverable, name_addr

# "name:port" (the profile's lookup key; "" outside the suffixes), the port, and the name as linkerd2-proxy's
# inbound metrics label it (``authority``: without the port when it is 80).
Logical = tuple[str, int, str]
MAX_VALUES = 1024  # header values whose parse is kept (a client chooses them: bounded)
# Not in a parse cache yet: told by its port (-1, never a real one), not by identity, because mypyc does not keep a
# tuple constant's identity (``is _UNPARSED`` was never true compiled, and every request parsed again).
_UNPARSED: Logical = ("", -1, "")


class ProfileSource(Protocol):
    def profile(self, key: str, port: int, *, waited: bool) -> Profile | None | Wait:
        """The inbound profile of ``key`` (``name:port``) if known now, None if it has none (or none is known
        and the request goes on without), or the ``Wait`` to yield first (never when ``waited``: the request
        already waited once)."""
        ...


class InboundProfileRoutes:
    """Per request: its logical service, then that service's profile route."""

    __slots__ = ("_source", "_suffixes", "_canonical", "_authority", "logical_authority")

    def __init__(self, source: ProfileSource, suffixes: Sequence[str]) -> None:
        self._source = source
        self._suffixes = tuple(suffixes)
        # Parses by header value: a connection's requests repeat a few values, so each is parsed once.
        self._canonical: dict[bytes, Logical | None] = {}
        self._authority: dict[bytes, Logical | None] = {}
        # The logical name of the request ``route`` last named ("" when none), for the ``authority`` label of
        # inbound request metrics (LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS=unsafe; read by
        # ``core.inbound_route_metrics.routed`` right after ``route``): kept here, not found again, so the name
        # is parsed in one place and the request's usual path makes no call for it.
        self.logical_authority = ""

    def route(self, request: RequestHead, *, waited: bool = False) -> Route | None | Wait:
        """``request``'s profile route, None when it takes none, or the ``Wait`` to yield before asking again
        with ``waited`` (the first answer for its service is not in yet). Its service is named here, inline:
        this runs once per inbound request."""
        canonical, authority, host = logical_names(request.headers)
        logical = None
        if canonical is not None:
            logical = self._canonical.get(canonical, _UNPARSED)
            if logical is not None and logical[1] < 0:
                logical = self._parsed(self._canonical, canonical, None)
        if logical is None:  # no canonical name: the URI's authority, else Host
            target = request.target
            if authority is None and b"://" in target:  # HTTP/1 absolute form
                authority = target.partition(b"://")[2].partition(b"/")[0].partition(b"?")[0].rpartition(b"@")[2]
            for given in (authority, host):
                if given is not None:
                    logical = self._authority.get(given, _UNPARSED)
                    if logical is not None and logical[1] < 0:
                        logical = self._parsed(self._authority, given, 80)
                    if logical is not None:
                        break
        if logical is None:
            self.logical_authority = ""
            return None
        self.logical_authority = logical[2]
        if not logical[0]:  # a name outside the suffixes (no fallback then)
            return None
        found = self._source.profile(logical[0], logical[1], waited=waited)
        if found is None or isinstance(found, Wait):
            return found
        return found.route_for(request.method, request.target)

    def _parsed(self, cache: dict[bytes, Logical | None], value: bytes, default_port: int | None) -> Logical | None:
        """``value``'s logical name: None when it names none (the next header is asked), ``("", port, ...)`` when
        it names one outside the suffixes (no profile; linkerd2-proxy does not fall back then)."""
        parsed = name_addr(value, default_port)
        found: Logical | None = None
        if parsed is not None:
            name, port = parsed
            key = f"{name}:{port}"
            # Label as linkerd2-proxy's NameAddr::as_http_authority: the port left out when it is 80.
            found = (key if discoverable(name, self._suffixes) else "", port, name if port == 80 else key)
        if len(cache) >= MAX_VALUES:
            cache.clear()
        cache[value] = found
        return found
