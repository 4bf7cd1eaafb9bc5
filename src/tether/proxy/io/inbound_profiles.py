"""The ServiceProfiles the inbound proxy applies, by the ``l5d-dst-canonical`` its clients' proxies send.

linkerd2-proxy's inbound side looks up the profile of the logical service a
request was sent to (proxy.md §8.4) for its per-route metrics
(``route_*{direction="inbound"}``), classification and route timeouts. Here
``lookup`` answers from what is known now and never makes a request wait: the
first request naming a service opens the watch (``Discovery.profile_named``,
the GetProfile stream shared with every other user of that name) and goes on
without a route; the following ones get the profile once it is in. (Linkerd
waits up to 500 ms for it instead.)

A name's watch is let go once no request named it for ``idle_timeout``
(``LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT``), and at most ``MAX_NAMES``
names are watched at once: past that a new name gets no profile until one
expires, so clients cannot make the proxy open streams without bound.

Callers: ``tether.proxy.app`` (``InboundSettings.profiles``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tether.proxy.core.profiles import Profile, canonical_name, inbound_profile
from tether.proxy.core.resolution import Resolution
from tether.proxy.io.discovery import Discovery, ProfileWatch

MAX_NAMES = 256


class _Name:
    __slots__ = ("watch", "used", "seen", "profile")

    def __init__(self, watch: ProfileWatch, now: float) -> None:
        self.watch = watch
        self.used = now
        self.seen: Resolution | None = None  # the resolution ``profile`` was made from
        self.profile: Profile | None = None


class InboundProfiles:
    def __init__(self, discovery: Discovery, suffixes: Sequence[str], idle_timeout: float,
                 clock: Callable[[], float]) -> None:
        self._discovery = discovery
        self._suffixes = tuple(suffixes)
        self._idle = idle_timeout
        self._clock = clock
        self._names: dict[str, _Name] = {}

    def lookup(self, value: bytes) -> Profile | None:
        """The inbound profile of the service an ``l5d-dst-canonical`` ``value`` names, if known now."""
        parsed = canonical_name(value, self._suffixes)
        if parsed is None:
            return None
        name, port = parsed
        entry = self._names.get(name)
        now = self._clock()
        if entry is None:
            if len(self._names) >= MAX_NAMES:
                return None
            entry = self._names[name] = _Name(self._discovery.profile_named(name, port), now)
            asyncio.get_running_loop().call_later(self._idle, self._expire, name)
        entry.used = now
        resolution = entry.watch.resolution
        if resolution is not entry.seen:  # translated once per profile update, not per request
            entry.seen = resolution
            entry.profile = inbound_profile(resolution.profile) if resolution.profile is not None else None
        return entry.profile

    def _expire(self, name: str) -> None:
        entry = self._names.get(name)
        if entry is None:  # closed meanwhile
            return
        idle_for = self._clock() - entry.used
        if idle_for < self._idle:
            asyncio.get_running_loop().call_later(self._idle - idle_for, self._expire, name)
            return
        del self._names[name]
        entry.watch.release()

    def close(self) -> None:
        """Let every watch go (the proxy stops)."""
        names, self._names = self._names, {}
        for entry in names.values():
            entry.watch.release()
