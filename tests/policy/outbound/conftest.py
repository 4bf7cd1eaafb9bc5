"""Fixtures for the outbound policy tests, and a runner for ``async def`` tests with a deadline."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

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
def certificates(tmp_path_factory: pytest.TempPathFactory) -> object:
    from outbound_grpc_helpers import make_certificates  # needs tether.serving: only the gRPC tests use it

    return make_certificates(tmp_path_factory.mktemp("outbound-pki"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
