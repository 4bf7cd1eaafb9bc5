"""The decision behind one Certify call, free of gRPC I/O: check, authenticate, issue.

``tether.identity.server`` calls ``Certifier.certify`` for each request and turns a
``CertifyError`` into the gRPC status its ``Reason`` names.  The checks: issuer loaded, every
field present, token verified, token identity equal to the requested one, and only then CSR
parses, issuer valid, CSR conforming.  Linkerd parses the CSR first; here the token comes first
so that a caller without a valid token never gets the service to parse anything it sent.

Token verification runs inline: the local verifier is an HMAC check.  A verifier that makes a
network call (Kubernetes TokenReview) should run off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509

from tether.identity.ca import CertificateAuthority, check_csr, parse_csr
from tether.identity.errors import CertifyError, Reason
from tether.naming import InvalidName, WorkloadIdentity
from tether.platform.tokens import IDENTITY_AUDIENCE, InvalidToken, TokenError, TokenNotAuthenticated, TokenVerifier


@dataclass(frozen=True, slots=True)
class Issued:
    leaf: x509.Certificate
    intermediates: tuple[x509.Certificate, ...]  # issuer first, up to but not including the anchor

    @property
    def valid_until(self) -> datetime:
        return self.leaf.not_valid_after_utc


class Certifier:
    def __init__(
        self,
        authority: Callable[[], CertificateAuthority | None],
        verifier: TokenVerifier,
        *,
        control_plane_ns: str,
        trust_domain: str,
        clock: Callable[[], datetime],
    ) -> None:
        self._authority = authority
        self._verifier = verifier
        self._control_plane_ns = control_plane_ns
        self._trust_domain = trust_domain
        self._clock = clock

    def certify(self, identity: str, token: bytes, csr_data: bytes) -> Issued:
        """Issue a leaf for ``identity`` or raise ``CertifyError``."""
        authority = self._authority()  # taken once: a concurrent issuer swap does not affect this call
        if authority is None:
            raise CertifyError(Reason.ISSUER_NOT_READY, "cert issuer not ready yet")
        for value, what in ((identity, "identity"), (token, "token"), (csr_data, "certificate_signing_request")):
            if not value:
                raise CertifyError(Reason.INVALID_REQUEST, f"missing {what}")
        caller = self._authenticate(token)
        if caller.dns_name != identity:
            raise CertifyError(Reason.IDENTITY_MISMATCH, f"token is for {caller.dns_name!r}, not {identity!r}")
        csr = parse_csr(csr_data)
        now = self._clock()
        authority.check_valid_at(now)
        check_csr(csr, identity)
        leaf = authority.issue(csr.public_key(), caller, now)
        return Issued(leaf, authority.issuer.intermediates)

    def _authenticate(self, token: bytes) -> WorkloadIdentity:
        try:
            claims = self._verifier.verify(token, IDENTITY_AUDIENCE)
        except InvalidToken as exc:
            raise CertifyError(Reason.INVALID_TOKEN, f"invalid token: {exc}") from None
        except TokenNotAuthenticated as exc:
            raise CertifyError(Reason.TOKEN_NOT_AUTHENTICATED, f"token not authenticated: {exc}") from None
        except TokenError as exc:  # the verifier itself failed (VerifierUnavailable): not the caller's fault
            raise CertifyError(Reason.INTERNAL, f"cannot verify token: {exc}") from None
        try:
            return WorkloadIdentity(claims.service_account, claims.namespace, self._control_plane_ns, self._trust_domain)
        except InvalidName as exc:
            raise CertifyError(Reason.INVALID_TOKEN, f"invalid token: {exc}") from None
