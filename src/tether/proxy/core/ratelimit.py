"""An inbound server's local HTTP rate limit (``HTTPLocalRateLimitPolicy``; proxy.md §8.3), pure.

Limits are requests per second, each a token bucket holding one second's worth
(a burst of ``rps`` requests, refilled at ``rps`` per second). A request is
checked first against its client's own limit -- the override naming its
identity, else the per-identity limit (clients without an identity share
one bucket) -- then against the server's total; the first that is empty
refuses it with its scope (``identity`` or ``total``), and a refused request
takes no token from the other limit.

Callers: ``core.policy_translation`` (built once per policy message, so it is
shared by every connection to the port) and ``core.inbound_authz``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.proxy.core.authz import Meta

MAX_CLIENT_BUCKETS = 10_000  # per-identity buckets kept; past it they start again (full)


@dataclass(slots=True)
class _Bucket:
    rps: int
    tokens: float
    at: float

    def take(self, now: float, *, spend: bool = True) -> bool:
        self.tokens = min(float(self.rps), self.tokens + (now - self.at) * self.rps)
        self.at = now
        if self.tokens < 1.0:
            return False
        if spend:
            self.tokens -= 1.0
        return True


@dataclass(slots=True)
class RateLimit:
    meta: Meta
    total: int | None = None
    identity: int | None = None
    overrides: Mapping[str, int] = field(default_factory=dict)
    _total: _Bucket | None = None
    _clients: dict[str | None, _Bucket] = field(default_factory=dict)

    def check(self, client_id: str | None, now: float) -> str | None:
        """None when the request may go (its tokens taken), else the refusing scope: ``identity`` or ``total``."""
        rps = self.overrides.get(client_id, self.identity) if client_id is not None else self.identity
        client = None
        if rps is not None:
            client = self._clients.get(client_id)
            if client is None or client.rps != rps:
                if len(self._clients) >= MAX_CLIENT_BUCKETS:
                    self._clients.clear()  # a full bucket is what a forgotten client would start with anyway
                client = self._clients[client_id] = _Bucket(rps, float(rps), now)
            if not client.take(now, spend=False):
                return "identity"
        if self.total is not None:
            if self._total is None:
                self._total = _Bucket(self.total, float(self.total), now)
            if not self._total.take(now):
                return "total"
        if client is not None:
            client.take(now)
        return None
