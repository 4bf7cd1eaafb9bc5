"""Fixtures for the policy controller tests (``async def`` tests run by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_helpers import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("policy-pki"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
