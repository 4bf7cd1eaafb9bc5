"""Harness for the proxy's end-to-end tests: a real control plane, pods on loopback addresses, real proxies.

- ``Mesh`` runs the identity service (Certify over TLS, tokens from the local
  platform's key) and the destination service (over a temp store, TLS) in the
  test's event loop, and keeps the PKI: a trust anchor and an issuer.
- Each ``Pod`` has its own loopback IP (``127.a.b.c``, random per test so tests
  can run side by side), a Pod object in the store (with the proxy's inbound
  address, so the destination hints the right port), a token, and an
  environment for its proxy. ``Mesh.start_proxy`` runs a ``Proxy`` in-process;
  the same environment works for ``python -m tether.proxy``.
- Without iptables, the proxies run with ``TETHER_PROXY_ORIG_DST_FALLBACK=local-addr``:
  an app reaches its outbound proxy by connecting to the service address, which
  the proxy listens on (``TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS``); peers
  reach the inbound proxy on its port directly, so the destination runs in
  ``transport-header`` mode (``force_opaque_transport``), a mode Linkerd has too.
- Apps (``EchoServer``, ``BannerServer``, ``HttpServer``), a ``RecordingRelay``
  that taps the bytes between two proxies, and certificate helpers for forged
  peers.

No test waits by sleeping: every wait is on an event or a stream, bounded by
the test's deadline (``run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tether.destination import DestinationConfig, DestinationService, TlsFiles
from tether.identity import pem, pki
from tether.identity.ca import IssuanceSettings
from tether.identity.server import IdentityConfig, IdentityService
from tether.naming import WorkloadIdentity, control_plane_identity
from tether.platform.local.endpointslices import EndpointSliceController
from tether.platform.local.tokens import LocalTokenSigner, LocalTokenVerifier, TokenKey
from tether.platform.local.watch import LocalResourceWatcher
from tether.proxy.app import Proxy
from tether.proxy.core.config import ProxyConfig
from tether.store import Store

NS = "emojivoto"
DEADLINE = 60.0
IDENTITY_SVC = control_plane_identity("identity").dns_name
DESTINATION_SVC = control_plane_identity("destination").dns_name
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], deadline: float = DEADLINE) -> T:
    """Run a scenario on uvloop (as the proxy runs), failing it if it takes longer than ``deadline``."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, deadline)

    return uvloop.run(bounded())


def identity_of(sa: str, ns: str = NS) -> str:
    return WorkloadIdentity(sa, ns).dns_name


# -- addresses ------------------------------------------------------------------------------------------------


class Addresses:
    """Loopback IPs from one random /24, so concurrent test runs do not meet."""

    def __init__(self) -> None:
        rng = random.SystemRandom()
        self._base = f"127.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}."
        self._next = 1

    def ip(self) -> str:
        ip = f"{self._base}{self._next}"
        self._next += 1
        return ip


# -- certificates ---------------------------------------------------------------------------------------------


@dataclass
class Ca:
    """A trust anchor and an issuer signed by it (as ``tether identity create-*`` make them)."""

    dir: Path
    anchor: x509.Certificate
    anchor_key: ec.EllipticCurvePrivateKey
    issuer: x509.Certificate
    issuer_key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, directory: Path) -> Ca:
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC) - timedelta(minutes=1)
        anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                     valid_for=timedelta(days=30), now=now)
        issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                               trust_domain="cluster.local", valid_for=timedelta(days=30), now=now)
        ca = cls(directory, anchor, anchor_key, issuer, issuer_key)
        pem.write_file(ca.anchors_path, pem.certificate_pem(anchor), private=False)
        pem.write_file(directory / "issuer.crt", pem.certificate_pem(issuer), private=False)
        pem.write_file(directory / "issuer.key", pem.private_key_pem(issuer_key), private=True)
        return ca

    @property
    def anchors_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def anchors_pem(self) -> bytes:
        return self.anchors_path.read_bytes()

    def leaf(self, name: str, *, valid_from: datetime | None = None, valid_for: timedelta = timedelta(days=1),
             key: ec.EllipticCurvePrivateKey | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A leaf for ``name`` signed by the issuer (any validity window, for forged peers)."""
        key = key or ec.generate_private_key(ec.SECP256R1())
        start = valid_from or datetime.now(UTC) - timedelta(minutes=1)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.issuer.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + valid_for)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.issuer_key, hashes.SHA256())
        )
        return cert, key

    def write_leaf(self, name: str, stem: str, **kwargs: Any) -> tuple[Path, Path]:
        """Chain (leaf + issuer) and key files for ``name``."""
        cert, key = self.leaf(name, **kwargs)
        chain = self.dir / f"{stem}.crt"
        key_path = self.dir / f"{stem}.key"
        chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                          + self.issuer.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return chain, key_path

    def client_context(self, name: str | None, *, alpn: list[str] | None = None, **leaf: Any) -> ssl.SSLContext:
        """A TLS 1.3 client that trusts our anchor and presents a leaf for ``name`` (None: no certificate)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.load_verify_locations(cadata=self.anchors_pem.decode())
        if name is not None:
            chain, key = self.write_leaf(name, f"client-{random.randrange(1 << 30)}", **leaf)
            ctx.load_cert_chain(chain, key)
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx

    def server_context(self, name: str, **leaf: Any) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        chain, key = self.write_leaf(name, f"server-{random.randrange(1 << 30)}", **leaf)
        ctx.load_cert_chain(chain, key)
        return ctx


# -- the store's objects --------------------------------------------------------------------------------------


def namespace(name: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service(name: str, cluster_ip: str, ports: list[tuple[int, int]], *, app: str | None = None,
            annotations: dict[str, str] | None = None, ns: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {"selector": {"app": app or name}, "clusterIP": cluster_ip,
                 "ports": [{"name": f"p{port}", "port": port, "targetPort": target} for port, target in ports]},
    }


@dataclass
class Pod:
    name: str
    app: str
    sa: str
    ip: str
    ports: list[int]
    inbound_port: int = 4143  # what the destination tells peers (a relay may sit there instead)
    annotations: dict[str, str] = field(default_factory=dict)
    ns: str = NS

    @property
    def identity(self) -> str:
        return identity_of(self.sa, self.ns)

    def manifest(self) -> dict[str, Any]:
        proxy = {
            "name": "linkerd-proxy", "image": "tether/proxy",
            "ports": [{"name": "linkerd-proxy", "containerPort": self.inbound_port},
                      {"name": "linkerd-admin", "containerPort": 4191}],
            "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": f"0.0.0.0:{self.inbound_port}"},
                    {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"}],
        }
        app = {"name": self.app, "image": f"example/{self.app}",
               "ports": [{"name": f"p{p}", "containerPort": p} for p in self.ports]}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.ns, "annotations": self.annotations,
                         "labels": {"app": self.app, "linkerd.io/control-plane-ns": "linkerd"}},
            "spec": {"serviceAccountName": self.sa, "containers": [proxy, app]},
            "status": {"phase": "Running", "podIP": self.ip, "podIPs": [{"ip": self.ip}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }


# -- the control plane ----------------------------------------------------------------------------------------


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Mesh:
    """Identity and destination in-process over a temp store; ``start_proxy`` adds pods' proxies."""

    def __init__(self, tmp: Path, *, issuance_lifetime: timedelta = timedelta(hours=24),
                 addresses: Addresses | None = None, transport_header: bool = True) -> None:
        self.tmp = tmp
        self.addresses = addresses or Addresses()
        self._lifetime = issuance_lifetime
        self._transport_header = transport_header
        self.proxies: list[Proxy] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Mesh:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _start(self) -> None:
        self.ca = Ca.create(self.tmp / "pki")
        key = TokenKey.load_or_create(self.tmp / "state")
        self.signer = LocalTokenSigner(key)
        identity = IdentityService(
            IdentityConfig(trust_anchors=self.ca.anchors_path, issuer_cert=self.ca.dir / "issuer.crt",
                           issuer_key=self.ca.dir / "issuer.key", addr="127.0.0.1:0", admin_addr="127.0.0.1:0",
                           issuance=IssuanceSettings(lifetime=self._lifetime)),
            LocalTokenVerifier(key),
        )
        await identity.start()
        # No grace: the proxies stop first, so no call is owed an answer, and a grace only waits out the
        # connections they leave open (1 s per test).
        self._stack.push_async_callback(identity.stop, None)
        self.identity = identity
        self.store = Store(self.tmp / "store.db")
        self._stack.callback(self.store.close)
        self.store.apply_many([namespace()])
        # The local platform's EndpointSlice controller, as `tether up` runs it: the destination reads slices.
        slices = EndpointSliceController(self.store)
        slicing = asyncio.create_task(slices.run())
        self._stack.push_async_callback(_cancelled, slicing)
        await asyncio.wait_for(slices.reconciled.wait(), 30)
        cert, key_path = self.ca.write_leaf(DESTINATION_SVC, "destination")
        destination = DestinationService(
            DestinationConfig(addr="127.0.0.1:0", admin_addr="127.0.0.1:0", tls=TlsFiles(cert, key_path),
                              force_opaque_transport=self._transport_header),
            LocalResourceWatcher(self.store),
        )
        await destination.start()
        self._stack.push_async_callback(destination.stop)
        self.destination = destination
        # No policy controller: a gRPC server without services stands in for an older control plane, answering
        # UNIMPLEMENTED to the policy APIs, so the proxies keep their default inbound policy and serve targets
        # by their profiles (proxy.md §7.1). Unreachable, outbound connections would wait for it.
        no_policy = grpc.aio.server()
        self.policy_port = no_policy.add_insecure_port("127.0.0.1:0")
        await no_policy.start()
        self._stack.push_async_callback(no_policy.stop, None)

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    # -- pods and proxies ---------------------------------------------------------------------------------------

    def pod(self, name: str, *, app: str, sa: str | None = None, ports: list[int] | None = None,
            inbound_port: int = 4143, apply: bool = True, **kwargs: Any) -> Pod:
        pod = Pod(name, app, sa or app, self.addresses.ip(), ports or [8080], inbound_port, **kwargs)
        if apply:
            self.store.apply_many([pod.manifest()])
        return pod

    def service(self, name: str, ports: list[tuple[int, int]], *, ip: str | None = None, **kwargs: Any) -> str:
        """A Service on a fresh loopback cluster IP (or ``ip``); returns the IP."""
        ip = ip or self.addresses.ip()
        self.store.apply_many([service(name, ip, ports, **kwargs)])
        return ip

    def token_file(self, pod: Pod) -> Path:
        path = self.tmp / f"token-{pod.name}"
        path.write_bytes(self.signer.mint(namespace=pod.ns, service_account=pod.sa, pod=pod.name))
        return path

    def proxy_env(self, pod: Pod, *, outbound_to: list[str] = (), **extra: str) -> dict[str, str]:
        """The proxy's environment for ``pod``; ``outbound_to`` are the ``ip:port`` its app talks to."""
        env = {
            "LINKERD2_PROXY_INBOUND_LISTEN_ADDR": f"{pod.ip}:4143",
            "LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR": f"{pod.ip}:4140",
            "LINKERD2_PROXY_ADMIN_LISTEN_ADDR": f"{pod.ip}:4191",
            "LINKERD2_PROXY_INBOUND_IPS": pod.ip,
            "TETHER_PROXY_ORIG_DST_FALLBACK": "local-addr",
            "TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS": ",".join(outbound_to),
            "TETHER_PROXY_CONTROL_LOOPBACK_TLS": "true",
            "LINKERD2_PROXY_DESTINATION_SVC_ADDR": f"127.0.0.1:{self.destination.port}",
            "LINKERD2_PROXY_DESTINATION_SVC_NAME": DESTINATION_SVC,
            "LINKERD2_PROXY_DESTINATION_CONTEXT": json.dumps({"ns": pod.ns, "nodeName": "node-1", "pod": pod.name}),
            "LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS": "127.0.0.0/8",
            "LINKERD2_PROXY_POLICY_SVC_ADDR": f"127.0.0.1:{self.policy_port}",
            "LINKERD2_PROXY_POLICY_WORKLOAD": json.dumps({"ns": pod.ns, "pod": pod.name}),
            "LINKERD2_PROXY_IDENTITY_DIR": str(self.tmp / f"identity-{pod.name}"),
            "LINKERD2_PROXY_IDENTITY_TOKEN_FILE": str(self.token_file(pod)),
            "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS": self.ca.anchors_pem.decode(),
            "LINKERD2_PROXY_IDENTITY_LOCAL_NAME": pod.identity,
            "LINKERD2_PROXY_IDENTITY_SVC_ADDR": f"127.0.0.1:{self.identity.port}",
            "LINKERD2_PROXY_IDENTITY_SVC_NAME": IDENTITY_SVC,
            "LINKERD2_PROXY_INBOUND_CONNECT_TIMEOUT": "2s",
            "LINKERD2_PROXY_OUTBOUND_CONNECT_TIMEOUT": "2s",
        }
        env.update(extra)
        return env

    async def start_proxy(self, pod: Pod, *, ready: bool = True, outbound_to: list[str] = (),
                          **extra: str) -> Proxy:
        env = self.proxy_env(pod, outbound_to=list(outbound_to), **extra)
        proxy = Proxy(ProxyConfig.from_env(env), env)
        await proxy.start()
        self._stack.push_async_callback(proxy.stop)
        self.proxies.append(proxy)
        if ready:
            await proxy.identity.ready()
        return proxy

    def one_served_pod(self, app: str, port: int, service_port: int | None = None, *,
                       inbound_port: int = 4143) -> ServedPod:
        """The pod ``{app}-0`` serving ``port`` behind the Service ``app`` (on ``service_port``, else the same
        port), and the pod ``client-0`` to call it; no proxies yet."""
        server = self.pod(f"{app}-0", app=app, ports=[port], inbound_port=inbound_port)
        client = self.pod("client-0", app="client")
        return ServedPod(server, client, self.service(app, [(service_port or port, port)]))

    async def two_proxies(self, app: str, port: int, service_port: int | None = None, *, inbound_port: int = 4143,
                          server_env: dict[str, str] | None = None,
                          client_env: dict[str, str] | None = None) -> TwoProxies:
        """``one_served_pod`` with both pods' proxies started (``server_env``, ``client_env`` added to their
        environments), the client's routing to the Service."""
        server, client, svc = self.one_served_pod(app, port, service_port, inbound_port=inbound_port)
        server_proxy = await self.start_proxy(server, **(server_env or {}))
        client_proxy = await self.start_proxy(client, outbound_to=[f"{svc}:{service_port or port}"],
                                              **(client_env or {}))
        return TwoProxies(server, client, svc, server_proxy, client_proxy)

    async def proxy_to_nowhere(self, **env: str) -> tuple[str, Proxy]:
        """The pod ``client-0``'s proxy (``env`` added to its environment), routing to port 80 of the Service
        ``nobody``, which has no endpoints: the Service's cluster IP, and the proxy."""
        empty = self.service("nobody", [(80, 8080)])
        return empty, await self.start_proxy(self.pod("client-0", app="client"), outbound_to=[f"{empty}:80"], **env)


class ServedPod(NamedTuple):
    server: Pod
    client: Pod
    service: str  # the Service's cluster IP


class TwoProxies(NamedTuple):
    server: Pod
    client: Pod
    service: str  # the Service's cluster IP
    server_proxy: Proxy
    client_proxy: Proxy


# -- apps -------------------------------------------------------------------------------------------------------


class App:
    """A TCP server on a pod's address; subclasses answer connections. Remembers who connected."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip, self.port = ip, port
        self.peers: list[tuple[str, int]] = []
        self.connected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> App:
        self._server = await asyncio.start_server(self._accept, self.ip, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.peers.append(writer.get_extra_info("peername")[:2])
        self.connected.set()
        try:
            await self.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class EchoServer(App):
    """Echoes each chunk back; with a name, its first answer starts with ``name\\n`` (which pod answered).

    The client speaks first, so protocol detection never waits on a port that is not opaque.
    """

    def __init__(self, ip: str, port: int, name: str = "") -> None:
        super().__init__(ip, port)
        self.name = name.encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        prefix = self.name + b"\n" if self.name else b""
        while data := await reader.read(65536):
            writer.write(prefix + data)
            prefix = b""
            await writer.drain()


class BannerServer(App):
    """A server-speaks-first protocol (SMTP-like): a banner on connect, then one answer per line."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 tether.test ESMTP ready\r\n")
        await writer.drain()
        while line := await reader.readline():
            if line.strip().upper() == b"QUIT":
                writer.write(b"221 bye\r\n")
                await writer.drain()
                return
            writer.write(b"250 " + line.strip() + b"\r\n")
            await writer.drain()


class HttpServer(App):
    """HTTP/1.1 keep-alive: answers every request with its own name and the request path."""

    def __init__(self, ip: str, port: int, name: str) -> None:
        super().__init__(ip, port)
        self.name = name

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            path = head.split(b" ", 2)[1].decode()
            body = f"{self.name} {path}".encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()


@dataclass
class AppRequest:
    """One HTTP/1 request as an app in the tests reads it (its own small parser, not the proxy's)."""

    head: bytes
    method: str
    path: str
    version: str
    headers: dict[str, str]  # lowercased names
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> AppRequest | None:
    """The next request on an app's connection (Content-Length or chunked body); None at EOF or when the first
    line is not an HTTP/1 request line (an HTTP/2 preface, say)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode().split("\r\n")
    try:
        method, path, version = lines[0].split(" ")
    except ValueError:
        return None
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)}
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
    return AppRequest(head, method, path, version, headers, body)


async def http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 request on an open connection; (status, body)."""
    writer.write(f"GET {path} HTTP/1.1\r\nhost: web\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return status, await reader.readexactly(length)


async def closed_without_answer(reader: asyncio.StreamReader) -> bool:
    """True when the peer closes (or resets) the connection without sending a byte."""
    try:
        return await reader.read(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def read_all(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while chunk := await reader.read(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def connection(host: str, port: int, **kwargs: Any) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                                                asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(host, port, **kwargs)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def proxy_process(env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m tether.proxy`` with ``env`` (and ``PATH``), once it says it is ready; killed if the test leaves
    it running."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tether.proxy",
                                                env={"PATH": os.environ.get("PATH", ""), **env},
                                                stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        log = []
        while not any("proxy ready" in line for line in log):
            line = (await proc.stderr.readline()).decode()
            assert line, f"the proxy exited: {''.join(log)}"
            log.append(line)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- the tap between proxies --------------------------------------------------------------------------------


class RecordingRelay:
    """Listens at ``ip:port`` and relays every connection to ``target``, keeping every byte in both directions."""

    def __init__(self, ip: str, port: int, target: tuple[str, int]) -> None:
        self.ip, self.port, self.target = ip, port, target
        self.upstream_bytes: list[bytearray] = []  # per connection: client -> target
        self.downstream_bytes: list[bytearray] = []  # per connection: target -> client
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RecordingRelay:
        self._server = await asyncio.start_server(self._relay, self.ip, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up, down = bytearray(), bytearray()
        self.upstream_bytes.append(up)
        self.downstream_bytes.append(down)
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bytearray) -> None:
            try:
                while data := await src.read(65536):
                    record += data
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        tasks = [asyncio.ensure_future(pump(reader, target_writer, up)),
                 asyncio.ensure_future(pump(target_reader, writer, down))]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)


# -- metrics ------------------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Prometheus text -> {name: {frozenset(labels): value}}."""
    import re

    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, f"not a sample line: {line!r}"
        name, labels_s, value = match.groups()
        pairs = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_s or ""))
        out.setdefault(name, {})[pairs] = float(value)
    return out


def samples(metrics: dict[str, dict[frozenset[tuple[str, str]], float]], name: str,
            **want: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` whose labels include ``want``."""
    return [(dict(labels), value) for labels, value in metrics.get(name, {}).items()
            if all(dict(labels).get(k) == v for k, v in want.items())]


async def scrape(proxy: Proxy) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """GET /metrics from the proxy's admin port, parsed."""
    admin = proxy.admin_addr
    async with connection(str(admin.ip), admin.port) as (reader, writer):
        writer.write(b"GET /metrics HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")
        raw = await read_all(reader)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return parse_metrics(body.decode())


async def until(check: Callable[[], bool], changed: Callable[[], Awaitable[object]]) -> None:
    """Wait until ``check()`` holds, re-checking each time ``changed()`` completes (bounded by the deadline)."""
    while not check():
        await changed()


def ip_addr(text: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(text)
