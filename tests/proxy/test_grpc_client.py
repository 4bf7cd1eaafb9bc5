"""The proxy's own gRPC client (``tether.proxy.io.grpc_client``, on the proxy's HTTP/2 codec) against a real
grpcio server.

The server is grpcio's (``grpc.aio.server``) with the generated Identity and
Destination servicers, over mutual TLS with P-256 certificates made here, and
over plaintext: unary and server-streaming calls, status codes and messages,
deadlines and cancellation as the server sees them, the server's name, a lost
and re-opened connection, many calls on one connection.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tether.api import destination_pb2 as dpb
from tether.api import destination_pb2_grpc, identity_pb2, identity_pb2_grpc
from tether.proxy.core.config import ControlStreamLimits
from tether.proxy.io.grpc_client import Channel, Code, RpcError, grpc_timeout

SERVER_NAME = "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
CLIENT_NAME = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
CERTIFY = "/io.linkerd.proxy.identity.Identity/Certify"
GET = "/io.linkerd.proxy.destination.Destination/Get"


# -- certificates -------------------------------------------------------------------------------------------------


@dataclass
class Pki:
    anchor: bytes
    server: tuple[bytes, bytes]  # (key PEM, chain PEM)
    client: tuple[bytes, bytes]
    dir: Path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cn = name.split(".")[0]  # a CN is at most 64 characters; the identity is the SAN
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root.linkerd.cluster.local")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
          .not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("pki")
    return Pki(ca.public_bytes(serialization.Encoding.PEM), _leaf(ca, ca_key, SERVER_NAME),
               _leaf(ca, ca_key, CLIENT_NAME), d)


def client_context(pki: Pki, *, with_cert: bool = True, alpn: bool = True) -> ssl.SSLContext:
    """As the proxy's: TLS 1.3, the anchors, its own certificate, names left to the caller."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=pki.anchor.decode())
    if with_cert:
        key, chain = pki.client
        (pki.dir / "client.pem").write_bytes(chain + key)
        ctx.load_cert_chain(pki.dir / "client.pem")
    if alpn:
        ctx.set_alpn_protocols(["h2"])
    return ctx


# -- the server ---------------------------------------------------------------------------------------------------


class Behaviour:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.peers: list[str] = []


class IdentityServer(identity_pb2_grpc.IdentityServicer):
    def __init__(self, b: Behaviour) -> None:
        self.b = b

    async def Certify(self, request: identity_pb2.CertifyRequest,  # noqa: N802 - the service's name
                      context: grpc.aio.ServicerContext) -> identity_pb2.CertifyResponse:
        peer = [v.decode() for v in context.auth_context().get("x509_subject_alternative_name", [])]
        self.b.peers.append(",".join(peer))
        if request.identity == "slow":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.b.cancelled.set()
                raise
        if request.identity == "denied":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "token for another service account: 100% wrong")
        return identity_pb2.CertifyResponse(leaf_certificate=request.token + b"|" + ",".join(peer).encode(),
                                            intermediate_certificates=[b"x" * 100_000])


class DestinationServer(destination_pb2_grpc.DestinationServicer):
    def __init__(self, b: Behaviour) -> None:
        self.b = b

    async def Get(self, request: dpb.GetDestination,  # noqa: N802 - the service's name
                  context: grpc.aio.ServicerContext) -> AsyncIterator[dpb.Update]:
        if request.path == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such service")
        if request.path == "ticking":  # an answer every 20 ms until the client leaves
            finished = False
            try:
                for i in range(1000):
                    yield dpb.Update(add=dpb.WeightedAddrSet(metric_labels={"i": str(i)}))
                    await asyncio.sleep(0.02)
                finished = True
            finally:
                # Left early: grpcio cancels the handler (CancelledError at the sleep) or closes it at the
                # yield (GeneratorExit), depending on where the client's reset finds it.
                if not finished:
                    self.b.cancelled.set()
        count = 0 if request.path == "silent" else 3 if request.path == "three" else 1
        for i in range(count):
            yield dpb.Update(add=dpb.WeightedAddrSet(metric_labels={"i": str(i)}))
        if request.path in ("forever", "silent"):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.b.cancelled.set()
                raise


@dataclass
class Server:
    server: grpc.aio.Server
    target: str
    b: Behaviour


async def start_server(pki: Pki | None, port: int = 0) -> Server:
    b = Behaviour()
    server = grpc.aio.server()
    identity_pb2_grpc.add_IdentityServicer_to_server(IdentityServer(b), server)
    destination_pb2_grpc.add_DestinationServicer_to_server(DestinationServer(b), server)
    if pki is None:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        creds = grpc.ssl_server_credentials([pki.server], root_certificates=pki.anchor, require_client_auth=True)
        bound = server.add_secure_port(f"127.0.0.1:{port}", creds)
    await server.start()
    return Server(server, f"127.0.0.1:{bound}", b)


def run(test: Callable[[], Awaitable[None]]) -> None:
    """On uvloop, as the proxy runs (its transports are not asyncio's classes)."""
    uvloop.run(asyncio.wait_for(test(), 30))


# -- tests --------------------------------------------------------------------------------------------------------


def test_unary_over_mtls_the_server_sees_the_client_identity(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(pki)
        try:
            async with Channel(srv.target, ssl_context=client_context(pki), server_name=SERVER_NAME) as ch:
                answer = await ch.unary(CERTIFY, identity_pb2.CertifyRequest(identity="web", token=b"tok"),
                                        identity_pb2.CertifyResponse, timeout=10)
                # a second call rides the same connection
                again = await ch.unary(CERTIFY, identity_pb2.CertifyRequest(identity="web", token=b"2"),
                                       identity_pb2.CertifyResponse, timeout=10)
            assert answer.leaf_certificate == f"tok|{CLIENT_NAME}".encode()
            assert again.leaf_certificate.startswith(b"2|")
            # 100 kB answer: more than a stream's initial window, so flow control was handed back
            assert answer.intermediate_certificates == [b"x" * 100_000]
        finally:
            await srv.server.stop(None)

    run(main)


def test_status_and_message_from_the_server(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            async with Channel(srv.target) as ch:
                with pytest.raises(RpcError) as err:
                    await ch.unary(CERTIFY, identity_pb2.CertifyRequest(identity="denied"),
                                   identity_pb2.CertifyResponse)
                assert err.value.code is Code.PERMISSION_DENIED
                assert err.value.details == "token for another service account: 100% wrong"  # percent-decoded
                with pytest.raises(RpcError) as err:
                    async for _ in ch.server_stream(GET, dpb.GetDestination(path="missing"), dpb.Update):
                        pass
                assert err.value.code is Code.NOT_FOUND and err.value.details == "no such service"
                with pytest.raises(RpcError) as err:
                    await ch.unary("/io.linkerd.proxy.identity.Identity/Nope", identity_pb2.CertifyRequest(),
                                   identity_pb2.CertifyResponse)
                assert err.value.code is Code.UNIMPLEMENTED
        finally:
            await srv.server.stop(None)

    run(main)


def test_server_stream_yields_every_message_then_ends(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            async with Channel(srv.target) as ch:
                got = [u.add.metric_labels["i"] async for u in
                       ch.server_stream(GET, dpb.GetDestination(path="three"), dpb.Update)]
            assert got == ["0", "1", "2"]
        finally:
            await srv.server.stop(None)

    run(main)


def test_deadline_ends_the_call_and_the_server_sees_it_cancelled(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(pki)
        try:
            async with Channel(srv.target, ssl_context=client_context(pki), server_name=SERVER_NAME) as ch:
                with pytest.raises(RpcError) as err:
                    await ch.unary(CERTIFY, identity_pb2.CertifyRequest(identity="slow"),
                                   identity_pb2.CertifyResponse, timeout=0.3)
                assert err.value.code is Code.DEADLINE_EXCEEDED
                await asyncio.wait_for(srv.b.cancelled.wait(), 10)
        finally:
            await srv.server.stop(None)

    run(main)


def test_leaving_a_stream_cancels_it_on_the_server(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            async with Channel(srv.target) as ch:
                seen = asyncio.Event()

                async def watch() -> None:
                    async for _ in ch.server_stream(GET, dpb.GetDestination(path="forever"), dpb.Update):
                        seen.set()

                task = asyncio.create_task(watch())
                await asyncio.wait_for(seen.wait(), 10)
                task.cancel()
                await asyncio.wait_for(srv.b.cancelled.wait(), 10)
                # the connection still serves other calls
                assert [u async for u in ch.server_stream(GET, dpb.GetDestination(path="one"), dpb.Update)]
        finally:
            await srv.server.stop(None)

    run(main)


def test_wrong_server_name_no_alpn_and_no_client_cert_are_unavailable(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(pki)
        request = identity_pb2.CertifyRequest(identity="web")
        try:
            async with Channel(srv.target, ssl_context=client_context(pki), server_name="evil.example") as ch:
                with pytest.raises(RpcError) as err:
                    await ch.unary(CERTIFY, request, identity_pb2.CertifyResponse, timeout=10)
                assert err.value.code is Code.UNAVAILABLE and "evil.example" in err.value.details
            async with Channel(srv.target, ssl_context=client_context(pki, alpn=False), server_name=SERVER_NAME) as ch:
                with pytest.raises(RpcError) as err:
                    await ch.unary(CERTIFY, request, identity_pb2.CertifyResponse, timeout=10)
                assert err.value.code is Code.UNAVAILABLE
            async with Channel(srv.target, ssl_context=client_context(pki, with_cert=False),
                               server_name=SERVER_NAME) as ch:
                with pytest.raises(RpcError) as err:
                    await ch.unary(CERTIFY, request, identity_pb2.CertifyResponse, timeout=10)
                assert err.value.code is Code.UNAVAILABLE
            assert srv.b.peers == []  # none of them reached the service
        finally:
            await srv.server.stop(None)

    run(main)


def test_lost_connection_is_unavailable_then_reopened(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        port = int(srv.target.rsplit(":", 1)[1])
        async with Channel(srv.target, connect_timeout=5) as ch:
            stream = ch.server_stream(GET, dpb.GetDestination(path="forever"), dpb.Update)
            assert await anext(stream)
            await srv.server.stop(None)
            with pytest.raises(RpcError) as err:
                await anext(stream)
            assert err.value.code is Code.UNAVAILABLE
            with pytest.raises(RpcError) as err:
                await ch.unary(CERTIFY, identity_pb2.CertifyRequest(), identity_pb2.CertifyResponse)
            assert err.value.code is Code.UNAVAILABLE  # nothing listens: connect refused
            srv = await start_server(None, port)
            try:
                answer = await ch.unary(CERTIFY, identity_pb2.CertifyRequest(token=b"back"),
                                        identity_pb2.CertifyResponse, timeout=10)
                assert answer.leaf_certificate.startswith(b"back|")
            finally:
                await srv.server.stop(None)

    run(main)


def test_many_calls_share_one_connection(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(pki)
        try:
            async with Channel(srv.target, ssl_context=client_context(pki), server_name=SERVER_NAME) as ch:
                answers = await asyncio.gather(*(
                    ch.unary(CERTIFY, identity_pb2.CertifyRequest(token=str(i).encode()),
                             identity_pb2.CertifyResponse, timeout=20) for i in range(150)))
                assert sorted(int(a.leaf_certificate.split(b"|")[0]) for a in answers) == list(range(150))
                assert ch._conn is not None and ch._conn.h2.next_stream_id() == 301  # streams 1, 3 ... 299
        finally:
            await srv.server.stop(None)

    run(main)


def _limits(initial: float | None = None, idle: float | None = None,
            lifetime: float | None = None) -> ControlStreamLimits:
    def d(s: float | None) -> datetime.timedelta | None:
        return None if s is None else datetime.timedelta(seconds=s)
    return ControlStreamLimits(d(initial), d(idle), d(lifetime))


def test_a_stream_without_a_first_answer_within_the_initial_timeout_fails(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            async with Channel(srv.target, limits=_limits(initial=0.2, idle=60, lifetime=120)) as ch:
                with pytest.raises(RpcError) as err:
                    async for _ in ch.server_stream(GET, dpb.GetDestination(path="silent"), dpb.Update):
                        pass
                assert err.value.code is Code.DEADLINE_EXCEEDED
                assert err.value.details == "initial item not received within timeout"
                await asyncio.wait_for(srv.b.cancelled.wait(), 10)
                # without an initial timeout, the idle timeout bounds the wait for the first answer
            async with Channel(srv.target, limits=_limits(idle=0.2)) as ch:
                with pytest.raises(RpcError) as err:
                    async for _ in ch.server_stream(GET, dpb.GetDestination(path="silent"), dpb.Update):
                        pass
                assert err.value.code is Code.DEADLINE_EXCEEDED
        finally:
            await srv.server.stop(None)

    run(main)


def test_an_idle_stream_ends_as_if_the_server_ended_it(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            async with Channel(srv.target, limits=_limits(initial=5, idle=0.3)) as ch:
                got = [u async for u in ch.server_stream(GET, dpb.GetDestination(path="forever"), dpb.Update)]
                assert len(got) == 1  # the one answer, then silence: ended without an error
                await asyncio.wait_for(srv.b.cancelled.wait(), 10)
        finally:
            await srv.server.stop(None)

    run(main)


def test_a_stream_ends_at_its_lifetime_however_busy(pki: Pki) -> None:
    async def main() -> None:
        srv = await start_server(None)
        try:
            # answers every 20 ms keep it from being idle; the lifetime ends it all the same
            async with Channel(srv.target, limits=_limits(initial=5, idle=5, lifetime=0.5)) as ch:
                got = [u async for u in ch.server_stream(GET, dpb.GetDestination(path="ticking"), dpb.Update)]
                assert len(got) < 1000  # ended long before the server's 1,000 answers
                await asyncio.wait_for(srv.b.cancelled.wait(), 10)
            # no limits: the busy stream is not ended by the channel
            async with Channel(srv.target) as ch:
                stream = ch.server_stream(GET, dpb.GetDestination(path="ticking"), dpb.Update,
                                          timeout=1.0)
                with pytest.raises(RpcError) as err:
                    async for _ in stream:
                        pass
                assert err.value.code is Code.DEADLINE_EXCEEDED  # only the call's own deadline ended it
        finally:
            await srv.server.stop(None)

    run(main)


def test_grpc_timeout_header_fits_eight_digits() -> None:
    assert grpc_timeout(0.25) == "250m"
    assert grpc_timeout(0.0001) == "1m"
    assert grpc_timeout(10 ** 6) == "1000000S"
    with pytest.raises(ValueError):
        Channel("no-port")


class _SilentTlsServer(asyncio.Protocol):
    """A TLS server (memory BIOs over a plain TCP transport) that never answers close_notify, as a peer that
    leaves the TLS shutdown to the client: only the client's closing of the socket ends the connection."""

    def __init__(self, pki: Pki) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        key, chain = pki.server
        (pki.dir / "server.pem").write_bytes(chain + key)
        ctx.load_cert_chain(pki.dir / "server.pem")
        ctx.set_alpn_protocols(["h2"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.talked = asyncio.Event()  # the client sent HTTP/2 bytes over TLS
        self.eof = asyncio.Event()  # the client closed the TCP connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        self.incoming.write(data)
        try:
            self.tls.do_handshake()
            while self.tls.read(65536):
                self.talked.set()
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            pass  # more to come / the client's close_notify, deliberately not answered
        self.transport.write(self.outgoing.read())

    def eof_received(self) -> None:
        self.eof.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof.set()


def test_closing_a_tls_channel_closes_the_socket_without_the_servers_close_notify(pki: Pki) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        peer = _SilentTlsServer(pki)
        server = await loop.create_server(lambda: peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ch = Channel(f"127.0.0.1:{port}", ssl_context=client_context(pki), server_name=SERVER_NAME)
        call = asyncio.ensure_future(ch.unary(CERTIFY, identity_pb2.CertifyRequest(identity="web"),
                                              identity_pb2.CertifyResponse))
        try:
            await peer.talked.wait()
            await ch.close()
            # Bounded well below the event loop's own TLS shutdown timeout (30 s), far above the channel's.
            await asyncio.wait_for(peer.eof.wait(), 15)
            with pytest.raises(RpcError):
                await call
        finally:
            call.cancel()
            server.close()

    run(main)


def test_the_proxy_limits_streams_to_remote_controllers_only() -> None:
    """As linkerd2-proxy: the ``CONTROL_STREAM_*`` limits are for a controller reached over the network; a
    controller on loopback (its own pod's, behind no proxy) gets none."""
    import ipaddress
    from types import SimpleNamespace

    from tether.proxy.app import Proxy
    from tether.proxy.codec.addrs import NameAddr, SocketAddr
    from tether.proxy.core.config import ControlAddr

    limits = _limits(initial=3, idle=300, lifetime=3600)
    proxy = SimpleNamespace(config=SimpleNamespace(control_streams=limits))

    def channel(addr: SocketAddr | NameAddr) -> Channel:
        # The method reads only the configuration when the controller has no identity (plaintext).
        made: Channel = cast(Any, Proxy._control_channel)(proxy, ControlAddr(addr, None), None)
        return made

    assert channel(SocketAddr(ipaddress.ip_address("10.0.0.7"), 8086)).limits is limits
    assert channel(NameAddr("linkerd-dst-headless.linkerd.svc.cluster.local.", 8086)).limits is limits
    assert channel(SocketAddr(ipaddress.ip_address("127.0.0.1"), 8086)).limits is None
    assert channel(NameAddr("localhost", 8086)).limits is None
