"""tether.proxy.codec.addrs: DNS names, IPs, networks and host:port addresses."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.proxy.codec.addrs import (
    NameAddr,
    SocketAddr,
    is_dns_name,
    parse_addr,
    parse_dns_name,
    parse_ip,
    parse_network,
    parse_socket_addr,
)


@pytest.mark.parametrize(
    "name",
    [
        "localhost",
        "localhost.",
        "web.emojivoto.serviceaccount.identity.linkerd.cluster.local",
        "linkerd-dst-headless.linkerd.svc.cluster.local.",
        "Example.COM",
        "_grpc._tcp.example.com",
        "a" * 63 + ".com",
        "x1.y2",
        "1.2.3.example",
        ".".join(["a" * 63] * 3) + "." + "b" * 61,  # 253 characters
    ],
)
def test_valid_dns_names(name: str) -> None:
    assert is_dns_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "a..b",
        ".a",
        "a.b..",
        "-a.com",
        "a-.com",
        "a" * 64 + ".com",
        ".".join(["a" * 63] * 3) + "." + "b" * 62,  # 254 characters
        "10.0.0.1",
        "example.123",
        "exa mple.com",
        "exa*mple.com",
        "\u212aube.local",  # Kelvin sign lower-cases to an ASCII "k"
        "bücher.de",
    ],
)
def test_invalid_dns_names(name: str) -> None:
    assert not is_dns_name(name)
    with pytest.raises(ValueError, match="not a valid DNS name"):
        parse_dns_name(name)


def test_dns_names_are_kept_in_lower_case() -> None:
    assert parse_dns_name("Web.EmojiVoto.SVC.cluster.local.") == "web.emojivoto.svc.cluster.local."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:4143", SocketAddr(ipaddress.ip_address("0.0.0.0"), 4143)),
        ("127.0.0.1:0", SocketAddr(ipaddress.ip_address("127.0.0.1"), 0)),
        ("[::]:4143", SocketAddr(ipaddress.ip_address("::"), 4143)),
        ("[::1]:4140", SocketAddr(ipaddress.ip_address("::1"), 4140)),
        ("[fd00::1:2]:65535", SocketAddr(ipaddress.ip_address("fd00::1:2"), 65535)),
    ],
)
def test_parse_socket_addr(text: str, expected: SocketAddr) -> None:
    addr = parse_socket_addr(text)
    assert addr == expected
    assert str(addr) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4143", "is not host:port"),
        (":4143", "is not host:port"),
        ("0.0.0.0", "is not host:port"),
        ("0.0.0.0:", "not a decimal number"),
        ("0.0.0.0:65536", "outside 0-65535"),
        ("::1:4140", "needs brackets"),
        ("[::1]4140", "is not \\[ipv6\\]:port"),
        ("[127.0.0.1]:80", "is not \\[ipv6\\]:port"),
        ("localhost:4140", "'localhost' is not an IP address"),
        ("01.2.3.4:80", "is not an IP address"),
        ("[fe80::1%eth0]:80", "zone ids are not supported"),
    ],
)
def test_parse_socket_addr_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_socket_addr(text)


@pytest.mark.parametrize(
    ("text", "expected", "loopback"),
    [
        ("linkerd-dst-headless.linkerd.svc.cluster.local.:8086",
         NameAddr("linkerd-dst-headless.linkerd.svc.cluster.local.", 8086), False),
        ("localhost.:8086", NameAddr("localhost.", 8086), True),
        ("LocalHost:8086", NameAddr("localhost", 8086), True),
        ("localhost1.:8086", NameAddr("localhost1.", 8086), False),
        ("10.1.2.3:8080", SocketAddr(ipaddress.ip_address("10.1.2.3"), 8080), False),
        ("127.0.0.1:8080", SocketAddr(ipaddress.ip_address("127.0.0.1"), 8080), True),
        ("[::1]:8090", SocketAddr(ipaddress.ip_address("::1"), 8090), True),
    ],
)
def test_parse_addr(text: str, expected: SocketAddr | NameAddr, loopback: bool) -> None:
    addr = parse_addr(text)
    assert addr == expected
    assert addr.is_loopback is loopback


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dst:0", "outside 1-65535"),
        ("dst", "is not host:port"),
        ("-dst:80", "neither an IP address nor a DNS name"),
        ("1.2.3:80", "neither an IP address nor a DNS name"),
    ],
)
def test_parse_addr_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_addr(text)


def test_parse_ip_and_network() -> None:
    assert parse_ip("10.0.0.1") == ipaddress.ip_address("10.0.0.1")
    assert parse_ip("fd00::1") == ipaddress.ip_address("fd00::1")
    # Host bits may be set, as Linkerd's ipnet parser allows.
    assert parse_network("10.1.2.3/8") == ipaddress.ip_network("10.0.0.0/8")
    assert parse_network("fd00::/8") == ipaddress.ip_network("fd00::/8")
    for bad in ("10.0.0.0", "10.0.0.0/33", "ten/8", "fe80::%eth0/64"):
        with pytest.raises(ValueError, match="not a network in CIDR form"):
            parse_network(bad)


@given(st.text(max_size=40))
def test_parsers_raise_only_value_error(text: str) -> None:
    for parse in (parse_addr, parse_socket_addr, parse_ip, parse_network, parse_dns_name):
        try:
            parse(text)
        except ValueError:
            pass
