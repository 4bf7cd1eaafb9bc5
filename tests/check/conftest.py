"""The local platform fixtures of ``tests/up`` (one running platform per module, torn down and checked)."""

from up.conftest import clean_host, new_platform, running  # noqa: F401
