"""What the serving proxy keeps of its certification, and when it certifies again. No X.509 parsing here.

The key, the CSR and the checks of a Certify answer need ``cryptography``
(``core.certs``), about 12 MB of resident memory once loaded; the serving
proxy never loads it: ``tether.proxy.certify`` does that work in a
short-lived process (``io.identity_client``), and the proxy holds only
what it hands to ``ssl``: the checked chain as PEM and when it expires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tether.proxy.core.config import Backoff

REFRESH_FRACTION = 0.7  # renew at 70 % of the remaining lifetime, as linkerd2-proxy


class CertError(Exception):
    """Trust anchors or a Certify answer the proxy cannot use."""


@dataclass(frozen=True, slots=True)
class Certified:
    """A verified answer to Certify."""

    chain_pem: bytes  # leaf then intermediates, as a TLS stack presents them
    valid_until: datetime


@dataclass(frozen=True, slots=True)
class RefreshPolicy:
    """When to call Certify again.

    After a success: 70 % of the remaining lifetime, kept within ``[min_refresh, max_refresh]``.
    After failures: ``backoff`` (``core.config.Backoff``: doubling from its min up to its max,
    plus up to its jitter of itself at random), but never later than the success schedule of the
    certificate still held, so a retry always comes before it expires.
    """

    min_refresh: timedelta = timedelta(seconds=10)
    max_refresh: timedelta = timedelta(hours=24)
    backoff: Backoff = Backoff(timedelta(milliseconds=100), timedelta(seconds=60), 0.1)

    def after_success(self, valid_until: datetime | None, now: datetime) -> timedelta:
        if valid_until is None or valid_until <= now:
            return self.min_refresh
        return min(max((valid_until - now) * REFRESH_FRACTION, self.min_refresh), self.max_refresh)

    def after_failure(
        self, failures: int, valid_until: datetime | None, now: datetime, random: Callable[[], float]
    ) -> timedelta:
        """The wait after ``failures`` consecutive failures (1 for the first)."""
        backoff = timedelta(seconds=self.backoff.delay(failures, random()))
        wait: timedelta = min(backoff, self.after_success(valid_until, now))
        return wait
