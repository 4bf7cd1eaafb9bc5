"""The inbound HTTP access log (``LINKERD2_PROXY_ACCESS_LOG``, core/access_log.py): linkerd2-proxy's fields, in
Apache's common format or JSON, one line per request the inbound proxy serves -- relayed, answered by the proxy,
or over HTTP/2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from proxy_harness import Mesh, connection, run
from test_http1_mesh import Web, request

from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core import errors
from tether.proxy.core.access_log import AccessLog, Format
from tether.proxy.core.config import ProxyConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log(fmt: Format) -> tuple[AccessLog, list[str], Clock]:
    lines: list[str] = []
    clock = Clock()
    return AccessLog(fmt, lines.append, clock, lambda: 1_764_673_200.25), lines, clock


def test_apache_common_format_as_linkerd2_proxy_writes_it() -> None:
    log, lines, clock = _log(Format.APACHE)
    head = RequestHead(b"GET", b"/api/list?x=1", ((b"Host", b"web.emojivoto:8080"), (b"user-agent", b"curl/8")))
    log.begin("s1", head, ("10.0.0.7", 41234), "web.emojivoto.serviceaccount.identity.linkerd.cluster.local")
    log.request("s1", head, "", ("10.0.0.7", 41234))
    assert lines == []  # written once the response head is known
    log.response("s1", 200, ((b"content-length", b"12"),))
    log.end("s1", 200, None)
    assert lines == ['10.0.0.7:41234 web.emojivoto.serviceaccount.identity.linkerd.cluster.local - '
                     '[2025-12-02T11:00:00.25Z] "GET /api/list?x=1 HTTP/1.1" 200']
    # no client identity; an IPv6 client; the proxy's own answer (never relayed)
    log.begin("s2", RequestHead(b"POST", b"/x", (), b"1.0"), ("fd00::7", 5), None)
    log.end("s2", 503, errors.load_shed())
    assert lines[1] == '[fd00::7]:5 - - [2025-12-02T11:00:00.25Z] "POST /x HTTP/1.0" 503'


def test_json_carries_every_field() -> None:
    log, lines, clock = _log(Format.JSON)
    head = RequestHead(b"POST", b"/emojivoto.v1.VotingService/VoteDoughnut",
                       ((b"host", b"voting-svc:8080"), (b"content-length", b"5"), (b"x-request-id", b"abc"),
                        (b"user-agent", b"grpc-go/1.6")), b"2")
    log.begin("s", head, ("10.0.0.9", 50000), None)
    clock.now += 0.001  # routed and sent upstream after 1 ms
    log.request("s", head, "", None)
    clock.now += 0.004  # the response head 4 ms later
    log.response("s", 200, ((b"content-type", b"application/grpc"),))
    entry = json.loads(lines[0])
    assert entry == {
        "client.addr": "10.0.0.9:50000", "client.id": "-", "timestamp": "2025-12-02T11:00:00.25Z",
        "method": "POST", "uri": "http://voting-svc:8080/emojivoto.v1.VotingService/VoteDoughnut",
        "version": "HTTP/2.0", "trace_id": "abc", "request_bytes": "5", "user_agent": "grpc-go/1.6",
        "host": "voting-svc:8080", "status": 200, "response_bytes": "", "total_ns": "5000000",
        "processing_ns": "1000000"}


def test_a_request_that_got_no_response_is_logged_when_it_ends_without_a_status() -> None:
    log, lines, clock = _log(Format.APACHE)
    log.begin("s", RequestHead(b"GET", b"/slow"), ("10.0.0.7", 1), None)
    log.end("s", None, None, reset_code=8)
    assert lines == ['10.0.0.7:1 - - [2025-12-02T11:00:00.25Z] "GET /slow HTTP/1.1"']


def test_the_variable_as_linkerd_reads_it(minimal_env: dict[str, str]) -> None:
    assert ProxyConfig.from_env(minimal_env).access_log is None
    assert ProxyConfig.from_env(dict(minimal_env, LINKERD2_PROXY_ACCESS_LOG="JSON")).access_log is Format.JSON
    config = ProxyConfig.from_env(dict(minimal_env, LINKERD2_PROXY_ACCESS_LOG="common"))
    assert config.access_log is None  # as linkerd2-proxy: said, and the proxy goes on without one
    assert config.unapplied == ("invalid LINKERD2_PROXY_ACCESS_LOG='common': expected either 'apache' or 'json'; "
                                "no access log",)


def test_the_inbound_proxy_logs_each_request_it_serves(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Two proxies in this process; the server's writes its access log to standard error. The client proxy
    carries the HTTP/1 requests as HTTP/2 (l5d-orig-proto), so the server's log shows them as it received them,
    as linkerd2-proxy's does (its access log is the outermost layer of the inbound HTTP server)."""

    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            server, client, svc, _, _ = await mesh.two_proxies(
                "web", 8080, 80, server_env={"LINKERD2_PROXY_ACCESS_LOG": "apache"})
            async with Web(server.ip, 8080, "web-0"), connection(svc, 80) as (reader, writer):
                head, _ = await request(reader, writer, "GET", "/hello")
                assert head.status == 200
                head, _ = await request(reader, writer, "GET", "/fail")
                assert head.status == 500

    run(scenario())
    logged = [line for line in capfd.readouterr().err.splitlines() if '"GET ' in line]
    pattern = (r'\d+\.\d+\.\d+\.\d+:\d+ client\.emojivoto\.serviceaccount\.identity\.linkerd\.cluster\.local - '
               r'\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\] "GET http://[^ ]+/(hello|fail) HTTP/2\.0" (200|500)')
    assert len(logged) == 2 and all(re.fullmatch(pattern, line) for line in logged), logged
    assert logged[0].endswith(" 200") and logged[1].endswith(" 500")
