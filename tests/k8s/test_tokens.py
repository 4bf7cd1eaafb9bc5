"""TokenReview verification against kmock (its stateless Kubernetes scaffold answering TokenReviews).

The answers mimic a real API server's service-account authenticator
(``FakeAuthenticator``); the rules checked are Linkerd's (control-plane.md §3.3).
"""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import kmock
import pytest

from tether.platform.kubernetes.client import ClientSettings, KubeClient
from tether.platform.kubernetes.tokens import KubernetesTokenVerifier, TokenReviewer
from tether.platform.tokens import (
    IDENTITY_AUDIENCE,
    InvalidToken,
    TokenNotAuthenticated,
    VerifierUnavailable,
)

from .kube_helpers import API_AUDIENCE, TOKEN_REVIEWS, FakeAuthenticator, ThreadedApi, emulated_api, status

WEB = "system:serviceaccount:emojivoto:web"


def jwt(exp: int) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part({'exp': exp, 'sub': WEB})}.c2lnbmF0dXJl"


async def review(tmp_path: Path, authenticator: object, token: str) -> tuple[object, list]:
    async with emulated_api(tmp_path, kmock.KubernetesScaffold) as (api, _, settings):
        api["post", TOKEN_REVIEWS] << authenticator
        client = KubeClient(settings)
        try:
            try:
                result: object = await TokenReviewer(client).review(token.encode(), IDENTITY_AUDIENCE)
            except Exception as exc:  # noqa: BLE001 - the tests compare the outcome
                result = exc
        finally:
            await client.close()
        return result, [r.data for r in api["post"]]


async def test_a_projected_token_is_reviewed_for_the_identity_audience(tmp_path: Path) -> None:
    auth = FakeAuthenticator()
    token = jwt(1_900_000_000)
    auth.add(token, WEB, [IDENTITY_AUDIENCE], pod="web-5d9f-abcde")
    claims, requests = await review(tmp_path, auth, token)
    assert (claims.namespace, claims.service_account, claims.pod) == ("emojivoto", "web", "web-5d9f-abcde")
    assert claims.expires_at == datetime.fromtimestamp(1_900_000_000, UTC)
    assert requests == [{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                         "spec": {"token": token, "audiences": [IDENTITY_AUDIENCE]}}]


async def test_a_legacy_token_is_reviewed_again_without_audiences(tmp_path: Path) -> None:
    auth = FakeAuthenticator()
    auth.add("legacy-token", WEB, [API_AUDIENCE])
    claims, requests = await review(tmp_path, auth, "legacy-token")
    assert (claims.namespace, claims.service_account, claims.pod) == ("emojivoto", "web", "")
    assert claims.expires_at == datetime.max.replace(tzinfo=UTC)  # not a JWT: no expiry known
    assert [r["spec"].get("audiences") for r in requests] == [[IDENTITY_AUDIENCE], None]


async def test_a_rejected_token_is_invalid_without_a_second_review(tmp_path: Path) -> None:
    error, requests = await review(tmp_path, FakeAuthenticator(), "forged")
    assert isinstance(error, InvalidToken)
    assert "invalid bearer token" in str(error)
    assert len(requests) == 1


async def test_not_authenticated_without_an_error(tmp_path: Path) -> None:
    answer = {"kind": "TokenReview", "status": {"authenticated": False, "user": {}}}
    error, _ = await review(tmp_path, lambda: answer, "t")
    assert isinstance(error, TokenNotAuthenticated)


@pytest.mark.parametrize("username", [
    "system:serviceaccount:emojivoto",  # three parts
    "system:serviceaccount:emojivoto:web:extra",
    "admin:serviceaccount:emojivoto:web",  # not system
    "system:serviceaccount:Emojivoto:web",  # not a DNS-1123 label
    "system:serviceaccount:emojivoto:",
    "system:node:emojivoto:web",  # a mesh identity needs a service account
])
async def test_usernames_that_name_no_service_account_are_invalid(tmp_path: Path, username: str) -> None:
    auth = FakeAuthenticator()
    auth.add("t", username, [IDENTITY_AUDIENCE])
    error, _ = await review(tmp_path, auth, "t")
    assert isinstance(error, InvalidToken), error


async def test_api_errors_make_the_verifier_unavailable(tmp_path: Path) -> None:
    forbidden = status(403, "Forbidden", 'tokenreviews.authentication.k8s.io is forbidden: User "x" cannot create')
    error, _ = await review(tmp_path, kmock.Response(status=403, payload=forbidden), "t")
    assert isinstance(error, VerifierUnavailable)
    assert "403" in str(error)


async def test_an_unreachable_api_makes_the_verifier_unavailable(tmp_path: Path) -> None:
    from .kube_helpers import write_kubeconfig

    settings = ClientSettings(kubeconfig=write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9"), connect_timeout=2)
    client = KubeClient(settings)
    try:
        with pytest.raises(VerifierUnavailable):
            await TokenReviewer(client).review(b"t", IDENTITY_AUDIENCE)
    finally:
        await client.close()


def test_the_synchronous_seam_reviews_on_its_own_loop(tmp_path: Path) -> None:
    auth = FakeAuthenticator()
    auth.add("t", WEB, [IDENTITY_AUDIENCE], pod="web-1")
    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        async def script() -> None:
            api.api["post", TOKEN_REVIEWS] << auth

        api.call(script)
        verifier = KubernetesTokenVerifier(api.settings, timeout=5)
        try:
            claims = verifier.verify(b"t", IDENTITY_AUDIENCE)
            assert (claims.namespace, claims.service_account, claims.pod) == ("emojivoto", "web", "web-1")
            with pytest.raises(InvalidToken):
                verifier.verify(b"other", IDENTITY_AUDIENCE)

            async def called_from_a_loop() -> None:  # as the identity service calls it: inline, on its loop
                assert verifier.verify(b"t", IDENTITY_AUDIENCE).service_account == "web"

            asyncio.run(called_from_a_loop())
        finally:
            verifier.close()


def test_the_synchronous_seam_times_out(tmp_path: Path) -> None:
    async def slow() -> dict:
        await asyncio.sleep(5)
        return {}

    with ThreadedApi(tmp_path, kmock.KubernetesScaffold) as api:
        async def script() -> None:
            api.api["post", TOKEN_REVIEWS] << slow

        api.call(script)
        verifier = KubernetesTokenVerifier(api.settings, timeout=0.5)
        try:
            with pytest.raises(VerifierUnavailable, match="did not answer"):
                verifier.verify(b"t", IDENTITY_AUDIENCE)
        finally:
            verifier.close()
