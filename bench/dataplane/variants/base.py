"""What a variant declares, and the one place that turns a declaration into running proxies."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.dataplane.pki import MeshCerts
from bench.dataplane.procs import Pinning, Proc, Supervisor, free_port, wait_for_port

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Context:
    """What a variant gets to build its plan: its own directory, the backend, certificates, ports."""

    workdir: Path  # the variant's own temp dir (configs, logs); removed after the run
    backend: tuple[str, int]  # the nginx every variant ends at (its HTTP/2 port for the h2 and grpc loads)
    certs: MeshCerts

    def port(self) -> int:
        return free_port(LOOPBACK)


@dataclass(frozen=True)
class ProxySpec:
    """One proxy process: how to start it and when it is ready."""

    role: str  # "client" (the load's side) or "server" (the backend's side)
    argv: list[str]
    listen: tuple[str, int]  # ready when this accepts connections
    files: dict[str, str] = field(default_factory=dict)  # written into workdir before start
    env: dict[str, str] | None = None  # added to the harness's environment
    ready_timeout: float = 20.0


@dataclass(frozen=True)
class Plan:
    proxies: list[ProxySpec]  # started in order (server side first, so the client side finds it)
    entry: tuple[str, int]  # where the load generator sends requests
    meta: dict[str, Any] = field(default_factory=dict)  # anything verify() needs (admin ports...)


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool
    detail: str


class Variant:
    """A path under test. Subclasses set the class attributes and implement ``plan``."""

    name: ClassVar[str]
    description: ClassVar[str]
    # Which other variants this one is compared with, as ratio columns (this / other).
    compare_to: ClassVar[tuple[str, ...]] = ()
    # What the load generator sends (``LOADS``): HTTP/1.1 (wrk, and the open-loop latency runs), HTTP/2 GETs
    # or gRPC unary calls over h2c (h2load; maximum throughput only). The backend port follows the load.
    load: ClassVar[str] = "http1"

    def __init__(self) -> None:
        self.plan_: Plan | None = None
        self.procs: dict[str, Proc] = {}

    @classmethod
    def available(cls) -> str | None:
        """``None`` when the variant can run here, else why not (shown, and the variant is skipped)."""
        return None

    @classmethod
    def version(cls) -> str:
        """The software under test, for the report."""
        return ""

    def plan(self, ctx: Context) -> Plan:
        raise NotImplementedError

    def verify(self, ctx: Context) -> list[Check]:
        """After the measurements: checks that the comparison was fair. Default: none."""
        return []

    # -- run by the harness -------------------------------------------------

    def start(self, ctx: Context, sup: Supervisor, pinning: Pinning, nice: int) -> None:
        plan = self.plan(ctx)
        self.plan_ = plan
        for spec in plan.proxies:
            for rel, text in spec.files.items():
                path = ctx.workdir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            env = {**os.environ, **spec.env} if spec.env is not None else None
            proc = sup.start(f"{self.name}/{spec.role}", spec.argv, cpus=pinning.sut, nice=nice,
                             log=ctx.workdir / f"{spec.role}.log", cwd=ctx.workdir, env=env)
            self.procs[spec.role] = proc
            wait_for_port(*spec.listen, timeout=spec.ready_timeout, proc=proc)

    @property
    def entry(self) -> tuple[str, int]:
        assert self.plan_ is not None
        return self.plan_.entry


LOADS = ("http1", "h2", "grpc")
REUSE_MIN_REQUESTS_PER_CONNECTION = 50


def reused(connections: int, requests: int) -> bool:
    """Connections were kept and reused: many requests went over each one opened."""
    return requests > 0 and requests >= REUSE_MIN_REQUESTS_PER_CONNECTION * max(connections, 1)


def tls13_probe(host: str, port: int, certs: MeshCerts) -> list[Check]:
    """Handshake with a server-side proxy as the client identity: TLS 1.3 must work, TLS 1.2 must not."""
    checks: list[Check] = []

    def ctx(max12: bool) -> ssl.SSLContext:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        c.load_verify_locations(certs.anchor)
        c.load_cert_chain(certs.client.chain, certs.client.key)
        if max12:
            c.maximum_version = ssl.TLSVersion.TLSv1_2
        return c

    try:
        with socket.create_connection((host, port), timeout=5) as raw, \
                ctx(False).wrap_socket(raw, server_hostname=certs.server.name) as tls:
            version, cipher = tls.version(), tls.cipher()
        checks.append(Check("server side negotiates TLS 1.3 with the client identity", version == "TLSv1.3",
                            f"{version}, {cipher[0] if cipher else '?'}, server identity {certs.server.name} verified"))
    except (OSError, ssl.SSLError) as e:
        checks.append(Check("server side negotiates TLS 1.3 with the client identity", False, str(e)))
    try:
        with socket.create_connection((host, port), timeout=5) as raw, \
                ctx(True).wrap_socket(raw, server_hostname=certs.server.name) as tls:
            got = tls.version()
        checks.append(Check("server side refuses TLS 1.2", False, f"accepted {got}"))
    except (OSError, ssl.SSLError) as e:
        checks.append(Check("server side refuses TLS 1.2", True, type(e).__name__))
    return checks
