"""Workload tokens on Kubernetes: the API server's TokenReview decides who a token speaks for.

``tether identity serve --platform kubernetes`` hands a ``KubernetesTokenVerifier`` to
the identity service (through ``tether.cli.platform_opts``).  The rules follow Linkerd's
identity validator (control-plane.md §3.3):

* review the token with audience ``identity.l5d.io``; if the review's error mentions
  "token audiences" (an old, non-projected token), review it again without audiences;
* a review error is ``InvalidToken`` (Certify answers InvalidArgument); not authenticated
  is ``TokenNotAuthenticated`` (FailedPrecondition); the API call failing is
  ``VerifierUnavailable`` (Internal);
* the username must be ``system:<type>:<ns>:<name>`` with DNS-1123 labels, else
  ``InvalidToken``; only service accounts (``<type>`` = ``serviceaccount``) have mesh
  identities here.

``TokenReviewer`` is the async core, bound to the loop its ``KubeClient`` runs on.
The seam's ``verify`` is synchronous (the identity service calls it inline), so
``KubernetesTokenVerifier`` runs a reviewer on an event loop of its own, in a daemon
thread, and waits for the answer with a timeout.  The caller's thread blocks for the
length of one TokenReview.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import json
import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tether.naming import InvalidName, check_label
from tether.platform.kubernetes.client import ClientSettings, KubeClient, KubeError
from tether.platform.kubernetes.resources import TOKEN_REVIEWS_PATH
from tether.platform.tokens import (
    InvalidToken,
    TokenClaims,
    TokenNotAuthenticated,
    VerifierUnavailable,
)

log = logging.getLogger(__name__)

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
_NO_EXPIRY = datetime.max.replace(tzinfo=UTC)


class TokenReviewer:
    """Verifies tokens by TokenReview through ``client``; use it on the client's loop."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def review(self, token: bytes, audience: str) -> TokenClaims:
        text = token.decode("utf-8", errors="replace").strip()
        status = await self._create(text, [audience])
        error = status.get("error") or ""
        if error and "token audiences" in error:
            log.debug("token has no audience %r (%s); reviewing it without audiences", audience, error)
            status = await self._create(text, None)
            error = status.get("error") or ""
        if error:
            raise InvalidToken(str(error))
        if not status.get("authenticated"):
            raise TokenNotAuthenticated("the API server did not authenticate the token")
        return _claims(status.get("user") or {}, text)

    async def _create(self, token: str, audiences: list[str] | None) -> Mapping[str, Any]:
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            answer = await self._client.post(TOKEN_REVIEWS_PATH, body)
        except KubeError as exc:
            raise VerifierUnavailable(f"TokenReview failed: {exc}") from None
        status = answer.get("status")
        return status if isinstance(status, dict) else {}


def _claims(user: Mapping[str, Any], token: str) -> TokenClaims:
    username = str(user.get("username") or "")
    parts = username.split(":")
    if len(parts) != 4 or parts[0] != "system":
        raise InvalidToken(f"username must be in form system:TYPE:NS:NAME: {username!r}")
    for part in parts[1:]:
        try:
            check_label("username part", part)
        except InvalidName:
            raise InvalidToken(f"not a label: {part!r} in username {username!r}") from None
    _, kind, namespace, name = parts
    if kind != "serviceaccount":
        raise InvalidToken(f"not a service account token: {username!r}")
    extra = user.get("extra") or {}
    pods = extra.get(POD_NAME_EXTRA) if isinstance(extra, dict) else None
    pod = pods[0] if isinstance(pods, list) and pods and isinstance(pods[0], str) else ""
    return TokenClaims(namespace, name, pod, _expiry(token))


def _expiry(token: str) -> datetime:
    """The ``exp`` claim of a JWT the API server has just vouched for; far future when it has none."""
    parts = token.split(".")
    if len(parts) != 3:
        return _NO_EXPIRY
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        exp = json.loads(payload).get("exp")
    except (binascii.Error, ValueError, AttributeError):
        return _NO_EXPIRY
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return _NO_EXPIRY
    try:
        return datetime.fromtimestamp(exp, UTC)
    except (OverflowError, OSError, ValueError):
        return _NO_EXPIRY


class KubernetesTokenVerifier:
    """The synchronous ``TokenVerifier`` seam over a ``TokenReviewer`` on a private event loop."""

    def __init__(self, settings: ClientSettings | None = None, *, timeout: float = 10.0) -> None:
        self._settings = settings or ClientSettings()
        self._timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: KubeClient | None = None
        self._reviewer: TokenReviewer | None = None

    def verify(self, token: bytes, audience: str) -> TokenClaims:
        loop, reviewer = self._start()
        if threading.current_thread() is self._thread:
            raise RuntimeError("verify() called from the verifier's own loop; await TokenReviewer.review instead")
        future = asyncio.run_coroutine_threadsafe(reviewer.review(token, audience), loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise VerifierUnavailable(f"TokenReview did not answer within {self._timeout:g}s") from None

    def close(self) -> None:
        with self._lock:
            loop, thread, client = self._loop, self._thread, self._client
            self._loop = self._thread = self._client = self._reviewer = None
        if loop is None or thread is None:
            return
        if client is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(self._timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self._timeout)

    def _start(self) -> tuple[asyncio.AbstractEventLoop, TokenReviewer]:
        with self._lock:
            if self._loop is None or self._reviewer is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_forever, args=(loop,), name="token-review", daemon=True)
                thread.start()
                self._client = KubeClient(self._settings)
                self._reviewer = TokenReviewer(self._client)
                self._loop, self._thread = loop, thread
            return self._loop, self._reviewer


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
