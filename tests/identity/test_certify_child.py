"""The proxy's certify child (`CertifyChild`): a spawned interpreter that shares nothing with the proxy but two pipes."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from pathlib import Path

import pytest

from tether.proxy.io.identity_client import CertifyChild, IdentityUnavailable, PrivateKey, certify_helper


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def _pid(child: CertifyChild) -> int:
    assert child.pid is not None
    return child.pid


def test_a_round_makes_a_key_and_csr_and_names_what_failed() -> None:
    async def scenario() -> None:
        password = secrets.token_bytes(32)
        async with CertifyChild() as child:
            made = await child.ask({"op": "new", "name": "web.default.serviceaccount.identity.linkerd.cluster.local",
                                    "password": password.hex()})
            assert PrivateKey.of(made, password).pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
            assert made["csr"]
            with pytest.raises(IdentityUnavailable, match="KeyError: 'password'"):
                await child.ask({"op": "new"})
            # A failed request does not end the round: the same child answers the next one.
            again = await child.ask({"op": "new", "name": "a.b", "password": password.hex()})
            assert again["csr"] != made["csr"]

    run(scenario())


def test_the_child_holds_no_descriptor_of_the_proxy() -> None:
    """A forked child kept every socket of the proxy open until it exited (their FINs waited for it)."""
    async def scenario() -> None:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            ours = os.readlink(f"/proc/self/fd/{held.fileno()}")
            async with CertifyChild() as child:
                await child.ask({"op": "new", "name": "a.b", "password": "00"})  # started: its descriptors settled
                fds = Path(f"/proc/{_pid(child)}/fd")
                theirs = {os.readlink(fd) for fd in fds.iterdir()}
                assert ours not in theirs
                assert not any(target.startswith("socket:") for target in theirs), theirs

    run(scenario())


def test_the_child_exits_with_its_round_and_is_killed_when_cancelled() -> None:
    async def scenario() -> None:
        async with CertifyChild() as child:
            pass
        assert child.returncode == 0
        entered = asyncio.Event()
        held: list[CertifyChild] = []

        async def round_cut_short() -> None:
            async with CertifyChild() as child:
                held.append(child)
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(round_cut_short())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert held[0].returncode is not None and held[0].returncode < 0  # killed, and reaped

    run(scenario())


def test_one_request_in_a_child_of_its_own() -> None:
    async def scenario() -> None:
        with pytest.raises(IdentityUnavailable, match="failed: CertError: trust anchors"):
            await certify_helper({"op": "bogus", "password": "00", "anchors": "", "now": "2026-12-02T00:00:00+00:00"})

    run(scenario())


UNPRIVILEGED = """
import asyncio, sys
from tether.proxy.io.identity_client import CertifyChild

async def main():
    async with CertifyChild() as child:
        print(sorted(await child.ask({"op": "new", "name": "a.b", "password": "00"})))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
def test_a_proxy_running_as_an_unprivileged_uid_can_start_its_child() -> None:
    """Local pods' proxies run as a uid of their own, which may not look up the interpreter's path (a Python
    under /root): the child is started from the running interpreter's own file, with the proxy's search path."""
    import subprocess
    import sys

    done = subprocess.run(["setpriv", "--reuid=210299999", "--regid=210299999", "--clear-groups",
                           sys.executable, "-c", UNPRIVILEGED], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['csr', 'key']"
