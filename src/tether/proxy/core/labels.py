"""Linkerd's legacy metric label vocabulary (proxy.md §9.1, §9.3), spelled in one place.

A label set is kept as its rendered Prometheus text (``direction="inbound",peer="src",...``):
it is built once per connection side and used as the key of a series, so rendering
``/metrics`` never formats labels again.

Callers: the inbound and outbound layers (which know the TLS status and the target),
``tether.proxy.core.metrics`` (series keys) and ``tether.proxy.io.admin``.
"""

from __future__ import annotations

from tether.proxy.codec.addrs import SocketAddr

# no_tls_reason values (TlsAccept / TlsConnect in Linkerd).
NO_TLS_FROM_REMOTE = "no_tls_from_remote"
PORT_SKIPPED = "port_skipped"
LOOPBACK = "loopback"
NOT_PROVIDED_BY_SERVICE_DISCOVERY = "not_provided_by_service_discovery"


def escape(value: str) -> str:
    """A label value as the Prometheus text format wants it."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def render(*pairs: tuple[str, str]) -> str:
    """``k="v"`` pairs joined by commas, in the order given; empty pairs are skipped."""
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs if k)


def target(addr: SocketAddr) -> str:
    """``target_addr``, ``target_ip`` and ``target_port``, always together."""
    return render(("target_addr", str(addr)), ("target_ip", str(addr.ip)), ("target_port", str(addr.port)))


def join(*parts: str) -> str:
    return ",".join(p for p in parts if p)


# -- server side (accepted connections) --------------------------------------------------------------------


def tls_accepted(client_id: str | None) -> str:
    """Mesh TLS terminated; ``client_id`` empty when the client sent no certificate."""
    return render(("tls", "true"), ("client_id", client_id or ""))


def tls_passthrough(sni: str) -> str:
    """TLS for another name than ours, forwarded untouched."""
    return render(("tls", "opaque"), ("sni", sni))


def no_tls(reason: str) -> str:
    return render(("tls", "no_identity"), ("no_tls_reason", reason))


# -- client side (connections the proxy makes) ---------------------------------------------------------------


def tls_connected(server_id: str) -> str:
    return render(("tls", "true"), ("server_id", server_id))


def server_labels(policy_name: str, port: int) -> str:
    """``srv_*`` for a default policy (kind ``default``, group empty), as Linkerd names them."""
    return render(("srv_group", ""), ("srv_kind", "default"), ("srv_name", policy_name), ("srv_port", str(port)))


def authz_labels(authz_name: str) -> str:
    """``authz_*`` for the default policy's authorization (kind ``default``), as Linkerd names them."""
    return render(("authz_group", ""), ("authz_kind", "default"), ("authz_name", authz_name))


def dst_labels(metric_labels: dict[str, str]) -> str:
    """An endpoint's destination labels, prefixed ``dst_`` and sorted by key."""
    return render(*((f"dst_{k}", v) for k, v in sorted(metric_labels.items())))


def accept_inbound(orig_dst: SocketAddr, tls: str, server: str) -> str:
    return join('direction="inbound",peer="src"', target(orig_dst), tls, server)


def accept_outbound(orig_dst: SocketAddr) -> str:
    return join('direction="outbound",peer="src"', target(orig_dst), no_tls(LOOPBACK))


def connect_outbound(endpoint: SocketAddr, tls: str, dst: str = "", authority: str = "") -> str:
    return join('direction="outbound",peer="dst"', render(("authority", authority)) if authority else "",
                target(endpoint), tls, dst)


def with_authority(request_labels: str, authority: str) -> str:
    """Inbound request labels with ``authority`` right after ``direction``, where linkerd2-proxy prints it
    (LINKERD2_PROXY_INBOUND_METRICS_AUTHORITY_LABELS=unsafe)."""
    direction, _, rest = request_labels.partition(",")
    return join(direction, render(("authority", authority)), rest)


def connect_inbound(app: SocketAddr) -> str:
    return join('direction="inbound",peer="dst"', target(app), no_tls(LOOPBACK))
