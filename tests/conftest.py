"""What every test directory shares: a runner for ``async def`` tests (no pytest-asyncio here).

An ``async def test_...`` runs in a fresh event loop with a deadline, so a
stream that never delivers fails the test instead of hanging it. The deadline is
a guard against hangs, not a timing threshold: a module whose tests are slow for
a known reason sets its own ``ASYNC_TEST_DEADLINE``.
"""

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
        deadline = getattr(pyfuncitem.module, "ASYNC_TEST_DEADLINE", ASYNC_TEST_DEADLINE)
        await asyncio.wait_for(pyfuncitem.obj(**arguments), deadline)

    asyncio.run(with_deadline())
    return True
