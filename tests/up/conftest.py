"""Fixtures for the local platform's end-to-end tests: platforms of this run, torn down even on failure.

Needs root, iproute2 and iptables (else every test that uses a platform is skipped).  At
start the session removes what dead runs left; each platform is torn down by its finalizer
(``tether down --purge``, then a fallback by name), which then checks that ``tether down --purge``
left none of the platform's processes, namespaces, links or files, and that ``ip netns``,
``ip link`` and the host's nat table are as before.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from up import uplab

_tags = itertools.count()


def _can_run() -> bool:
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "iptables", "setpriv"))


@pytest.fixture(scope="session")
def clean_host() -> uplab.Snapshot:
    if not _can_run():
        pytest.skip("needs root, iproute2, iptables and setpriv")
    uplab.remove_dead_runs()
    return uplab.Snapshot.take()


def _make_platform(tmp: Path) -> uplab.Platform:
    index = next(_tags)
    pid = os.getpid()
    prefix = f"tu{pid:x}{uplab.TAGS[index % len(uplab.TAGS)]}"
    # This platform's /27s: 10.197.<pid>.<n*32> for pods and 10.195.<pid>.<n*32> for services.
    third, block = pid % 256, (index % 8) * 32
    home = tmp / "home"
    env = {**os.environ, "TETHER_HOME": str(home), "NO_COLOR": "1"}
    return uplab.Platform(home, prefix, f"10.197.{third}.{block}/27", f"10.195.{third}.{block}/27", env)


@pytest.fixture
def new_platform(clean_host: uplab.Snapshot, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Callable[[], uplab.Platform]:
    """Make a platform (not started) for this test; it is torn down and checked at the end."""

    def make() -> uplab.Platform:
        platform = _make_platform(tmp_path_factory.mktemp("up"))

        def finish() -> None:
            problems = platform.teardown() + clean_host.leftovers(platform.prefix)
            assert not problems, "\n".join(problems)

        request.addfinalizer(finish)
        return platform

    return make


@pytest.fixture(scope="module")
def running(clean_host: uplab.Snapshot, tmp_path_factory: pytest.TempPathFactory) -> Iterator[uplab.Platform]:
    """A platform that is up for the whole module."""
    platform = _make_platform(tmp_path_factory.mktemp("up"))
    try:
        platform.tether("up", *platform.up_args, "--restart-backoff", "0.5")
        yield platform
    finally:
        problems = platform.teardown() + clean_host.leftovers(platform.prefix)
        assert not problems, "\n".join(problems)
