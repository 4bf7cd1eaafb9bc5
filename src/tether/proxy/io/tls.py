"""The TLS contexts new connections use, and the mesh identity rules applied to a finished handshake.

``TlsContexts`` is built from one ``TlsMaterial`` of the identity client: the
server and client contexts it made, plus a pair offering ALPN
``transport.l5d.io/v1`` (the inbound direct port, and clients sending a
transport header). ``TlsState.install`` swaps the whole set on every refresh;
a connection reads ``TlsState.current`` once when it needs TLS, so connections
already set up keep the contexts they started with.

Identity checks (proxy.md §5.1): a server is accepted when the identity expected
from discovery is among its certificate's SANs -- never compared with the SNI;
a client's identity is its certificate's first SAN. Chains and validity times
are checked by OpenSSL against the trust anchors.

Callers: ``tether.proxy.app`` (install on rotation) and ``tether.proxy.io.driver``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime


from tether.proxy.io.identity_client import TlsMaterial
from tether.proxy.codec.transport_header import ALPN_PROTOCOL

TRANSPORT_ALPN = ALPN_PROTOCOL.decode()

# (material, ALPN protocols) -> (server context, client context): ``IdentityClient.contexts_for``.
ContextFactory = Callable[[TlsMaterial, list[str]], tuple[ssl.SSLContext, ssl.SSLContext]]


@dataclass(frozen=True, slots=True)
class TlsContexts:
    """One certificate's contexts, replaced whole on rotation."""

    name: str  # our identity: the SNI we terminate for
    expires_at: datetime
    server: ssl.SSLContext  # no ALPN: application ports
    server_transport: ssl.SSLContext  # ALPN transport.l5d.io/v1: the inbound port's direct stack
    client: ssl.SSLContext  # no ALPN
    client_transport: ssl.SSLContext  # offers transport.l5d.io/v1


class TlsState:
    """Holds the current ``TlsContexts``; None until the first certificate."""

    def __init__(self, factory: ContextFactory) -> None:
        self._factory = factory
        self.current: TlsContexts | None = None

    def install(self, material: TlsMaterial) -> TlsContexts:
        server_transport, client_transport = self._factory(material, [TRANSPORT_ALPN])
        for server in (material.server_context, server_transport):
            # Linkerd's clients never resume sessions: sending tickets is wasted work.
            server.num_tickets = 0
        contexts = TlsContexts(
            name=material.name,
            expires_at=material.expires_at,
            server=material.server_context,
            server_transport=server_transport,
            client=material.client_context,
            client_transport=client_transport,
        )
        self.current = contexts
        return contexts


def peer_identities(ssl_object: ssl.SSLObject | None) -> tuple[str, ...]:
    """The DNS and URI SANs of the peer's certificate, in order; empty if it sent none.

    Read from what ``ssl`` decoded of the certificate it verified (both ends verify a certificate when
    one is sent), so no X.509 library is loaded for it.
    """
    if ssl_object is None:
        return ()
    cert = ssl_object.getpeercert()
    if not cert:
        return ()
    sans: tuple[tuple[str, str], ...] = cert.get("subjectAltName", ())  # type: ignore[assignment]
    return tuple(value for kind, value in sans if kind in ("DNS", "URI"))


def client_identity(ssl_object: ssl.SSLObject | None) -> str | None:
    """A client's mesh identity: the first SAN of its certificate."""
    ids = peer_identities(ssl_object)
    return ids[0] if ids else None


def server_matches(ssl_object: ssl.SSLObject | None, expected: str) -> bool:
    """Whether the server proved ``expected``: it is among its SANs (DNS names case-insensitively, URIs exactly)."""
    if "://" in expected:
        return expected in peer_identities(ssl_object)
    wanted = expected.lower()
    return any(identity.lower() == wanted for identity in peer_identities(ssl_object) if "://" not in identity)
