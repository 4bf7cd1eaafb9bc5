"""Fixtures for the policy controller tests, and a runner for ``async def`` tests (no pytest-asyncio here).

An ``async def test_...`` runs in a fresh event loop with a deadline, so a
stream that never delivers fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
from policy_helpers import Pki, make_pki

ASYNC_TEST_DEADLINE = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def with_deadline() -> None:
        await asyncio.wait_for(pyfuncitem.obj(**arguments), ASYNC_TEST_DEADLINE)

    asyncio.run(with_deadline())
    return True


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("policy-pki"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
