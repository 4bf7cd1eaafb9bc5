"""The local platform fixtures of ``tests/up`` (one running platform per module, torn down and checked),
and the ``async def`` test runner of ``tests/k8s`` (for the kmock tests)."""

from k8s.conftest import pytest_pyfunc_call  # noqa: F401
from up.conftest import clean_host, new_platform, running  # noqa: F401
