"""Fixtures for the identity tests: a fake clock, a PKI on disk, the local platform's token key."""

from __future__ import annotations

from pathlib import Path

import pytest
from identity_helpers import FakeClock, Pki, make_pki

from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier, TokenKey


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ca_files(tmp_path: Path, clock: FakeClock) -> Pki:
    return make_pki(tmp_path / "pki", clock.now)


@pytest.fixture
def token_key(tmp_path: Path) -> TokenKey:
    return TokenKey.load_or_create(tmp_path / "state")


@pytest.fixture
def signer(token_key: TokenKey, clock: FakeClock) -> LocalTokenSigner:
    return LocalTokenSigner(token_key, clock)


@pytest.fixture
def verifier(token_key: TokenKey, clock: FakeClock) -> LocalTokenVerifier:
    return LocalTokenVerifier(token_key, clock)
