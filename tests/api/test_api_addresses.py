"""tether.api.addresses: (ip, port) <-> net.TcpAddress packing, for IPv4 and IPv6."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.api import net_pb2
from tether.api.addresses import (
    InvalidAddress,
    from_ip_address,
    from_tcp_address,
    to_ip_address,
    to_tcp_address,
)

ports = st.integers(min_value=0, max_value=0xFFFF)
ips = st.ip_addresses(v=4) | st.ip_addresses(v=6)


def test_ipv4_packs_first_octet_most_significant() -> None:
    msg = to_tcp_address("10.1.2.3", 8080)
    assert msg.ip.WhichOneof("ip") == "ipv4"
    assert msg.ip.ipv4 == 0x0A010203
    # proxy-api.md section 2.7's example, byte for byte.
    assert msg.SerializeToString() == bytes.fromhex("0a 05 0d 03 02 01 0a 10 90 3f")


def test_ipv6_splits_into_upper_and_lower_halves() -> None:
    msg = to_ip_address("fd00::1")
    assert (msg.ipv6.first, msg.ipv6.last) == (0xFD00_0000_0000_0000, 1)
    msg = to_ip_address("2001:db8:1:2:3:4:5:6")
    assert (msg.ipv6.first, msg.ipv6.last) == (0x2001_0DB8_0001_0002, 0x0003_0004_0005_0006)


@pytest.mark.parametrize(
    ("ip", "kind"),
    [("0.0.0.0", "ipv4"), ("::", "ipv6"), ("255.255.255.255", "ipv4"), ("::ffff:10.1.2.3", "ipv6")],
)
def test_edge_addresses_keep_their_family(ip: str, kind: str) -> None:
    decoded = net_pb2.TcpAddress.FromString(to_tcp_address(ip, 0).SerializeToString())
    assert decoded.ip.WhichOneof("ip") == kind
    assert ipaddress.ip_address(from_tcp_address(decoded)[0]) == ipaddress.ip_address(ip)


def test_ipv6_comes_back_in_compressed_form() -> None:
    packed = to_tcp_address("FD00:0000:0000:0000:0000:0000:0000:0001", 443)
    assert from_tcp_address(packed) == ("fd00::1", 443)


@given(ips, ports)
def test_round_trip_through_the_wire(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> None:
    wire = to_tcp_address(str(ip), port).SerializeToString()
    assert from_tcp_address(net_pb2.TcpAddress.FromString(wire)) == (str(ip), port)


@given(ips)
def test_packing_matches_the_integer_value(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    msg = to_ip_address(str(ip))
    if ip.version == 4:
        assert msg.ipv4 == int(ip)
    else:
        assert (msg.ipv6.first << 64) | msg.ipv6.last == int(ip)


@pytest.mark.parametrize("ip", ["", "10.1.2", "10.1.2.256", "host.example", "fe80::1%eth0"])
def test_rejects_what_the_wire_cannot_carry(ip: str) -> None:
    with pytest.raises(InvalidAddress):
        to_ip_address(ip)


@pytest.mark.parametrize("port", [-1, 0x10000])
def test_rejects_ports_beyond_16_bits(port: int) -> None:
    with pytest.raises(InvalidAddress):
        to_tcp_address("10.1.2.3", port)


def test_rejects_incomplete_or_oversized_messages() -> None:
    with pytest.raises(InvalidAddress):
        from_tcp_address(net_pb2.TcpAddress(port=80))
    with pytest.raises(InvalidAddress):
        from_ip_address(net_pb2.IPAddress())
    with pytest.raises(InvalidAddress):
        from_tcp_address(net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv4=1), port=0x10000))
