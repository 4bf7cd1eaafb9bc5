"""Asking a running proxy: its admin endpoints, the certificate it serves, and its pod's proxy settings.

- ``admin_get``: GET a path of the proxy's admin port (``/ready``, ``/metrics``,
  ``/env.json``) in plain HTTP; for a local pod (``netns``) from inside its
  network namespace to its loopback, as ``kubectl port-forward`` reaches a pod
  for Linkerd's diagnostics: the proxy authorizes admin requests under the
  port's inbound policy, which admits loopback (``default:localhost``) but may
  refuse the host (a ``deny`` namespace);
- ``served_certificate``: a TLS handshake with the proxy's inbound port, SNI its
  own identity, as a meshed client makes; the certificate it presents is the one
  it holds (nothing is sent after the handshake);
- ``proxy_env`` and ``identity_of``: what the pod spec gives the proxy.

Callers: ``tether.diagnose.local``, ``.layers`` and the ``identity``/``diagnostics`` commands.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from tether.platform.local.containers import build_env
from tether.platform.local.probes import socket_in

ADMIN_PORT = 4191
INBOUND_PORT = 4143
PROXY_CONTAINER = "linkerd-proxy"
MAX_BODY = 16 * 1024 * 1024


class ProxyUnreachable(Exception):
    """The proxy did not answer (connection refused, timed out, TLS failed)."""


@dataclass(frozen=True)
class AdminAnswer:
    status: int
    body: str


def admin_get(ip: str, path: str, timeout: float = 2.0, port: int = ADMIN_PORT, *,
              netns: str | None = None) -> AdminAnswer:
    """GET ``path`` at ``ip``:``port``; with ``netns``, at 127.0.0.1 inside that network namespace (``ip`` then
    only names the pod in errors)."""
    conn = http.client.HTTPConnection("127.0.0.1" if netns else ip, port, timeout=timeout)
    try:
        if netns is not None:
            sock = socket_in(netns)
            conn.sock = sock  # http.client sends on a socket it was given
            sock.settimeout(timeout)
            sock.connect(("127.0.0.1", port))
        conn.request("GET", path)
        response = conn.getresponse()
        return AdminAnswer(response.status, response.read(MAX_BODY).decode("utf-8", errors="replace"))
    except (OSError, http.client.HTTPException) as exc:
        raise ProxyUnreachable(f"{ip}:{port}{path}: {exc or type(exc).__name__}") from None
    finally:
        conn.close()


def served_certificate(ip: str, identity: str, timeout: float = 2.0, port: int = INBOUND_PORT) -> x509.Certificate:
    """The leaf certificate the proxy at ``ip`` presents for ``identity`` (not verified here)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # we inspect what it serves; the caller judges it
    try:
        with socket.create_connection((ip, port), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=identity) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as exc:
        raise ProxyUnreachable(f"TLS to {ip}:{port} as {identity}: {exc or type(exc).__name__}") from None
    if not der:
        raise ProxyUnreachable(f"TLS to {ip}:{port} as {identity}: no certificate presented")
    return x509.load_der_x509_certificate(der)


def proxy_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if container.get("name") == PROXY_CONTAINER:
            return container
    return None


def proxy_env(pod: Mapping[str, Any], name: str) -> str | None:
    """The proxy's variable as its process sees it: fieldRefs and ``$(VAR)`` references expanded
    (the injector names the identity ``$(_pod_sa).$(_pod_ns)...``, as Linkerd's does)."""
    container = proxy_container(pod)
    if container is None or not any(env.get("name") == name for env in container.get("env") or ()):
        return None
    return build_env(pod, container, {}).get(name)


def identity_of(pod: Mapping[str, Any]) -> str | None:
    return proxy_env(pod, "LINKERD2_PROXY_IDENTITY_LOCAL_NAME")


def pod_ip(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("podIP") or None
