"""What a connection layer asks the driver to do, and what it is told back.

A layer (``tether.proxy.core.inbound``, ``tether.proxy.core.outbound``) is a
generator: it yields one ``Command`` at a time and receives the reply with
``send``. Blocking-looking steps -- peek the first bytes, terminate TLS,
connect, wait for discovery -- are commands whose replies come back when they
are done, so the layers hold the proxy's decisions and no I/O, and tests drive
them with made-up replies (no sockets). ``tether.proxy.io.driver`` executes the
commands; it raises on one it does not know.

Commands marked ``blocking = False`` are done at once and answered with None.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tether.proxy.codec.addrs import SocketAddr


class Command:
    """Base of the commands; ``blocking`` ones are awaited by the driver."""

    __slots__ = ()
    blocking: ClassVar[bool] = True


# -- the accepted (downstream) connection ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Detect(Command):
    """Peek at the first bytes (not consuming them) until ``codec.detect.Detector`` decides.

    Reply: a ``detect.Verdict``; on timeout, the detector's ``on_timeout()`` verdict.
    """

    tls: bool
    timeout: float


@dataclass(frozen=True, slots=True)
class AcceptTls(Command):
    """Terminate TLS with the current workload certificate, asking for a client certificate.

    ``alpn`` offers ``transport.l5d.io/v1`` (the inbound port's direct stack only).
    Reply: ``TlsAccepted`` or ``Failed``.
    """

    alpn: bool
    timeout: float


@dataclass(frozen=True, slots=True)
class Sniff(Command):
    """HTTP detection on bytes read (and kept for replay) from an already terminated session.

    Reply: a ``detect.Verdict`` (``Http1``, ``Http2``, ``Opaque``, ``Closed`` or ``ReadTimeout``).
    """

    timeout: float


@dataclass(frozen=True, slots=True)
class ReadHeader(Command):
    """Read a transport header from the session; the bytes after it stay for the app.

    Reply: ``transport_header.HeaderReceived``, ``transport_header.NoHeader`` or ``Failed``.
    """

    timeout: float


@dataclass(frozen=True, slots=True)
class Count(Command):
    """Add one to the counter ``name`` (a family the metrics registry knows) under ``labels``."""

    blocking: ClassVar[bool] = False
    name: str
    labels: str = ""


@dataclass(frozen=True, slots=True)
class SetLabels(Command):
    """The accepted side's metric labels, now that its TLS status is known."""

    blocking: ClassVar[bool] = False
    labels: str


# -- the connection the proxy makes (upstream) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientTls:
    """Mesh TLS towards a peer proxy: ``sni`` in the ClientHello, ``server_id`` required among its SANs."""

    server_id: str
    sni: str
    alpn: bool = False  # offer transport.l5d.io/v1


@dataclass(frozen=True, slots=True)
class Connect(Command):
    """Open the upstream connection (TCP, then TLS if ``tls``), its side metered under ``labels``.

    Reply: ``Connected`` or ``Failed``. A TLS peer whose certificate lacks
    ``tls.server_id`` is a failure (``unexpected identity``).
    """

    addr: SocketAddr
    tls: ClientTls | None
    timeout: float
    labels: str
    # The port a transport header sent on this connection names (0: none). Connections to one pod's inbound
    # port for different target ports are not interchangeable: each is bound to its header's port.
    header_port: int = 0
    # HTTP/2 keep-alive towards the endpoint, as discovery gives it (WeightedAddr.http2): (interval, timeout,
    # while idle) in seconds; None: no PINGs. Not part of what the connection is (nor of its pool key).
    h2_keep_alive: tuple[float, float, bool] | None = field(default=None, compare=False)
    # The l5d-orig-proto upgrade (core.orig_proto): HTTP/1 requests carried over the endpoint's shared HTTP/2
    # connection (the pool holds these legs under their own key).
    upgrade: bool = False
    # A connection of the inbound side (to the app): LINKERD2_PROXY_INBOUND_CONNECT_{KEEPALIVE,USER_TIMEOUT}
    # apply to it, else the _OUTBOUND_ ones. Not part of what the connection is (nor of its pool key).
    inbound: bool = field(default=False, compare=False)
    # What pooled connections are kept under: the address, the TLS setting and the header's port, as one
    # string (its hash is computed once, where a tuple would hash the address in Python on every lookup).
    pool_key: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        tls = self.tls
        key = f"{self.addr}" if tls is None else f"{self.addr} {tls.server_id} {tls.sni} {tls.alpn}"
        if self.header_port:
            key = f"{key} ->{self.header_port}"
        if self.upgrade:
            key = f"{key} h2"
        object.__setattr__(self, "pool_key", key)


@dataclass(frozen=True, slots=True)
class Send(Command):
    """Write bytes upstream before anything from downstream (the transport header)."""

    blocking: ClassVar[bool] = False
    data: bytes


class Revocable(Protocol):
    """An open connection's permission that can be withdrawn (``core.inbound_authz.TcpAuthzWatch``)."""

    def watch(self, revoke: Callable[[], None]) -> Callable[[], None]:
        """Call ``revoke`` when the connection is no longer allowed; the result stops watching."""
        ...


@dataclass(frozen=True, slots=True)
class Forward(Command):
    """Copy bytes both ways until both sides are done, or until ``authz`` is revoked (then both are closed
    at once). Reply: None."""

    authz: Revocable | None = None


@dataclass(frozen=True, slots=True)
class Refuse(Command):
    """Close the accepted connection without forwarding; counted as ``error`` under ``labels``.

    ``labels`` is the accepted side's label set if known (else the one from ``SetLabels``).
    """

    blocking: ClassVar[bool] = False
    error: str
    labels: str | None = None


# -- discovery ----------------------------------------------------------------------------------------------


class Waitable(Protocol):
    """A discovery source the driver can wait on (``io.discovery`` watches and balancers)."""

    async def wait(self, timeout: float) -> Any: ...


@dataclass(frozen=True, slots=True)
class Wait(Command):
    """Wait for ``source`` to have an answer, up to ``timeout``. Reply: whatever ``source.wait`` returns."""

    source: Waitable
    timeout: float


# -- replies ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsAccepted:
    client_id: str | None  # first SAN of the client's certificate; None if it sent none
    alpn: str | None


@dataclass(frozen=True, slots=True)
class Connected:
    alpn: str | None
    elapsed: float  # seconds from connect to ready (TCP and TLS): the endpoint's RTT sample


@dataclass(frozen=True, slots=True)
class Failed:
    """A command that could not be done. ``error`` is the metric's reason; ``errno`` e.g. ``ECONNREFUSED``."""

    error: str
    errno: str = ""
    timed_out: bool = False  # a connect that ran out of time: HTTP answers 504 for it, 502 for other failures


Layer = Generator[Command, Any, Any]
