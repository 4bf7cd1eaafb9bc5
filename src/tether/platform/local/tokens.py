"""Workload tokens of the local platform: minted per pod, verified offline by the identity service.

The local platform calls ``LocalTokenSigner.mint`` when it starts a pod and writes the token to
the file its proxy reads (``LINKERD2_PROXY_IDENTITY_TOKEN_FILE``).  ``tether identity serve``
builds a ``LocalTokenVerifier`` over the same key, so nothing but that key is shared.

A token is a JWT (RFC 7519) signed with HMAC-SHA256 whose claims copy a Kubernetes projected
service-account token (``sub: system:serviceaccount:<ns>:<sa>`` and the ``kubernetes.io``
block), so the same identity rules apply to both platforms.  The 32-byte key lives in the state
directory, mode 0600, created on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.naming import InvalidName, WorkloadIdentity
from tether.platform.tokens import (
    IDENTITY_AUDIENCE,
    ExpiredToken,
    ForgedToken,
    MalformedToken,
    TokenClaims,
    WrongAudience,
)

KEY_FILE = "identity-token.key"
KEY_BYTES = 32
ISSUER = "tether-local"
DEFAULT_LIFETIME = timedelta(days=1)  # as the injector's projected token (expirationSeconds 86400)

_HEADER = {"alg": "HS256", "typ": "JWT"}

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class TokenKeyError(Exception):
    """The signing key file is unusable; the message names it."""


@dataclass(frozen=True, slots=True)
class TokenKey:
    """The local platform's token-signing secret."""

    secret: bytes

    @classmethod
    def load_or_create(cls, state_dir: Path) -> TokenKey:
        """Read ``<state_dir>/identity-token.key``, creating it (0600) if absent.

        Creation links a fully written temporary file into place, so when two processes race,
        one key wins and both read it.
        """
        path = state_dir / KEY_FILE
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                _create_exclusively(path, secrets.token_bytes(KEY_BYTES))
            secret = path.read_bytes()
        except OSError as exc:
            raise TokenKeyError(f"{path}: {exc.strerror or exc}") from None
        if len(secret) != KEY_BYTES:
            raise TokenKeyError(f"{path}: expected a {KEY_BYTES}-byte key, found {len(secret)} bytes")
        return cls(secret)


class LocalTokenSigner:
    """Mints pod tokens for the local platform."""

    def __init__(self, key: TokenKey, clock: Clock = utc_now) -> None:
        self._key = key
        self._clock = clock

    def mint(
        self,
        *,
        namespace: str,
        service_account: str,
        pod: str,
        audience: str = IDENTITY_AUDIENCE,
        lifetime: timedelta = DEFAULT_LIFETIME,
    ) -> bytes:
        """A token for one pod running as ``service_account`` in ``namespace``."""
        WorkloadIdentity(service_account, namespace)  # refuse to sign names that can never verify
        now = int(self._clock().timestamp())
        claims = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "aud": [audience],
            "iat": now,
            "nbf": now,
            "exp": now + int(lifetime.total_seconds()),
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod},
                "serviceaccount": {"name": service_account},
            },
        }
        signing_input = _b64(_json(_HEADER)) + b"." + _b64(_json(claims))
        return signing_input + b"." + _b64(_sign(self._key, signing_input))


class LocalTokenVerifier:
    """The ``TokenVerifier`` of the local platform: checks signature, audience, time and claims."""

    def __init__(self, key: TokenKey, clock: Clock = utc_now) -> None:
        self._key = key
        self._clock = clock

    def verify(self, token: bytes, audience: str) -> TokenClaims:
        parts = token.strip().split(b".")
        if len(parts) != 3:
            raise MalformedToken("not a compact JWT (expected three dot-separated parts)")
        # The signature is checked before any JSON is read: only the platform's own tokens get parsed.
        signature = _unb64(parts[2], "signature")
        if not hmac.compare_digest(signature, _sign(self._key, parts[0] + b"." + parts[1])):
            raise ForgedToken("signature does not verify with the local platform's key")
        header, claims = _decode_json(parts[0], "header"), _decode_json(parts[1], "claims")
        if header.get("alg") != _HEADER["alg"]:
            raise MalformedToken(f"unsupported algorithm {header.get('alg')!r}")
        now = self._clock().timestamp()
        if not now < _number(claims, "exp"):
            raise ExpiredToken("token has expired")
        if now < _number(claims, "nbf"):
            raise ExpiredToken("token is not valid yet")
        if audience not in _audiences(claims):
            raise WrongAudience(f"token is not for audience {audience!r}")
        return _claims_of(claims)


def _claims_of(claims: dict[str, Any]) -> TokenClaims:
    try:
        k8s = claims["kubernetes.io"]
        namespace = k8s["namespace"]
        service_account = k8s["serviceaccount"]["name"]
        pod = k8s["pod"]["name"]
    except (KeyError, TypeError):
        raise MalformedToken("missing kubernetes.io namespace, pod or service account claims") from None
    if claims.get("sub") != f"system:serviceaccount:{namespace}:{service_account}":
        raise MalformedToken("subject does not match the service account claims")
    if not isinstance(pod, str):
        raise MalformedToken("pod name is not a string")
    try:
        WorkloadIdentity(service_account, namespace)
    except (InvalidName, TypeError) as exc:
        raise MalformedToken(str(exc)) from None
    return TokenClaims(namespace, service_account, pod, datetime.fromtimestamp(_number(claims, "exp"), UTC))


def _audiences(claims: dict[str, Any]) -> list[str]:
    aud = claims.get("aud")
    return [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []


def _number(claims: dict[str, Any], name: str) -> float:
    value = claims.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise MalformedToken(f"claim {name!r} is missing or not a number")
    return value


def _sign(key: TokenKey, signing_input: bytes) -> bytes:
    return hmac.new(key.secret, signing_input, hashlib.sha256).digest()


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _decode_json(part: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(_unb64(part, what))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise MalformedToken(f"{what} is not JSON (or nested too deeply)") from None
    if not isinstance(value, dict):
        raise MalformedToken(f"{what} is not a JSON object")
    return value


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(part: bytes, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise MalformedToken(f"{what} is not base64url") from None


def _create_exclusively(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)  # fails if another process got there first; theirs is kept
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
