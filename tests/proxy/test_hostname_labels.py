"""``LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS`` (proxy.md §2.6, §9.5): off by default (``hostname=""``);
on, the request's host is the ``hostname`` label of the outbound HTTP and gRPC route families and the SNI that
of the TLS route families, as linkerd2-proxy's.

Socket-free: the configuration, the host a request is labelled with, the HTTP/1 core with a retrying route
(a playbook) and the TLS connection layer. End to end: a real proxy (tests/proxy/proxy_harness.py) whose
client policy comes from the policy controller's own OutboundPolicies service over real gRPC (loopback).
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "policy" / "outbound"))
from outbound_helpers import EGRESS_NS, feed, http_route, service  # noqa: E402
from proxy_harness import Mesh, connection, run, samples, scrape  # noqa: E402
from test_client_policy import PARENT, ROUTE, UP, Balancers, controller, playbook, served  # noqa: E402
from test_connection_routes import Proxy, hello, tls_routes  # noqa: E402
from test_http1_mesh import Web, request  # noqa: E402

from tether.policy import PolicyConfig  # noqa: E402
from tether.policy.config import parse_networks  # noqa: E402
from tether.policy.metrics import PolicyMetrics as ControllerMetrics  # noqa: E402
from tether.policy.outbound import OutboundIndex  # noqa: E402
from tether.policy.outbound.server import OutboundPoliciesServicer  # noqa: E402
from tether.serving.rpc import StreamSet  # noqa: E402

from tether.proxy.codec.http1 import RequestHead  # noqa: E402
from tether.proxy.core.client_policy_translation import translate  # noqa: E402
from tether.proxy.core.config import ConfigError, ProxyConfig  # noqa: E402
from tether.proxy.core.metrics import Registry  # noqa: E402
from tether.proxy.core.policy_metrics import PolicyMetrics, request_host  # noqa: E402
from tether.proxy.core.policy_routes import RouteReport  # noqa: E402

VAR = "LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS"


def test_the_variable_is_read_false_by_default_and_refused_by_name_when_not_a_boolean(
        minimal_env: dict[str, str]) -> None:
    assert ProxyConfig.from_env(minimal_env).outbound.metrics_hostname_labels is False
    assert ProxyConfig.from_env({**minimal_env, VAR: "true"}).outbound.metrics_hostname_labels is True
    assert ProxyConfig.from_env({**minimal_env, VAR: "false"}).outbound.metrics_hostname_labels is False
    with pytest.raises(ConfigError) as info:
        ProxyConfig.from_env({**minimal_env, VAR: "yes"})
    assert str(info.value).startswith(f"invalid {VAR}='yes'")


@pytest.mark.parametrize(("target", "headers", "expected"), [
    (b"/a", ((b"host", b"Web.Example.com:8080"),), "web.example.com"),
    (b"/a", ((b"host", b"web"),), "web"),
    (b"/a", ((b":authority", b"api.emojivoto.svc.cluster.local:80"),), "api.emojivoto.svc.cluster.local"),
    (b"/a", ((b"host", b"web.example.com."),), "web.example.com."),  # kept as given, as Linkerd's dns::Name
    (b"http://Abs.Example.com:81/a?b=1", ((b"host", b"other"),), "abs.example.com"),  # the URI's own authority
    (b"http://user@abs.example.com/", (), "abs.example.com"),
    (b"/a", ((b"host", b"10.0.0.1:80"),), ""),  # an IP is not a DNS name
    (b"/a", ((b"host", b"[::1]:80"),), ""),
    (b"/a", ((b"host", b"bad name"),), ""),
    (b"/a", ((b"host", b"-x.example.com"),), ""),
    (b"/a", (), ""),
])
def test_the_host_a_request_is_labelled_with(target: bytes, headers: tuple[tuple[bytes, bytes], ...],
                                             expected: str) -> None:
    assert request_host(RequestHead(b"GET", target, headers)) == expected


def test_an_http2_request_with_both_authority_and_host_is_routed_and_labelled_by_its_authority() -> None:
    from tether.proxy.core.http2_proxy import _Stream

    pseudo = {b":method": b"GET", b":scheme": b"http", b":path": b"/", b":authority": b"api.example.com:80"}
    head = _Stream(1, pseudo, [(b"host", b"other.example.com"), (b"x-a", b"1")], 0.0).request_head()
    assert head.headers == ((b"host", b"api.example.com:80"), (b"x-a", b"1"))
    assert request_host(head) == "api.example.com"
    alone = _Stream(3, {**pseudo, b":authority": b""}, [(b"host", b"other.example.com")], 0.0).request_head()
    assert request_host(alone) == "other.example.com"  # no :authority: the host header


def test_without_the_variable_the_label_stays_empty() -> None:
    metrics = PolicyMetrics(Registry(retain_idle=600.0))
    assert metrics.hostname(RequestHead(b"GET", b"/", ((b"host", b"web.example.com"),))) == ""
    assert metrics.sni_hostname("api.example.com") == ""


def retried_request(metrics: PolicyMetrics, host: bytes) -> None:
    from playbook import CallLater, Checkin, Checkout, Connected, DownData, Fire, SendUp, UpData, exchange

    route = http_route("r", "web", [{}], annotations={"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "1"})
    get_ = b"GET /r HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert (playbook([route], metrics)
            >> DownData(get_)
            << Checkout(UP)
            >> Connected()
            << SendUp(0, get_)
            >> UpData(0, b"HTTP/1.1 503 Flaky\r\nContent-Length: 0\r\n\r\n")
            << Checkin(0, reuse=False)
            << CallLater(0.025)
            >> Fire()
            >> exchange(UP, 1, get_, ok))


@pytest.mark.parametrize(("exported", "host", "label"), [
    (True, b"Web.Example.com:8080", "web.example.com"),
    (True, b"10.96.0.10", ""),
    (False, b"web.example.com", ""),
])
def test_a_requests_route_series_carry_its_host_when_exported(exported: bool, host: bytes, label: str) -> None:
    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    retried_request(PolicyMetrics(registry, hostname_labels=exported), host)
    text = registry.render()
    labels = f'{PARENT},{ROUTE},hostname="{label}"'
    assert f"outbound_http_route_request_statuses_total{{{labels},http_status=\"200\",error=\"\"}} 1" in text
    assert f"outbound_http_route_request_duration_seconds_count{{{labels}}} 1" in text
    assert f"outbound_http_route_retry_requests_total{{{labels}}} 1" in text
    assert f"outbound_http_route_retry_successes_total{{{labels}}} 1" in text
    # The backend families are Linkerd's: no hostname label.
    assert [line for line in text.splitlines() if line.startswith("outbound_http_route_backend")
            and "hostname=" in line] == []


def test_hosts_do_not_grow_the_series_past_the_bound() -> None:
    from tether.proxy.core.metrics import MAX_SERIES

    registry = Registry(retain_idle=600.0, clock=lambda: 100.0)
    metrics = PolicyMetrics(registry, hostname_labels=True)
    for i in range(MAX_SERIES + 50):
        RouteReport(metrics, False, f"{PARENT},{ROUTE}", f"h{i}.example.com").series().ended(200, None, 0.01, "")
    statuses = [line for line in registry.render().splitlines()
                if line.startswith("outbound_http_route_request_statuses_total{")]
    durations = [line for line in registry.render().splitlines()
                 if line.startswith("outbound_http_route_request_duration_seconds_count{")]
    assert 0 < len(statuses) <= MAX_SERIES and 0 < len(durations) <= MAX_SERIES


@pytest.mark.parametrize(("exported", "label"), [(True, "api.example.com"), (False, "")])
def test_a_tls_routes_series_carry_the_sni_when_exported(exported: bool, label: str) -> None:
    balancers = Balancers()
    proxy = Proxy(translate(served(controller(*tls_routes())), balancers), balancers)
    proxy.settings.policy_metrics.hostname_labels = exported  # type: ignore[union-attr]
    proxy.connect(Detect=hello("api.example.com"))
    for family in ("outbound_tls_route_open_total", "outbound_tls_route_close_total"):
        [line] = proxy.lines(family)
        assert f'route_name="exact",hostname="{label}"' in line and line.endswith(" 1"), line


def test_a_real_proxy_labels_its_route_metrics_with_the_requests_host(tmp_path: Path) -> None:
    """The client's proxy gets its client policy (an HTTPRoute on the Service) from the policy controller's
    OutboundPolicies service (its index and servicer, real gRPC on loopback; the index fed directly, no API
    server); the request crosses both proxies to the app."""
    async def scenario() -> None:
        index = OutboundIndex(PolicyConfig(cluster_networks=parse_networks("127.0.0.0/8"),
                                           global_egress_network_namespace=EGRESS_NS))
        servicer = OutboundPoliciesServicer(index, StreamSet(100), ControllerMetrics())
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((servicer.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with Mesh(tmp_path) as mesh:
                web_pod, client, svc = mesh.one_served_pod("web", 8080, 80)
                feed(index, service("web", svc), http_route("r", "web", [{}]))
                await mesh.start_proxy(web_pod)
                a = await mesh.start_proxy(client, outbound_to=[f"{svc}:80"],
                                           LINKERD2_PROXY_POLICY_SVC_ADDR=f"127.0.0.1:{port}",
                                           LINKERD2_PROXY_OUTBOUND_METRICS_HOSTNAME_LABELS="true")
                async with Web(web_pod.ip, 8080, "web-0"):
                    async with connection(svc, 80) as (reader, writer):
                        head, body = await request(reader, writer, "GET", "/a")
                        assert (head.status, body) == (200, b"web-0 GET /a 0")
                await a.idle()
                statuses = samples(await scrape(a), "outbound_http_route_request_statuses_total",
                                   route_kind="HTTPRoute", route_name="r")
                assert [(labels["hostname"], labels["http_status"], value) for labels, value in statuses] \
                    == [("web", "200", 1.0)], statuses
        finally:
            await server.stop(None)

    run(scenario())
