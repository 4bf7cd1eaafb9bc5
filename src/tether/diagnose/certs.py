"""The ``linkerd-identity`` checks: trust anchors and issuer, with Linkerd's descriptions and rules.

Rules (control-plane.md §3.5): trust anchors may be ECDSA P-256 (signed with
ECDSA-SHA256) or RSA 2048/4096 (SHA256-RSA); the issuer must be ECDSA P-256, a
CA, signed by one of the anchors; each must be within its validity period, and
one valid for less than 60 days is a warning.  The same checks serve the local
platform (files under ``$TETHER_HOME/pki``) and Kubernetes (the ``linkerd-config``
ConfigMap and the ``linkerd-identity-issuer`` Secret): the caller passes how to
load the credentials and the hints that fit its platform.

Pure apart from the loader it is given.  Caller: ``tether.diagnose.local`` and ``.kube``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tether.diagnose.checks import Check, Problem
from tether.identity import pki

EXPIRY_WARNING = timedelta(days=60)


@dataclass(frozen=True)
class Credentials:
    anchors: Sequence[x509.Certificate]
    issuer: x509.Certificate


@dataclass(frozen=True)
class IdentityHints:
    config: str
    anchors: str
    issuer: str


def _name(cert: x509.Certificate) -> str:
    return f"{cert.serial_number:x} {pki.subject_cn(cert)}"


def crypto_problem(cert: x509.Certificate, *, rsa_allowed: bool) -> str | None:
    """Why ``cert``'s key or signature is not one Linkerd's identity supports, or None."""
    key = cert.public_key()
    algorithm = cert.signature_hash_algorithm
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            return f"must use P-256 curve for public key, instead {pki.describe_key(key)} was used"
    elif isinstance(key, rsa.RSAPublicKey) and rsa_allowed:
        if key.key_size not in (2048, 4096):
            return f"RSA keys must be 2048 or 4096 bits, instead {key.key_size} was used"
    else:
        allowed = "ECDSA P-256 or RSA 2048/4096" if rsa_allowed else "ECDSA P-256"
        return f"must use {allowed} for public key, instead {pki.describe_key(key)} was used"
    if not isinstance(algorithm, hashes.SHA256):
        name = algorithm.name if algorithm else "none"
        return f"must be signed with ECDSA-SHA256 or SHA256-RSA, instead {name} was used"
    return None


def validity_problem(cert: x509.Certificate, now: datetime) -> str | None:
    if now < cert.not_valid_before_utc:
        return f"not valid before: {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}"
    if now >= cert.not_valid_after_utc:
        return f"not valid anymore. Expired on {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    return None


def expiry_problem(cert: x509.Certificate, now: datetime) -> str | None:
    left = cert.not_valid_after_utc - now
    if left < EXPIRY_WARNING:
        return f"will expire on {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ} ({left.days} days from now)"
    return None


def _each(certs: Sequence[x509.Certificate], rule: Callable[[x509.Certificate], str | None], title: str) -> None:
    problems = [f"* {_name(c)} {p}" for c in certs if (p := rule(c)) is not None]
    if problems:
        raise Problem("\n".join([title, *problems]))


def identity_checks(load: Callable[[], Credentials], now: Callable[[], datetime], hints: IdentityHints) -> list[Check]:
    """Linkerd's ``linkerd-identity`` checks, in its order, sharing what the first one loaded."""
    loaded: list[Credentials] = []

    def creds() -> Credentials:
        if not loaded:
            raise Problem("the certificate configuration could not be read (see the first check)")
        return loaded[0]

    def config_valid() -> None:
        loaded.clear()
        loaded.append(load())

    def issuer_signed() -> None:
        c = creds()
        if pki.signing_anchor(c.issuer, c.anchors) is None:
            problems = "; ".join(f"{pki.subject_cn(a)}: {pki.link_problem(c.issuer, a)}" for a in c.anchors)
            raise Problem(f"issuer cert {pki.subject_cn(c.issuer)} is not issued by any trust anchor ({problems})")
        if not pki.is_ca(c.issuer):
            raise Problem(f"issuer cert {pki.subject_cn(c.issuer)} is not a CA")

    return [
        Check("certificate config is valid", config_valid, hints.config),
        Check("trust anchors are using supported crypto algorithm",
              lambda: _each(creds().anchors, lambda c: crypto_problem(c, rsa_allowed=True), "Invalid roots:"),
              hints.anchors),
        Check("trust anchors are within their validity period",
              lambda: _each(creds().anchors, lambda c: validity_problem(c, now()), "Invalid anchors:"),
              hints.anchors),
        Check("trust anchors are valid for at least 60 days",
              lambda: _each(creds().anchors, lambda c: expiry_problem(c, now()), "Anchors expiring soon:"),
              hints.anchors, warning=True),
        Check("issuer cert is using supported crypto algorithm",
              lambda: _each([creds().issuer], lambda c: crypto_problem(c, rsa_allowed=False), "Invalid issuer:"),
              hints.issuer),
        Check("issuer cert is within its validity period",
              lambda: _each([creds().issuer], lambda c: validity_problem(c, now()), "Invalid issuer:"),
              hints.issuer),
        Check("issuer cert is valid for at least 60 days",
              lambda: _each([creds().issuer], lambda c: expiry_problem(c, now()), "Issuer expiring soon:"),
              hints.issuer, warning=True),
        Check("issuer cert is issued by the trust anchor", issuer_signed, hints.issuer),
    ]
