"""The local platform's workload tokens: minted per pod, verified offline, the key kept 0600."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from tether.naming import InvalidName
from tether.platform.local.tokens import KEY_FILE, LocalTokenSigner, LocalTokenVerifier, TokenKey, TokenKeyError
from tether.platform.tokens import IDENTITY_AUDIENCE, ExpiredToken, ForgedToken, InvalidToken, MalformedToken, WrongAudience

from identity_helpers import FakeClock, web_token


def test_minted_token_verifies_to_its_pod(signer: LocalTokenSigner, verifier: LocalTokenVerifier, clock: FakeClock) -> None:
    claims = verifier.verify(web_token(signer), IDENTITY_AUDIENCE)
    assert (claims.namespace, claims.service_account, claims.pod) == ("emojivoto", "web", "web-0")
    assert claims.expires_at > clock.now


def test_token_looks_like_a_kubernetes_projected_token(signer: LocalTokenSigner) -> None:
    payload = web_token(signer).split(b".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
    assert claims["sub"] == "system:serviceaccount:emojivoto:web"
    assert claims["aud"] == [IDENTITY_AUDIENCE]
    assert claims["kubernetes.io"]["pod"]["name"] == "web-0"


def test_expired_token_is_rejected(signer: LocalTokenSigner, verifier: LocalTokenVerifier, clock: FakeClock) -> None:
    token = signer.mint(namespace="emojivoto", service_account="web", pod="web-0", lifetime=timedelta(minutes=5))
    clock.advance(timedelta(minutes=5))
    with pytest.raises(ExpiredToken):
        verifier.verify(token, IDENTITY_AUDIENCE)


def test_token_from_another_key_is_forged(tmp_path: Path, verifier: LocalTokenVerifier, clock: FakeClock) -> None:
    other = LocalTokenSigner(TokenKey.load_or_create(tmp_path / "other"), clock)
    with pytest.raises(ForgedToken):
        verifier.verify(web_token(other), IDENTITY_AUDIENCE)


def test_edited_claims_break_the_signature(signer: LocalTokenSigner, verifier: LocalTokenVerifier) -> None:
    header, payload, signature = web_token(signer).split(b".")
    claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
    claims["kubernetes.io"]["serviceaccount"]["name"] = "admin"
    claims["sub"] = "system:serviceaccount:emojivoto:admin"
    edited = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    with pytest.raises(ForgedToken):
        verifier.verify(b".".join([header, edited, signature]), IDENTITY_AUDIENCE)


def test_token_for_another_audience_is_rejected(signer: LocalTokenSigner, verifier: LocalTokenVerifier) -> None:
    token = signer.mint(namespace="emojivoto", service_account="web", pod="web-0", audience="other.example")
    with pytest.raises(WrongAudience):
        verifier.verify(token, IDENTITY_AUDIENCE)


@pytest.mark.parametrize("token", [b"", b"garbage", b"a.b", b"!!.??.**", b"e30.e30.AAAA", b"a.b.c.d"])
def test_malformed_tokens_are_rejected(verifier: LocalTokenVerifier, token: bytes) -> None:
    # Unsigned parts are never decoded: a token whose signature does not verify is forged, whatever it holds.
    with pytest.raises(InvalidToken):
        verifier.verify(token, IDENTITY_AUDIENCE)


def test_a_signed_but_deeply_nested_header_is_malformed_not_a_crash(token_key: TokenKey, verifier: LocalTokenVerifier) -> None:
    header = base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).rstrip(b"=")
    signing_input = header + b"." + base64.urlsafe_b64encode(b"{}").rstrip(b"=")
    signature = base64.urlsafe_b64encode(hmac.new(token_key.secret, signing_input, hashlib.sha256).digest()).rstrip(b"=")
    with pytest.raises(MalformedToken, match="nested too deeply"):
        verifier.verify(signing_input + b"." + signature, IDENTITY_AUDIENCE)


def test_signer_refuses_names_that_are_not_dns_labels(signer: LocalTokenSigner) -> None:
    with pytest.raises(InvalidName):
        signer.mint(namespace="Emoji_Voto", service_account="web", pod="web-0")


def test_key_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    first = TokenKey.load_or_create(tmp_path / "state")
    second = TokenKey.load_or_create(tmp_path / "state")
    assert first == second
    assert stat.S_IMODE((tmp_path / "state" / KEY_FILE).stat().st_mode) == 0o600


def test_racing_creators_agree_on_one_key(tmp_path: Path) -> None:
    keys: list[TokenKey] = []
    start = threading.Barrier(8)

    def create() -> None:
        start.wait()
        keys.append(TokenKey.load_or_create(tmp_path / "state"))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert [p.name for p in (tmp_path / "state").iterdir()] == [KEY_FILE]  # no temporary files left


def test_truncated_key_file_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(b"short")
    with pytest.raises(TokenKeyError, match=str(tmp_path / KEY_FILE)):
        TokenKey.load_or_create(tmp_path)
