"""Proxy ``/metrics`` texts for the stat tests, in Linkerd's legacy names and labels (proxy reference §9).

``proxy_text(...)`` writes what a meshed pod's proxy would serve: the inbound
request families (``request_total``, ``response_total`` by classification and
status, ``response_latency_ms`` buckets) when ``requests`` is true, the TCP
family for inbound and outbound connections, the admin port's own traffic
(which stat must leave out), process metrics and ``# EOF``.
"""

from __future__ import annotations

WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
BUCKETS = (1, 2, 3, 4, 5, 10, 20, 30, 40, 50, 100, 200, 300, 400, 500, 1000, 2000, 3000, 4000, 5000, 10000, 20000,
           30000, 40000, 50000)


def _target(ip: str, port: int) -> str:
    return f'target_addr="{ip}:{port}",target_ip="{ip}",target_port="{port}"'


def _inbound(ip: str, port: int, client: str) -> str:
    tls = f'tls="true",client_id="{client}"' if client else 'tls="no_identity",no_tls_reason="no_tls_from_remote"'
    return (f'direction="inbound",{_target(ip, port)},{tls},srv_group="",srv_kind="default",'
            f'srv_name="all-unauthenticated",srv_port="{port}"')


def latency_counts(latencies_ms: list[float]) -> dict[str, int]:
    """Cumulative bucket counts (``le`` as the proxy prints it) for these latencies."""
    out = {str(b): sum(1 for x in latencies_ms if x <= b) for b in BUCKETS}
    out["+Inf"] = len(latencies_ms)
    return out


def proxy_text(*, ip: str = "10.213.0.2", port: int = 8080, ok: int = 0, failed: int = 0,
               latencies_ms: list[float] | None = None, requests: bool = True, open_mtls: int = 1,
               open_plain: int = 0, opened_mtls: int = 1, opened_plain: int = 0, read: int = 0, written: int = 0,
               admin_requests: int = 100, start: float = 1700000000.0) -> str:
    lines: list[str] = []
    mtls, plain = _inbound(ip, port, WEB_ID), _inbound(ip, port, "")
    if requests:
        lats = latencies_ms if latencies_ms is not None else [1.0] * (ok + failed)
        route = 'route_group="",route_kind="default",route_name="default"'
        authz = 'authz_group="",authz_kind="default",authz_name="all-unauthenticated"'
        admin = (f'direction="inbound",{_target(ip, 4191)},tls="no_identity",no_tls_reason="no_tls_from_remote",'
                 f'srv_group="",srv_kind="default",srv_name="all-unauthenticated",srv_port="4191"')
        lines += ["# HELP request_total Total count of HTTP requests.", "# TYPE request_total counter",
                  f"request_total{{{mtls},{route},{authz}}} {ok + failed}",
                  f"request_total{{{admin},{route},{authz}}} {admin_requests}",
                  "# HELP response_latency_ms Elapsed times between a request's headers being received "
                  "and its response stream completing",
                  "# TYPE response_latency_ms histogram"]
        for le, n in latency_counts(lats).items():
            lines.append(f'response_latency_ms_bucket{{{mtls},{route},{authz},status_code="200",le="{le}"}} {n}')
        lines += [f'response_latency_ms_count{{{mtls},{route},{authz},status_code="200"}} {len(lats)}',
                  f'response_latency_ms_sum{{{mtls},{route},{authz},status_code="200"}} {int(sum(lats))}',
                  f'response_latency_ms_bucket{{{admin},{route},{authz},status_code="200",le="+Inf"}} '
                  f'{admin_requests}',
                  "# HELP response_total Total count of HTTP responses", "# TYPE response_total counter",
                  f'response_total{{{mtls},{route},{authz},status_code="200",classification="success",'
                  f'grpc_status="",error=""}} {ok}',
                  f'response_total{{{mtls},{route},{authz},status_code="500",classification="failure",'
                  f'grpc_status="",error=""}} {failed}',
                  f'response_total{{{admin},{route},{authz},status_code="200",classification="success",'
                  f'grpc_status="",error=""}} {admin_requests}']
    src_mtls = mtls.replace('direction="inbound",', 'direction="inbound",peer="src",')
    src_plain = plain.replace('direction="inbound",', 'direction="inbound",peer="src",')
    dst = f'direction="inbound",peer="dst",{_target(ip, port)},tls="no_identity",no_tls_reason="loopback"'
    out = ('direction="outbound",peer="dst",target_addr="10.214.0.3:8080",target_ip="10.214.0.3",'
           'target_port="8080",tls="true",server_id="emoji.emojivoto.serviceaccount.identity.linkerd.cluster.local"')
    lines += ["# HELP tcp_open_total Total count of opened connections.", "# TYPE tcp_open_total counter",
              f"tcp_open_total{{{src_mtls}}} {opened_mtls}", f"tcp_open_total{{{src_plain}}} {opened_plain}",
              f"tcp_open_total{{{dst}}} {opened_mtls + opened_plain}", f"tcp_open_total{{{out}}} 7",
              "# TYPE tcp_open_connections gauge",
              f"tcp_open_connections{{{src_mtls}}} {open_mtls}", f"tcp_open_connections{{{src_plain}}} {open_plain}",
              f"tcp_open_connections{{{dst}}} {open_mtls + open_plain}", f"tcp_open_connections{{{out}}} 3",
              "# TYPE tcp_read_bytes_total counter",
              f"tcp_read_bytes_total{{{src_mtls}}} {read}", f"tcp_read_bytes_total{{{dst}}} {written}",
              f"tcp_read_bytes_total{{{out}}} 999999",
              "# TYPE tcp_write_bytes_total counter",
              f"tcp_write_bytes_total{{{src_mtls}}} {written}", f"tcp_write_bytes_total{{{dst}}} {read}",
              "# TYPE tcp_close_total counter", f'tcp_close_total{{{src_mtls},errno=""}} 0',
              "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {start}",
              'proxy_build_info{vendor="tether",version="0.1.0"} 1', "# EOF"]
    return "\n".join(lines) + "\n"
