"""The proxy as a process: ``python -m tether.proxy`` and ``tether proxy``, configured only by the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from executables import TETHER
from proxy_harness import EchoServer, Mesh, connection, proxy_process, run


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_missing_or_bad_variables_exit_64_naming_the_variable(tmp_path: Path) -> None:
    base = {"PATH": os.environ.get("PATH", "")}
    done = _run([sys.executable, "-m", "tether.proxy"], base)
    assert done.returncode == 64
    assert "LINKERD2_PROXY_DESTINATION_SVC_ADDR: must be set" in done.stderr

    async def env_of_a_pod() -> dict[str, str]:
        async with Mesh(tmp_path) as mesh:
            return mesh.proxy_env(mesh.pod("web-0", app="web"))

    env = {**base, **run(env_of_a_pod())}
    for variable, value in (("LINKERD2_PROXY_INBOUND_DETECT_TIMEOUT", "10"),
                            ("LINKERD2_PROXY_LOG", "linkerd=loud")):
        for argv in ([sys.executable, "-m", "tether.proxy"], [TETHER, "proxy"]):
            done = _run(argv, {**env, variable: value})
            assert done.returncode == 64, done.stderr
            assert variable in done.stderr or "LINKERD2_PROXY_LOG" in done.stderr


def test_proxy_process_serves_then_drains_on_sigterm(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc = mesh.one_served_pod("echo", 7000)
            await mesh.start_proxy(server)
            env = {**mesh.proxy_env(client, outbound_to=[f"{svc}:7000"]),
                   "LINKERD2_PROXY_SHUTDOWN_GRACE_PERIOD": "5s"}
            async with proxy_process(env) as proc:
                async with EchoServer(server.ip, 7000, "echo-0"), connection(svc, 7000) as (reader, writer):
                    writer.write(b"through a process")
                    assert await reader.readline() == b"echo-0\n"
                    assert await reader.readexactly(17) == b"through a process"
                    proc.send_signal(signal.SIGTERM)
                    # Draining: the open (opaque) connection is still served.
                    writer.write(b"more")
                    assert await reader.readexactly(4) == b"more"
                assert await proc.wait() == 0

    run(scenario())
