"""Runs ``async def`` tests in a fresh event loop with a deadline (no pytest-asyncio mode needed)."""

from __future__ import annotations

import asyncio
import inspect

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
