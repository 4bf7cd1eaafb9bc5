"""The admin server: readiness follows the certificate; env.json, log level and shutdown as Linkerd answers them."""

from __future__ import annotations

import gzip
import ipaddress
import json
import logging
import ssl
from pathlib import Path

import pytest

from proxy_harness import Mesh, connection, parse_metrics, read_all, run

from tether.proxy.io.admin import AdminPolicy, AdminServer, Request
from tether.proxy.io.identity_client import TlsMaterial
from tether.proxy.io.tls import TlsState
from tether.proxy.core.http_metrics import HttpMetrics
from tether.proxy.core.policy_metrics import DetectMetrics
from tether.proxy.core.server_policy import INVALID
from tether.proxy.app import Proxy
from tether.proxy.core.logs import LogFilter, parse, unmatched
from tether.proxy.core.metrics import Registry


async def request(proxy: Proxy, method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    admin = proxy.admin_addr
    async with connection(str(admin.ip), admin.port) as (reader, writer):
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(f"{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n"
                     f"content-length: {len(body)}\r\n{extra}\r\n".encode() + body)
        raw = await read_all(reader)
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, fields, payload


def test_ready_only_with_a_certificate(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web")
            # No identity service at this address: the proxy cannot get a certificate.
            stuck = await mesh.start_proxy(pod, ready=False, LINKERD2_PROXY_IDENTITY_SVC_ADDR="127.0.0.1:9")
            assert await request(stuck, "GET", "/ready") == (503, {"content-type": "text/plain",
                                                                   "content-length": "10",
                                                                   "connection": "close"}, b"not ready\n")
            assert (await request(stuck, "GET", "/live"))[::2] == (200, b"live\n")
            other = mesh.pod("web-1", app="web")
            good = await mesh.start_proxy(other)
            assert (await request(good, "GET", "/ready"))[::2] == (200, b"ready\n")
            assert (await request(good, "GET", "/nothing-here"))[0] == 404

    run(scenario())


def test_env_json_metrics_log_level_and_shutdown(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            pod = mesh.pod("web-0", app="web")
            proxy = await mesh.start_proxy(pod, LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED="true")
            status, _, body = await request(proxy, "GET", "/env.json")
            env = json.loads(body)
            assert status == 200 and env["LINKERD2_PROXY_IDENTITY_LOCAL_NAME"] == pod.identity
            status, fields, body = await request(proxy, "GET", "/env.json?LINKERD2_PROXY_INBOUND_IPS&UNSET_VAR")
            assert (status, fields["content-type"]) == (200, "application/json")
            assert json.loads(body) == {"LINKERD2_PROXY_INBOUND_IPS": pod.ip, "UNSET_VAR": None}
            assert (await request(proxy, "GET", "/env.json?A=b"))[0] == 400
            assert (await request(proxy, "POST", "/env.json"))[0] == 405
            assert (await request(proxy, "GET", "/env.json", headers={"accept": "text/html"}))[0] == 406

            status, fields, body = await request(proxy, "GET", "/metrics", headers={"accept-encoding": "gzip"})
            assert status == 200 and fields["content-encoding"] == "gzip"
            metrics = parse_metrics(gzip.decompress(body).decode())
            assert "process_cpu_seconds_total" in metrics and "control_identity_cert_refreshes_total" in metrics

            assert (await request(proxy, "GET", "/proxy-log-level"))[::2] == (200, b"warn,linkerd=info,hickory=error")
            assert (await request(proxy, "PUT", "/proxy-log-level", b"linkerd=debug,warn"))[0] == 204
            assert (await request(proxy, "GET", "/proxy-log-level"))[2] == b"linkerd=debug,warn"
            assert (await request(proxy, "PUT", "/proxy-log-level", b"linkerd=loud"))[0] == 400
            assert (await request(proxy, "DELETE", "/proxy-log-level"))[0] == 405

            assert (await request(proxy, "GET", "/shutdown"))[0] == 405
            assert not proxy.stopping.is_set()
            assert (await request(proxy, "POST", "/shutdown"))[::2] == (200, b"shutdown\n")
            await proxy.stopping.wait()

    run(scenario())


def _server(shutdown_enabled: bool = False) -> tuple[AdminServer, list[bool]]:
    stopped: list[bool] = []
    policy_registry = Registry(retain_idle=600)
    server = AdminServer(registry=Registry(retain_idle=600), ready=lambda: True, env={"A": "1"},
                         log_filter=LogFilter("warn", apply=False), shutdown_enabled=shutdown_enabled,
                         on_shutdown=lambda: stopped.append(True),
                         policy=AdminPolicy(lambda port: INVALID, policy_registry,
                                            HttpMetrics(lambda: 0.0, 600), DetectMetrics(policy_registry, "inbound"),
                                            TlsState(_no_contexts),
                                            "web.emojivoto.serviceaccount.identity.linkerd.cluster.local",
                                            lambda: 0.0))
    return server, stopped


def _no_contexts(material: TlsMaterial, alpn: list[str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    raise AssertionError("handle() needs no TLS")


def _req(method: str, path: str, client: str, body: bytes = b"") -> Request:
    return Request(method, path, "", {}, body, ipaddress.ip_address(client))


def test_log_level_and_shutdown_answer_only_localhost() -> None:
    server, _ = _server(shutdown_enabled=True)
    for method, path in (("GET", "/proxy-log-level"), ("PUT", "/proxy-log-level"), ("POST", "/shutdown")):
        response = server.handle(_req(method, path, "10.1.2.3", b"debug"))
        assert (response.status, response.body) == (403, b"Requests are only permitted from localhost.")
    assert server.handle(_req("GET", "/proxy-log-level", "::1")).status == 200
    disabled, stopped = _server(shutdown_enabled=False)
    response = disabled.handle(_req("POST", "/shutdown", "127.0.0.1"))
    assert (response.status, response.body, stopped) == (404, b"shutdown endpoint is not enabled\n", [])


def test_log_filter_syntax() -> None:
    assert parse("warn,linkerd=info,hickory=error") == [("", 30), ("tether.proxy", 20), ("hickory", 40)]
    # Linkerd's targets are crates and their modules; this proxy's loggers are not cut along them.
    assert parse("linkerd2_proxy::inbound=trace,linkerd_app_outbound::http=debug") == [
        ("tether.proxy", 5), ("tether.proxy", 10)]
    assert unmatched(parse("warn,linkerd=info,hickory=error,h2=debug,tether.proxy.io.admin=trace")) == []
    assert unmatched(parse("hyper=debug,tower::buffer=trace")) == ["hyper", "tower.buffer"]
    # Linkerd's injector's default filter: its header spans hold (this proxy never logs headers).
    assert parse("warn,linkerd=info,hickory=error,[{headers}]=off,[{request}]=off") == parse(
        "warn,linkerd=info,hickory=error")
    for bad in ("loud", "linkerd=", "a b=info", "[span]=info", "[{headers}]=debug"):
        try:
            parse(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_a_log_target_naming_no_logger_is_warned_about_by_name(caplog: pytest.LogCaptureFixture) -> None:
    server, _ = _server()
    with caplog.at_level(logging.WARNING, logger="tether.proxy.io.admin"):
        assert server.handle(_req("PUT", "/proxy-log-level", "127.0.0.1", b"info,hyper=debug,linkerd=trace")).status == 204
    assert [r.getMessage() for r in caplog.records] == [
        "/proxy-log-level: target 'hyper' names no logger of this proxy"]
