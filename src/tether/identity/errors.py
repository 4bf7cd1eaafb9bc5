"""Why a Certify call failed, and the one table mapping each reason to its gRPC status.

Raised by ``tether.identity.ca`` (CSR and issuer rules) and ``tether.identity.certifier``
(request and token rules); ``tether.identity.server`` turns them into gRPC statuses and the
``identity_certify_failures_total{reason}`` metric.  The statuses follow Linkerd's identity
service (control-plane reference §3.3); docs/identity.md explains each one.
"""

from __future__ import annotations

import enum

import grpc


class Reason(enum.Enum):
    """A failure reason: its metric label and the status Certify returns for it."""

    INVALID_REQUEST = ("invalid_request", grpc.StatusCode.INVALID_ARGUMENT)  # empty identity/token/CSR
    MALFORMED_CSR = ("malformed_csr", grpc.StatusCode.INVALID_ARGUMENT)  # not DER, bad self-signature
    CSR_REJECTED = ("csr_rejected", grpc.StatusCode.FAILED_PRECONDITION)  # SANs, CN or key break the rules
    INVALID_TOKEN = ("invalid_token", grpc.StatusCode.INVALID_ARGUMENT)  # malformed, forged, expired
    TOKEN_NOT_AUTHENTICATED = ("token_not_authenticated", grpc.StatusCode.FAILED_PRECONDITION)
    IDENTITY_MISMATCH = ("identity_mismatch", grpc.StatusCode.FAILED_PRECONDITION)  # token is someone else
    ISSUER_NOT_READY = ("issuer_not_ready", grpc.StatusCode.UNAVAILABLE)
    ISSUER_NOT_VALID = ("issuer_not_valid", grpc.StatusCode.FAILED_PRECONDITION)  # expired / not yet valid
    INTERNAL = ("internal", grpc.StatusCode.INTERNAL)  # token verifier down, signing failed

    def __init__(self, label: str, code: grpc.StatusCode) -> None:
        self.label = label
        self.code = code


class CertifyError(Exception):
    """A Certify call refused for ``reason``; ``str(self)`` is the message sent to the caller."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
