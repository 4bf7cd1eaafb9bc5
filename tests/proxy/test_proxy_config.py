"""tether.proxy.core.config: the LINKERD2_PROXY_* environment contract (proxy.md §2)."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.ports import PortSet
from tether.proxy.codec.addrs import NameAddr, SocketAddr
from tether.proxy.core.config import (
    EX_CONFIG,
    Backoff,
    ConfigError,
    ControlAddr,
    DefaultPolicy,
    LogFormat,
    ProxyConfig,
    parse_socket_addr,
)

P = "LINKERD2_PROXY_"
DST_ID = "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"


def load(base: dict[str, str], **changes: str | None) -> ProxyConfig:
    """``base`` with ``changes`` applied (keys without the LINKERD2_PROXY_ prefix; None removes)."""
    env = dict(base)
    for key, value in changes.items():
        if value is None:
            env.pop(P + key, None)
        else:
            env[P + key] = value
    return ProxyConfig.from_env(env)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def ms(millis: int) -> timedelta:
    return timedelta(milliseconds=millis)


def ip(text: str) -> Any:
    return ipaddress.ip_address(text)


def test_exit_code_is_linkerds() -> None:
    assert EX_CONFIG == 64


def test_defaults(minimal_env: dict[str, str]) -> None:
    c = ProxyConfig.from_env(minimal_env)
    assert c.inbound.listen_addr == parse_socket_addr("0.0.0.0:4143")
    assert c.outbound.listen_addrs == (parse_socket_addr("127.0.0.1:4140"),)
    assert c.admin_listen_addr == parse_socket_addr("127.0.0.1:4191")
    assert c.control_listen_addr == parse_socket_addr("0.0.0.0:4190")
    assert c.tap_svc_name is None
    assert c.inbound.ports == PortSet.parse("4191")  # the admin port is always watched
    assert c.inbound.opaque_ports == PortSet()
    assert c.inbound.ips == frozenset()
    assert c.inbound.default_policy is DefaultPolicy.ALL_UNAUTHENTICATED
    assert (c.inbound.detect_timeout, c.outbound.detect_timeout) == (s(10), s(10))
    assert (c.inbound.connect_timeout, c.outbound.connect_timeout) == (ms(300), s(1))
    assert c.inbound.connect_backoff == Backoff(ms(100), s(10), 0.1)
    assert c.outbound.connect_backoff == Backoff(ms(100), s(60), 0.1)
    assert (c.inbound.discovery_idle_timeout, c.outbound.discovery_idle_timeout) == (s(90), s(5))
    assert (c.inbound.max_in_flight, c.outbound.max_in_flight) == (100_000, 100_000)
    assert (c.outbound.tcp_queue_capacity, c.outbound.tcp_failfast_timeout) == (10_000, s(3))
    assert (c.outbound.http_queue_capacity, c.outbound.http_failfast_timeout) == (10_000, s(3))
    assert (c.inbound.http_queue_capacity, c.inbound.http_failfast_timeout) == (10_000, s(1))
    assert c.inbound.metrics_authority_labels is False
    assert (c.inbound.http1_pool_idle_timeout, c.outbound.http1_pool_idle_timeout) == (s(3), s(3))
    assert (c.inbound.max_idle_conns_per_endpoint, c.outbound.max_idle_conns_per_endpoint) == (10_000, 10_000)
    assert c.destination == ControlAddr(NameAddr("linkerd-dst-headless.linkerd.svc.cluster.local.", 8086), DST_ID)
    assert c.destination_context == ""
    assert c.profile_suffixes == ("svc.cluster.local.",)
    assert c.profile_networks == () and c.cluster_networks == ()
    assert c.policy_workload == '{"ns":"emojivoto","pod":"web-0"}'
    assert (c.control_streams.initial_timeout, c.control_streams.idle_timeout, c.control_streams.lifetime) == (
        None, None, None)
    assert c.identity.local_name == "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
    assert (c.identity.min_refresh, c.identity.max_refresh) == (s(10), timedelta(hours=24))
    assert c.identity.svc.identity == "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
    assert c.identity.trust_anchors_pem == minimal_env[P + "IDENTITY_TRUST_ANCHORS"]
    assert c.log_filter == "warn,linkerd=info,hickory=error"
    assert c.log_format is LogFormat.PLAIN
    assert c.shutdown_grace_period == timedelta(minutes=2)
    assert c.shutdown_endpoint_enabled is False
    assert c.profile_initial_timeout == timedelta(milliseconds=500)


Getter = Callable[[ProxyConfig], object]

VALID: list[tuple[str, str, Getter, object]] = [
    ("INBOUND_LISTEN_ADDR", "[::]:4143", lambda c: c.inbound.listen_addr, SocketAddr(ip("::"), 4143)),
    ("OUTBOUND_LISTEN_ADDR", "127.0.0.1:14140", lambda c: c.outbound.listen_addrs,
     (SocketAddr(ip("127.0.0.1"), 14140),)),
    ("OUTBOUND_LISTEN_ADDRS", "127.0.0.1:4140,[::1]:4140", lambda c: c.outbound.listen_addrs,
     (SocketAddr(ip("127.0.0.1"), 4140), SocketAddr(ip("::1"), 4140))),
    ("ADMIN_LISTEN_ADDR", "[::]:4191", lambda c: c.admin_listen_addr, SocketAddr(ip("::"), 4191)),
    ("ADMIN_LISTEN_ADDR", "127.0.0.1:9990", lambda c: c.inbound.ports, PortSet.parse("9990")),
    ("ADMIN_LISTEN_ADDR", "127.0.0.1:0", lambda c: c.inbound.ports, PortSet()),
    ("CONTROL_LISTEN_ADDR", "0.0.0.0:14190", lambda c: c.control_listen_addr, SocketAddr(ip("0.0.0.0"), 14190)),
    ("TAP_SVC_NAME", "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local", lambda c: c.tap_svc_name,
     "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"),
    ("INBOUND_PORTS", "8080,9090-9091", lambda c: c.inbound.ports, PortSet.parse("4191,8080,9090-9091")),
    ("INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", "25,587,3306,4444,5432,6379,9300,11211",
     lambda c: c.inbound.opaque_ports, PortSet.parse("25,587,3306,4444,5432,6379,9300,11211")),
    ("INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", "", lambda c: c.inbound.opaque_ports, PortSet()),
    ("INBOUND_IPS", "10.42.0.7,fd00::7", lambda c: c.inbound.ips, frozenset({ip("10.42.0.7"), ip("fd00::7")})),
    ("INBOUND_DEFAULT_POLICY", "deny", lambda c: c.inbound.default_policy, DefaultPolicy.DENY),
    ("INBOUND_DEFAULT_POLICY", "all-authenticated", lambda c: c.inbound.default_policy,
     DefaultPolicy.ALL_AUTHENTICATED),
    ("INBOUND_DEFAULT_POLICY", "audit", lambda c: c.inbound.default_policy, DefaultPolicy.AUDIT),
    ("INBOUND_DETECT_TIMEOUT", "365d", lambda c: c.inbound.detect_timeout, timedelta(days=365)),
    ("OUTBOUND_DETECT_TIMEOUT", "1s", lambda c: c.outbound.detect_timeout, s(1)),
    ("INBOUND_CONNECT_TIMEOUT", "100ms", lambda c: c.inbound.connect_timeout, ms(100)),
    ("OUTBOUND_CONNECT_TIMEOUT", "1000ms", lambda c: c.outbound.connect_timeout, s(1)),
    ("INBOUND_DISCOVERY_IDLE_TIMEOUT", "90s", lambda c: c.inbound.discovery_idle_timeout, s(90)),
    ("OUTBOUND_DISCOVERY_IDLE_TIMEOUT", "0", lambda c: c.outbound.discovery_idle_timeout, s(0)),
    ("DESTINATION_CONTEXT", '{"ns":"emojivoto","nodeName":"n1","pod":"web-0"}', lambda c: c.destination_context,
     '{"ns":"emojivoto","nodeName":"n1","pod":"web-0"}'),
    ("DESTINATION_SVC_ADDR", "localhost.:8086", lambda c: c.destination,
     ControlAddr(NameAddr("localhost.", 8086), None)),
    ("DESTINATION_SVC_ADDR", "10.96.0.10:8086", lambda c: c.destination,
     ControlAddr(SocketAddr(ip("10.96.0.10"), 8086), DST_ID)),
    ("DESTINATION_PROFILE_SUFFIXES", "svc.example.org.", lambda c: c.profile_suffixes, ("svc.example.org.",)),
    ("DESTINATION_PROFILE_SUFFIXES", ".", lambda c: c.profile_suffixes, (".",)),
    ("DESTINATION_PROFILE_SUFFIXES", "", lambda c: c.profile_suffixes, ()),
    ("DESTINATION_PROFILE_NETWORKS", "10.0.0.0/8,fd00::/8", lambda c: c.profile_networks,
     (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))),
    ("POLICY_CLUSTER_NETWORKS", "10.0.0.0/8", lambda c: c.cluster_networks, (ipaddress.ip_network("10.0.0.0/8"),)),
    ("CONTROL_STREAM_INITIAL_TIMEOUT", "3s", lambda c: c.control_streams.initial_timeout, s(3)),
    ("CONTROL_STREAM_IDLE_TIMEOUT", "5m", lambda c: c.control_streams.idle_timeout, s(300)),
    ("CONTROL_STREAM_LIFETIME", "1h", lambda c: c.control_streams.lifetime, s(3600)),
    ("CONTROL_STREAM_LIFETIME", "", lambda c: c.control_streams.lifetime, None),
    ("IDENTITY_MIN_REFRESH", "1m", lambda c: c.identity.min_refresh, s(60)),
    ("IDENTITY_MAX_REFRESH", "1d", lambda c: c.identity.max_refresh, timedelta(days=1)),
    ("IDENTITY_LOCAL_NAME", "Web.EmojiVoto.serviceaccount.identity.linkerd.cluster.local",
     lambda c: c.identity.local_name, "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"),
    ("IDENTITY_SVC_ADDR", "127.0.0.1:8080", lambda c: c.identity.svc,
     ControlAddr(SocketAddr(ip("127.0.0.1"), 8080), None)),
    ("IDENTITY_DISABLED", "", lambda c: c.identity.local_name,
     "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"),
    ("LOG", "debug,linkerd=trace", lambda c: c.log_filter, "debug,linkerd=trace"),
    ("LOG_FORMAT", "json", lambda c: c.log_format, LogFormat.JSON),
    ("LOG_FORMAT", "PLAIN", lambda c: c.log_format, LogFormat.PLAIN),
    ("SHUTDOWN_GRACE_PERIOD", "30s", lambda c: c.shutdown_grace_period, s(30)),
    ("DESTINATION_PROFILE_INITIAL_TIMEOUT", "2s", lambda c: c.profile_initial_timeout, s(2)),
    ("SHUTDOWN_ENDPOINT_ENABLED", "true", lambda c: c.shutdown_endpoint_enabled, True),
    ("SHUTDOWN_ENDPOINT_ENABLED", "false", lambda c: c.shutdown_endpoint_enabled, False),
    ("INBOUND_MAX_IN_FLIGHT", "10", lambda c: c.inbound.max_in_flight, 10),
    ("OUTBOUND_MAX_IN_FLIGHT", "250000", lambda c: c.outbound.max_in_flight, 250_000),
    ("INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT", "10s", lambda c: c.inbound.http1_pool_idle_timeout, s(10)),
    ("OUTBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT", "500ms", lambda c: c.outbound.http1_pool_idle_timeout, ms(500)),
    ("MAX_IDLE_CONNS_PER_ENDPOINT", "1", lambda c: c.inbound.max_idle_conns_per_endpoint, 1),
    ("OUTBOUND_MAX_IDLE_CONNS_PER_ENDPOINT", "0", lambda c: c.outbound.max_idle_conns_per_endpoint, 0),
    ("OUTBOUND_TCP_QUEUE_CAPACITY", "7", lambda c: c.outbound.tcp_queue_capacity, 7),
    ("OUTBOUND_HTTP_QUEUE_CAPACITY", "20000", lambda c: c.outbound.http_queue_capacity, 20_000),
    ("OUTBOUND_HTTP_FAILFAST_TIMEOUT", "750ms", lambda c: c.outbound.http_failfast_timeout, ms(750)),
    ("INBOUND_HTTP_QUEUE_CAPACITY", "1", lambda c: c.inbound.http_queue_capacity, 1),
    ("INBOUND_HTTP_FAILFAST_TIMEOUT", "250ms", lambda c: c.inbound.http_failfast_timeout, ms(250)),
    ("OUTBOUND_TCP_FAILFAST_TIMEOUT", "750ms", lambda c: c.outbound.http_failfast_timeout, s(3)),  # not HTTP's
    ("INBOUND_METRICS_AUTHORITY_LABELS", "unsafe", lambda c: c.inbound.metrics_authority_labels, True),
    ("INBOUND_METRICS_AUTHORITY_LABELS", "UNSAFE", lambda c: c.inbound.metrics_authority_labels, True),
    ("INBOUND_METRICS_AUTHORITY_LABELS", "", lambda c: c.inbound.metrics_authority_labels, False),
]


@pytest.mark.parametrize(("var", "value", "get", "expected"), VALID, ids=[f"{v}={x}" for v, x, *_ in VALID])
def test_variable_parses(minimal_env: dict[str, str], var: str, value: str, get: Getter, expected: object) -> None:
    assert get(load(minimal_env, **{var: value})) == expected


INVALID: list[tuple[str, str, str]] = [
    ("INBOUND_LISTEN_ADDR", "0.0.0.0", "is not host:port"),
    ("INBOUND_LISTEN_ADDR", "localhost:4143", "is not an IP address"),
    ("INBOUND_LISTEN_ADDR", "::4143", "needs brackets"),
    ("OUTBOUND_LISTEN_ADDR", "127.0.0.1:70000", "outside 0-65535"),
    ("OUTBOUND_LISTEN_ADDRS", "127.0.0.1:4140,[::1]:4140,10.0.0.1:4140", "needs 1 or 2 addresses"),
    ("OUTBOUND_LISTEN_ADDRS", "", "needs 1 or 2 addresses"),
    ("ADMIN_LISTEN_ADDR", "", "is not host:port"),
    ("CONTROL_LISTEN_ADDR", "[::1]", "is not [ipv6]:port"),
    ("TAP_SVC_NAME", "not a name", "not a valid DNS name"),
    ("INBOUND_PORTS", "80,http", "'http' is not a decimal number"),
    ("INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", "3306-25", "ends before it starts"),
    ("INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION", "0", "outside 1-65535"),
    ("INBOUND_IPS", "10.0.0.300", "is not an IP address"),
    ("INBOUND_DEFAULT_POLICY", "tls-unauthenticated", "is not a default policy"),
    ("INBOUND_DEFAULT_POLICY", "cluster-authenticated", "needs LINKERD2_PROXY_POLICY_CLUSTER_NETWORKS"),
    ("INBOUND_DETECT_TIMEOUT", "10", "has no unit"),
    ("INBOUND_DETECT_TIMEOUT", "", "not a duration"),
    ("OUTBOUND_DETECT_TIMEOUT", "1.5s", "not a duration"),
    ("INBOUND_CONNECT_TIMEOUT", "100 ms", "not a duration"),
    ("OUTBOUND_CONNECT_TIMEOUT", "1sec", "not a duration"),
    ("INBOUND_DISCOVERY_IDLE_TIMEOUT", "-1s", "not a duration"),
    ("DESTINATION_SVC_ADDR", "linkerd-dst-headless:0", "outside 1-65535"),
    ("DESTINATION_SVC_ADDR", "", "is not host:port"),
    ("DESTINATION_SVC_NAME", "_bad name_", "not a valid DNS name"),
    ("DESTINATION_PROFILE_SUFFIXES", "svc..cluster.local", "not a valid DNS name"),
    ("DESTINATION_PROFILE_NETWORKS", "10.0.0.0", "not a network in CIDR form"),
    ("POLICY_SVC_ADDR", "linkerd-policy", "is not host:port"),
    ("POLICY_WORKLOAD", "", "must not be empty"),
    ("POLICY_CLUSTER_NETWORKS", "10.0.0.0/99", "not a network in CIDR form"),
    ("CONTROL_STREAM_INITIAL_TIMEOUT", "3", "has no unit"),
    ("IDENTITY_DIR", "", "must not be empty"),
    ("IDENTITY_TOKEN_FILE", "", "must not be empty"),
    ("IDENTITY_TRUST_ANCHORS", "", "no readable PEM certificate"),
    ("IDENTITY_TRUST_ANCHORS", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
     "no readable PEM certificate"),
    ("IDENTITY_LOCAL_NAME", "web.emojivoto..local", "not a valid DNS name"),
    ("IDENTITY_SVC_ADDR", "[::1]:", "not a decimal number"),
    ("IDENTITY_MIN_REFRESH", "10", "has no unit"),
    ("IDENTITY_MAX_REFRESH", "forever", "not a duration"),
    ("IDENTITY_DISABLED", "true", "identity cannot be disabled"),
    ("IDENTITY_SPIRE_WORKLOAD_API_ADDRESS", "tcp://127.0.0.1:8081", "must be unix:///absolute/path"),
    ("IDENTITY_SPIRE_SOCKET", "run/spire/agent.sock", "must be unix:///absolute/path"),
    ("INBOUND_CONNECT_EXP_BACKOFF_JITTER", "nan", "not a non-negative number"),
    ("LOG_FORMAT", "yaml", "not a log format"),
    ("SHUTDOWN_GRACE_PERIOD", "2 m", "not a duration"),
    ("DESTINATION_PROFILE_INITIAL_TIMEOUT", "500", "has no unit"),
    ("SHUTDOWN_ENDPOINT_ENABLED", "True", "not a boolean"),
    ("SHUTDOWN_ENDPOINT_ENABLED", "1", "not a boolean"),
    ("INBOUND_MAX_IN_FLIGHT", "0", "not a positive integer"),
    ("OUTBOUND_MAX_IN_FLIGHT", "-5", "not a positive integer"),
    ("OUTBOUND_MAX_IN_FLIGHT", "1_000", "not a positive integer"),
    ("MAX_IDLE_CONNS_PER_ENDPOINT", "-1", "not a whole number"),
    ("OUTBOUND_MAX_IDLE_CONNS_PER_ENDPOINT", "ten", "not a whole number"),
    ("INBOUND_HTTP1_CONNECTION_POOL_IDLE_TIMEOUT", "3", "has no unit"),
    ("OUTBOUND_HTTP_QUEUE_CAPACITY", "0", "not a positive integer"),
    ("OUTBOUND_TCP_QUEUE_CAPACITY", "lots", "not a positive integer"),
    ("OUTBOUND_HTTP_FAILFAST_TIMEOUT", "3", "has no unit"),
    ("INBOUND_HTTP_QUEUE_CAPACITY", "0", "not a positive integer"),
    ("INBOUND_HTTP_FAILFAST_TIMEOUT", "1", "has no unit"),
    ("INBOUND_METRICS_AUTHORITY_LABELS", "true", "not an authority labels setting"),
    ("INBOUND_METRICS_AUTHORITY_LABELS", "safe", "not an authority labels setting"),
]


@pytest.mark.parametrize(("var", "value", "message"), INVALID, ids=[f"{v}={x!r}" for v, x, _ in INVALID])
def test_variable_rejected(minimal_env: dict[str, str], var: str, value: str, message: str) -> None:
    env = dict(minimal_env)
    if var.startswith("INBOUND_CONNECT_EXP_BACKOFF"):
        # A jitter on its own is a different error; give it its companions.
        env |= {P + "INBOUND_CONNECT_EXP_BACKOFF_MIN": "1s", P + "INBOUND_CONNECT_EXP_BACKOFF_MAX": "2s"}
    with pytest.raises(ConfigError) as info:
        load(env, **{var: value})
    err = info.value
    assert err.variable == P + var
    assert err.value == value
    assert P + var in str(err) and message in str(err)
    assert repr(value[:20])[:-1] in str(err)  # the message shows the bad value


REQUIRED = [
    "DESTINATION_SVC_ADDR",
    "POLICY_SVC_ADDR",
    "POLICY_WORKLOAD",
    "IDENTITY_DIR",
    "IDENTITY_TOKEN_FILE",
    "IDENTITY_TRUST_ANCHORS",
    "IDENTITY_SVC_ADDR",
]


@pytest.mark.parametrize("var", REQUIRED)
def test_required_variable_missing(minimal_env: dict[str, str], var: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(minimal_env, **{var: None})
    assert info.value.variable == P + var
    assert str(info.value) == f"{P}{var}: must be set"


@pytest.mark.parametrize("base", ["DESTINATION", "POLICY", "IDENTITY"])
def test_svc_name_required_unless_loopback(minimal_env: dict[str, str], base: str) -> None:
    with pytest.raises(ConfigError, match=f"{P}{base}_SVC_NAME: must be set because {P}{base}_SVC_ADDR="):
        load(minimal_env, **{f"{base}_SVC_NAME": None})
    # A loopback address means plaintext; the name is not needed, and ignored if given.
    for addr in ("localhost:8086", "127.0.0.1:8086", "[::1]:8086"):
        c = load(minimal_env, **{f"{base}_SVC_ADDR": addr, f"{base}_SVC_NAME": None})
        ctrl = c.identity.svc if base == "IDENTITY" else getattr(c, base.lower())
        assert ctrl.identity is None and ctrl.addr.is_loopback


def test_local_name_from_server_id_and_name(minimal_env: dict[str, str]) -> None:
    name = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
    c = load(minimal_env, IDENTITY_LOCAL_NAME=None, IDENTITY_SERVER_ID=name, IDENTITY_SERVER_NAME=name)
    assert c.identity.local_name == name
    with pytest.raises(ConfigError, match="must equal LINKERD2_PROXY_IDENTITY_SERVER_ID"):
        load(minimal_env, IDENTITY_LOCAL_NAME=None, IDENTITY_SERVER_ID=name, IDENTITY_SERVER_NAME="other.local")
    with pytest.raises(ConfigError, match="LINKERD2_PROXY_IDENTITY_LOCAL_NAME: must be set"):
        load(minimal_env, IDENTITY_LOCAL_NAME=None, IDENTITY_SERVER_ID=name)


def test_outbound_listen_addrs_take_precedence(minimal_env: dict[str, str]) -> None:
    c = load(minimal_env, OUTBOUND_LISTEN_ADDR="127.0.0.1:1", OUTBOUND_LISTEN_ADDRS="127.0.0.1:2")
    assert c.outbound.listen_addrs == (parse_socket_addr("127.0.0.1:2"),)


def test_cluster_default_policies_need_cluster_networks(minimal_env: dict[str, str]) -> None:
    for policy in ("cluster-authenticated", "cluster-unauthenticated"):
        c = load(minimal_env, INBOUND_DEFAULT_POLICY=policy, POLICY_CLUSTER_NETWORKS="10.0.0.0/8")
        assert c.inbound.default_policy.value == policy


def test_backoff_min_and_max_go_together(minimal_env: dict[str, str]) -> None:
    base = "OUTBOUND_CONNECT_EXP_BACKOFF"
    c = load(minimal_env, **{f"{base}_MIN": "50ms", f"{base}_MAX": "5s"})
    assert c.outbound.connect_backoff == Backoff(ms(50), s(5), 0.0)  # jitter 0 when omitted
    c = load(minimal_env, **{f"{base}_MIN": "50ms", f"{base}_MAX": "5s", f"{base}_JITTER": "0.5"})
    assert c.outbound.connect_backoff == Backoff(ms(50), s(5), 0.5)
    with pytest.raises(ConfigError, match=f"{P}{base}_MAX: must be set together with {P}{base}_MIN"):
        load(minimal_env, **{f"{base}_MIN": "50ms"})
    with pytest.raises(ConfigError, match=f"{P}{base}_MIN: must be set together with {P}{base}_MAX"):
        load(minimal_env, **{f"{base}_JITTER": "0.1"})
    with pytest.raises(ConfigError, match=f"invalid {P}{base}_MIN='5s': must not exceed {P}{base}_MAX=1s"):
        load(minimal_env, **{f"{base}_MIN": "5s", f"{base}_MAX": "1s"})


def test_control_stream_limits_are_ordered(minimal_env: dict[str, str]) -> None:
    c = load(minimal_env, CONTROL_STREAM_INITIAL_TIMEOUT="3s", CONTROL_STREAM_LIFETIME="1h")
    assert (c.control_streams.initial_timeout, c.control_streams.lifetime) == (s(3), s(3600))
    with pytest.raises(ConfigError) as info:
        load(minimal_env, CONTROL_STREAM_INITIAL_TIMEOUT="3s", CONTROL_STREAM_IDLE_TIMEOUT="", CONTROL_STREAM_LIFETIME="1s")
    assert str(info.value) == (
        f"invalid {P}CONTROL_STREAM_INITIAL_TIMEOUT='3s': must not exceed {P}CONTROL_STREAM_LIFETIME=1s"
    )
    with pytest.raises(ConfigError, match="IDLE_TIMEOUT='10m': must not exceed"):
        load(minimal_env, CONTROL_STREAM_IDLE_TIMEOUT="10m", CONTROL_STREAM_LIFETIME="5m")


def test_refresh_bounds_are_ordered(minimal_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=f"invalid {P}IDENTITY_MIN_REFRESH='2d'"):
        load(minimal_env, IDENTITY_MIN_REFRESH="2d")
    with pytest.raises(ConfigError, match=f"invalid {P}IDENTITY_MAX_REFRESH='1s'"):
        load(minimal_env, IDENTITY_MAX_REFRESH="1s")


def test_long_values_are_shortened_in_messages(minimal_env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load(minimal_env, IDENTITY_TRUST_ANCHORS="x" * 500)
    assert "'" + "x" * 77 + "...'" in str(info.value) and "x" * 78 not in str(info.value)
    assert info.value.value == "x" * 500


def test_config_is_frozen(minimal_env: dict[str, str]) -> None:
    c = ProxyConfig.from_env(minimal_env)
    with pytest.raises(AttributeError):
        c.inbound.detect_timeout = s(1)  # type: ignore[misc]


KNOWN = sorted({v for v, *_ in VALID} | {v for v, *_ in INVALID} | set(REQUIRED))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(st.dictionaries(st.sampled_from(KNOWN), st.text(max_size=30), max_size=4))
def test_any_environment_gives_a_config_or_a_config_error(
    minimal_env: dict[str, str], changes: dict[str, str]
) -> None:
    try:
        load(minimal_env, **changes)
    except ConfigError as err:
        assert err.variable.startswith(P)


def test_backoff_doubles_to_its_max_with_jitter_inside_it_and_discovery_waits_by_it() -> None:
    import random

    from tether.proxy.io.discovery import Discovery

    backoff = Backoff(ms(100), s(1), 0.5)
    assert [backoff.delay(n, 0.0) for n in (1, 2, 3, 4, 5, 10_000)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.delay(1, 0.999) == pytest.approx(0.1 + 0.05 * 0.999)
    assert backoff.delay(4, 0.999) == 1.0  # jitter never takes it past the max
    discovery = Discovery(context_token="", idle_timeout=1.0, backoff=backoff, failfast=1.0, clock=lambda: 0.0,
                          rng=random.Random(7))
    draws = random.Random(7)
    assert [discovery.backoff_delay(n) for n in (1, 2, 3)] == [backoff.delay(n, draws.random()) for n in (1, 2, 3)]
