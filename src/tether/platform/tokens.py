"""The workload-token seam: how the identity service learns who is asking for a certificate.

The identity service (``tether.identity.certifier``) calls a ``TokenVerifier``; each platform
supplies one: ``tether.platform.local.tokens`` verifies tokens the local platform signed, and
the Kubernetes platform will ask the API server (TokenReview).  The error classes mirror what a
TokenReview can say, so the identity service maps them to Certify statuses the same way for
both platforms.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

# The audience Linkerd's proxies request their projected service-account tokens for.
IDENTITY_AUDIENCE = "identity.l5d.io"


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """Who a verified token speaks for."""

    namespace: str
    service_account: str
    pod: str
    expires_at: datetime


class TokenError(Exception):
    """A token could not be verified."""


class InvalidToken(TokenError):
    """The verifier rejected the token with a reason (TokenReview ``status.error``)."""


class MalformedToken(InvalidToken):
    """Not a token of the expected form: bad encoding, missing or ill-formed claims."""


class ForgedToken(InvalidToken):
    """The signature does not verify: not signed by this platform's key."""


class ExpiredToken(InvalidToken):
    """Past its expiry (or not valid yet)."""


class WrongAudience(InvalidToken):
    """Issued for another audience than the one asked for."""


class TokenNotAuthenticated(TokenError):
    """The verifier declined the token without an error (TokenReview ``authenticated: false``)."""


class VerifierUnavailable(TokenError):
    """The verifier itself failed (e.g. the API server could not be reached); not the caller's fault."""


class TokenVerifier(Protocol):
    """Verify a workload token for ``audience``; return its claims or raise a ``TokenError``."""

    def verify(self, token: bytes, audience: str) -> TokenClaims: ...
