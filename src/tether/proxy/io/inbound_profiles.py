"""The ServiceProfiles the inbound proxy applies: one watch per service its requests name (``ProfileSource``).

linkerd2-proxy's inbound side looks up the profile of the logical service a
request names (proxy.md §8.4; ``core.inbound_profile_routes`` says which)
for its per-route metrics (``route_*{direction="inbound"}``), classification
and route timeouts. The first request naming a service opens the watch
(``Discovery.profile_named``, the GetProfile stream shared with every other
user of that name); until its first answer, requests wait for it up to
``skip_timeout`` (``LINKERD2_PROXY_DESTINATION_PROFILE_INITIAL_TIMEOUT``,
500 ms) from the first wait, and go on without a route after that.

A name's watch is let go once no request named it for ``idle_timeout``
(``LINKERD2_PROXY_INBOUND_DISCOVERY_IDLE_TIMEOUT``), and at most ``MAX_NAMES``
names are watched at once: past that a new name gets no profile until one
expires, so clients cannot make the proxy open streams without bound.

Callers: ``tether.proxy.app`` (``InboundSettings.profiles``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tether.proxy.core.commands import Wait
from tether.proxy.core.profiles import Profile, inbound_profile
from tether.proxy.core.resolution import Resolution
from tether.proxy.io.discovery import Discovery, ProfileWatch

MAX_NAMES = 256


class _Name:
    __slots__ = ("watch", "used", "answered", "skip_at", "seen", "profile")

    def __init__(self, watch: ProfileWatch, now: float) -> None:
        self.watch = watch
        self.used = now
        self.answered = False  # the watch's first answer is in (kept here: no call per request to ask it)
        self.skip_at: float | None = None  # when requests stop waiting for that answer
        self.seen: Resolution | None = None  # the resolution ``profile`` was made from
        self.profile: Profile | None = None


class InboundProfiles:
    def __init__(self, discovery: Discovery, idle_timeout: float, skip_timeout: float,
                 clock: Callable[[], float]) -> None:
        self._discovery = discovery
        self._idle = idle_timeout
        self._skip = skip_timeout
        self._clock = clock
        self._names: dict[str, _Name] = {}

    def profile(self, key: str, port: int, *, waited: bool) -> Profile | None | Wait:
        """The inbound profile of the service ``key`` (``name:port``) names (``core.inbound_profile_routes``
        ``ProfileSource``)."""
        entry = self._names.get(key)
        now = self._clock()
        if entry is None:
            if len(self._names) >= MAX_NAMES:
                return None
            entry = self._names[key] = _Name(self._discovery.profile_named(key, port), now)
            asyncio.get_running_loop().call_later(self._idle, self._expire, key)
        entry.used = now
        watch = entry.watch
        if not entry.answered:
            entry.answered = watch.ready
            if not entry.answered:
                if entry.skip_at is None:
                    entry.skip_at = now + self._skip
                if waited or now >= entry.skip_at:
                    return None
                return Wait(watch, entry.skip_at - now)
        resolution = watch.resolution
        if resolution is not entry.seen:  # translated once per profile update, not per request
            entry.seen = resolution
            entry.profile = inbound_profile(resolution.profile) if resolution.profile is not None else None
        return entry.profile

    def _expire(self, key: str) -> None:
        entry = self._names.get(key)
        if entry is None:  # closed meanwhile
            return
        idle_for = self._clock() - entry.used
        if idle_for < self._idle:
            asyncio.get_running_loop().call_later(self._idle - idle_for, self._expire, key)
            return
        del self._names[key]
        entry.watch.release()

    def close(self) -> None:
        """Let every watch go (the proxy stops)."""
        names, self._names = self._names, {}
        for entry in names.values():
            entry.watch.release()
