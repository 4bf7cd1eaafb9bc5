"""The proxy's identity client: keeps a current mesh certificate and the TLS contexts built on it.

The proxy makes one ``IdentityClient`` at start (from ``LINKERD2_PROXY_IDENTITY_*``), runs
``run()`` as a task, waits for ``ready()`` before opening its listeners, and reads ``material``
(or registers a listener) for the TLS contexts of its inbound and outbound connections. What
does not depend on where certificates come from is `Credentials`, which a SPIRE agent's
client (``io.spire_client``) shares.

The P-256 private key and the CSR are made, and each answer checked, by ``tether.proxy.certify``
in a short-lived child interpreter (`CertifyChild`; it needs ``cryptography``, ~12 MB of resident
memory the serving proxy does not load). The key comes back through a pipe as
PKCS#8 PEM encrypted with a one-time password made here (``PrivateKey``), and is never written to
disk: the ``ssl`` module only loads keys from paths, so it is handed over through an anonymous
in-memory file (memfd).  Each attempt opens a fresh channel to identity (as linkerd2-proxy
builds a fresh client), verifying the service's name against the trust anchors, and sends the
token read from its file at that moment.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.api import identity_pb2
from tether.proxy.core.certified import Certified, RefreshPolicy
from tether.proxy.io.grpc_client import Channel, RpcError, method_path

log = logging.getLogger(__name__)

CERTIFY = method_path(identity_pb2.DESCRIPTOR.services_by_name["Identity"], "Certify")


@dataclass(frozen=True, slots=True)
class IdentityClientConfig:
    local_name: str  # LINKERD2_PROXY_IDENTITY_LOCAL_NAME: the identity to request
    trust_anchors_pem: bytes  # LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS
    token_path: Path  # LINKERD2_PROXY_IDENTITY_TOKEN_FILE, re-read on every call
    svc_addr: str  # LINKERD2_PROXY_IDENTITY_SVC_ADDR, host:port
    # LINKERD2_PROXY_IDENTITY_SVC_NAME: the name the identity service's certificate must carry.
    # None for a loopback address, where Linkerd's convention is plaintext (identity's own pod).
    svc_name: str | None
    refresh: RefreshPolicy = field(default_factory=RefreshPolicy)  # _MIN_REFRESH / _MAX_REFRESH
    call_timeout: timedelta = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class PrivateKey:
    """The proxy's private key: PKCS#8 PEM encrypted with ``password`` (what goes through a memfd to ``ssl``)."""

    pem: bytes = field(repr=False)
    password: bytes = field(repr=False)

    @classmethod
    def of(cls, answer: dict[str, Any], password: bytes) -> PrivateKey:
        """The key in an answer of ``tether.proxy.certify``."""
        return cls(answer["key"].encode(), password)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """One issued certificate, its key and the contexts that present it. Replaced whole on rotation."""

    name: str
    certified: Certified
    server_context: ssl.SSLContext  # TLS 1.3; asks for, but does not require, a client certificate
    client_context: ssl.SSLContext  # TLS 1.3; verifies the chain, the caller checks the peer's name
    key: PrivateKey = field(repr=False)  # stays in this process (contexts get it through a memfd)

    @property
    def expires_at(self) -> datetime:
        return self.certified.valid_until


RotationListener = Callable[[TlsMaterial], None]


class IdentityUnavailable(Exception):
    """One Certify attempt failed; the current material (if any) stays in use."""


class Credentials:
    """The current certificate and the TLS contexts built on it, whichever source issued it: Linkerd's identity
    service (`IdentityClient`) or a SPIRE agent (``io.spire_client.SpireClient``). The proxy waits for
    ``ready()``, reads ``material`` and hears of rotations through listeners."""

    def __init__(self, name: str, trust_anchors_pem: bytes) -> None:
        self.name = name  # the identity held: a DNS-like name, or a SPIFFE ID
        self._anchors_pem = trust_anchors_pem
        self._material: TlsMaterial | None = None
        self._ready = asyncio.Event()
        self._listeners: list[RotationListener] = []
        self.refreshes = {"ok": 0, "error": 0}  # control_identity_cert_refreshes_total{result}
        self.last_refresh: datetime | None = None  # control_identity_cert_refresh_timestamp_seconds

    @property
    def material(self) -> TlsMaterial | None:
        """The current certificate and contexts; ``None`` until the first one is in."""
        return self._material

    async def ready(self) -> TlsMaterial:
        """Wait for the first certificate (the proxy's readiness latch)."""
        await self._ready.wait()
        assert self._material is not None
        return self._material

    def add_listener(self, listener: RotationListener) -> None:
        """Call ``listener`` with each new ``TlsMaterial``, right after it replaces the old one."""
        self._listeners.append(listener)

    def remove_listener(self, listener: RotationListener) -> None:
        self._listeners.remove(listener)

    def install(self, certified: Certified, key: PrivateKey) -> TlsMaterial:
        """Make ``certified`` (over ``key``) the current material and tell the listeners."""
        chain = certified.chain_pem
        anchors = self._anchors_pem.decode()
        material = TlsMaterial(self.name, certified, _server_context(chain, key, anchors),
                               _client_context(chain, key, anchors), key)
        self._material = material  # the swap: connections already set up keep the contexts they used
        self._ready.set()
        log.info("identity: certified as %s until %s", material.name, material.expires_at.isoformat())
        for listener in list(self._listeners):
            try:
                listener(material)
            except Exception:  # a broken listener must not stop rotation for the others
                log.exception("identity: rotation listener %r failed", listener)
        return material

    # --- contexts for the data path and the control plane with the same certificate: the key stays here. ---

    def contexts_for(self, material: TlsMaterial, alpn: Sequence[str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """A server and a client context that present ``material`` as its own contexts do, also offering ``alpn``."""
        chain = material.certified.chain_pem
        anchors = self._anchors_pem.decode()
        server = _server_context(chain, material.key, anchors)
        client = _client_context(chain, material.key, anchors)
        for ctx in (server, client):
            ctx.set_alpn_protocols(list(alpn))
        return server, client

    def control_context(self, material: TlsMaterial) -> ssl.SSLContext:
        """A client context for a control-plane channel (``io.grpc_client``): ``material`` as the client
        certificate, the trust anchors, ALPN ``h2``; the channel checks the server's name."""
        return self.contexts_for(material, ["h2"])[1]


class IdentityClient(Credentials):
    """Certificates from Linkerd's identity service: ``Certify`` with a CSR for a key made here, on schedule."""

    def __init__(
        self,
        config: IdentityClientConfig,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(config.local_name, config.trust_anchors_pem)
        self._config = config
        self._clock = clock
        self._sleep = sleep
        self._random = random_fraction
        self._key: PrivateKey | None = None  # made with the CSR before the first Certify (tether.proxy.certify)
        self._csr = b""
        self._failures = 0

    @property
    def source(self) -> str:
        """Where certificates come from, for logs."""
        return f"identity at {self._config.svc_addr}"

    async def run(self) -> None:
        """Certify now, then again on schedule, until cancelled."""
        while True:
            delay = await self.refresh_once()
            await self._sleep(delay.total_seconds())

    async def refresh_once(self) -> timedelta:
        """One Certify attempt; returns how long to wait before the next one."""
        held = self._material.expires_at if self._material else None
        try:
            certified = await self._certify()
        except IdentityUnavailable as exc:
            self._failures += 1
            self.refreshes["error"] += 1
            delay = self._config.refresh.after_failure(self._failures, held, self._clock(), self._random)
            log.warning("identity: certify failed (%s); retrying in %.1fs", exc, delay.total_seconds())
            return delay
        self._failures = 0
        self.refreshes["ok"] += 1
        self.last_refresh = self._clock()
        assert self._key is not None  # made before the certificate
        self.install(certified, self._key)
        return self._config.refresh.after_success(certified.valid_until, self._clock())

    async def _certify(self) -> Certified:
        # One child for the round: started now, it loads while the key is made or the call is in flight.
        async with CertifyChild() as child:
            return await self._certify_with(child)

    async def _certify_with(self, child: CertifyChild) -> Certified:
        config = self._config
        key = self._key
        if key is None:
            # os.urandom is what secrets.token_bytes calls; secrets would load hmac and hashlib (OpenSSL's digest
            # tables, ~0.65 MB resident) into the serving process for this one call (docs/proxy.md, "Memory").
            password = os.urandom(32)
            made = await child.ask({"op": "new", "name": config.local_name, "password": password.hex()})
            key = self._key = PrivateKey.of(made, password)
            self._csr = base64.b64decode(made["csr"])
        try:
            token = config.token_path.read_bytes()
        except OSError as exc:
            raise IdentityUnavailable(f"token file {config.token_path}: {exc.strerror}") from None
        request = identity_pb2.CertifyRequest(
            identity=config.local_name, token=token, certificate_signing_request=self._csr
        )
        try:
            async with self._channel() as channel:
                response = await channel.unary(CERTIFY, request, identity_pb2.CertifyResponse,
                                               timeout=config.call_timeout.total_seconds())
        except RpcError as exc:
            raise IdentityUnavailable(f"{exc.code.name}: {exc.details}") from None
        valid_until = response.valid_until.ToDatetime(UTC) if response.HasField("valid_until") else None
        checked = await child.ask({
            "op": "check", "key": key.pem.decode(), "password": key.password.hex(), "name": config.local_name,
            "anchors": config.trust_anchors_pem.decode(),
            "leaf": base64.b64encode(response.leaf_certificate).decode(),
            "intermediates": [base64.b64encode(d).decode() for d in response.intermediate_certificates],
            "valid_until": valid_until.isoformat() if valid_until is not None else None,
            "now": self._clock().isoformat(),
        })
        if "error" in checked:
            raise IdentityUnavailable(f"unusable response: {checked['error']}")
        return certified_of(checked)

    def _channel(self) -> Channel:
        config = self._config
        if config.svc_name is None:
            return Channel(config.svc_addr)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False  # the Channel checks svc_name, the name the server must prove
        ctx.load_verify_locations(cadata=config.trust_anchors_pem.decode())
        ctx.set_alpn_protocols(["h2"])
        return Channel(config.svc_addr, ssl_context=ctx, server_name=config.svc_name)

def _server_context(chain_pem: bytes, key: PrivateKey, anchors_pem: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # Request a client certificate and verify it if sent, but let unauthenticated clients in:
    # inbound policy decides what they may do.
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=anchors_pem)
    _load_chain(ctx, chain_pem, key)
    return ctx


def _client_context(chain_pem: bytes, key: PrivateKey, anchors_pem: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # Chain and time are verified here; the name is not the SNI's business: the caller checks
    # that the peer's SANs contain the expected identity (io.tls.peer_identities).
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=anchors_pem)
    _load_chain(ctx, chain_pem, key)
    return ctx


def _load_chain(ctx: ssl.SSLContext, chain_pem: bytes, key: PrivateKey) -> None:
    """Load certificate chain and key without the key touching any filesystem."""
    fd = os.memfd_create("tether-identity", os.MFD_CLOEXEC)
    try:
        data = memoryview(chain_pem + key.pem)
        while data:
            data = data[os.write(fd, data) :]
        ctx.load_cert_chain(f"/proc/self/fd/{fd}", password=key.password)
    finally:
        os.close(fd)


class CertifyChild:
    """A child interpreter running ``tether.proxy.certify`` for one round of requests (see its docstring).

    Spawned (``python -m tether.proxy.certify`` by ``posix_spawn``), never forked: a proxy process may hold threads
    (grpcio's, or a test harness's), and a fork taken while another thread holds a lock aborts or
    deadlocks; a forked child would also hold every open socket of the proxy until it exits, delaying
    their FINs. Requests go to its stdin and answers come from its stdout, one JSON document per line; it
    exits when its stdin closes, so what it loads (``cryptography``) and allocates goes away with it, and
    a proxy that dies takes it along. Starting it costs about 0.3 s of CPU, once per certificate round.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None  # once reaped: its exit status, or minus the signal that ended it
        self._stdin = -1
        self._stdout: asyncio.StreamReader | None = None
        self._stdout_transport: asyncio.BaseTransport | None = None

    async def __aenter__(self) -> CertifyChild:
        # posix_spawn, not the event loop's subprocess support: uvloop forks and runs Python's at-fork handlers
        # in the child before exec, which crashed or hung the child when other threads (grpcio's) were running.
        to_child, to_child_w = os.pipe()
        from_child, from_child_w = os.pipe()
        try:
            self.pid = os.posix_spawn(_INTERPRETER, [_INTERPRETER, "-P", "-m", "tether.proxy.certify"],
                                      _child_env(), file_actions=[(os.POSIX_SPAWN_DUP2, to_child, 0),
                                                                  (os.POSIX_SPAWN_DUP2, from_child_w, 1)])
        except OSError as exc:
            for fd in (to_child_w, from_child):
                os.close(fd)
            raise IdentityUnavailable(f"tether.proxy.certify could not start: {exc}") from None
        finally:
            os.close(to_child)
            os.close(from_child_w)
        self._stdin = to_child_w
        reader = self._stdout = asyncio.StreamReader(limit=_ANSWER_LIMIT)
        self._stdout_transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_child, "rb", buffering=0))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pid = self.pid
        if pid is None or self.returncode is not None:
            return
        if exc_info[0] is not None:
            os.kill(pid, signal.SIGKILL)  # cancelled or failed mid-round: no answer is awaited any more
        if self._stdin >= 0:
            os.close(self._stdin)  # its end of input: it exits
            self._stdin = -1
        if self._stdout_transport is not None:
            self._stdout_transport.close()
        await _exited(pid)
        self.returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Its answer to one request; `IdentityUnavailable` when it failed or gave none."""
        assert self._stdout is not None and self._stdin >= 0
        try:
            # A request is a few KiB and the child has read the last one: the empty pipe takes it at once.
            data = memoryview(json.dumps(request).encode() + b"\n")
            while data:
                data = data[os.write(self._stdin, data):]
            async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                line = await self._stdout.readline()
        except TimeoutError:
            raise IdentityUnavailable(f"tether.proxy.certify gave no answer within {_ANSWER_TIMEOUT_S:.0f}s") from None
        except (OSError, ValueError) as exc:  # ValueError: an answer longer than _ANSWER_LIMIT
            raise IdentityUnavailable(f"tether.proxy.certify: {exc}") from None
        try:
            answer: dict[str, Any] = json.loads(line)
        except ValueError:
            raise IdentityUnavailable("tether.proxy.certify gave no answer") from None
        if "failed" in answer:
            raise IdentityUnavailable(f"tether.proxy.certify failed: {answer['failed']}")
        return answer


# The running interpreter's own file, reached through /proc: a proxy running as an unprivileged uid may not
# be allowed to look up the path it was started from (a Python under /root, say), but it may execute the
# file it runs. Started so, the child cannot find the virtual environment from its own name: it is given
# the proxy's module search path (``_child_env``), so it imports the very modules the proxy would.
_INTERPRETER = "/proc/self/exe" if os.path.exists("/proc/self/exe") else sys.executable


async def _exited(pid: int) -> None:
    """Until process ``pid`` (a child) has exited, without blocking the loop (a pidfd becomes readable then)."""
    pidfd = os.pidfd_open(pid)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


# A child answers in well under a second (most of it importing cryptography); one that does not is killed and
# the round fails, to be retried, rather than holding the proxy's identity forever.
_ANSWER_TIMEOUT_S = 30.0

# An answer holds two PEM keys and a certificate chain: a few KiB, a long chain a few tens.
_ANSWER_LIMIT = 1 << 20


async def certify_helper(request: dict[str, Any]) -> dict[str, Any]:
    """One request answered by a `CertifyChild` of its own."""
    async with CertifyChild() as child:
        return await child.ask(request)


def certified_of(answer: dict[str, Any]) -> Certified:
    """The checked certificate in an answer of ``tether.proxy.certify``."""
    return Certified(answer["chain"].encode(), datetime.fromisoformat(answer["valid_until"]))
