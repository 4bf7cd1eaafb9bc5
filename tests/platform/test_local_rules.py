"""proxy_init.nat_rules renders linkerd2-proxy-init's nat rules exactly; bad input names its field."""

from __future__ import annotations

import ipaddress

import pytest

from tether.platform.local.proxy_init import (
    PortRange,
    ProxyInitConfig,
    ProxyInitError,
    nat_rules,
    parse_ports,
    parse_subnets,
)

HEAD = """\
*nat
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
"""
JUMPS = """\
-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT
"""

DEFAULT = HEAD + JUMPS + """\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment "proxy-init/ignore-proxy-user-id" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 4567,4568 -m comment --comment "proxy-init/ignore-port-4567,4568" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment "proxy-init/redirect-all-outgoing-to-proxy-port" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191,4567,4568 -m comment --comment "proxy-init/ignore-port-4190,4191,4567,4568" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 4143
COMMIT
"""

CUSTOM = ProxyInitConfig(
    incoming_proxy_port=5143,
    outgoing_proxy_port=5140,
    proxy_uid=1234,
    proxy_gid=4321,
    inbound_ports_to_ignore=parse_ports("4190,8080-8090,9000", "inbound"),
    outbound_ports_to_ignore=parse_ports(["443", "6443,3306-3307"], "outbound"),
    subnets_to_ignore=parse_subnets("10.1.0.0/16,fd00::/8", "subnets"),
)
CUSTOM_OUTPUT = """\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 1234 -m comment --comment "proxy-init/ignore-proxy-user-id" -j RETURN
-A PROXY_INIT_OUTPUT -m owner --gid-owner 4321 -m comment --comment "proxy-init/ignore-proxy-group-id" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 443,6443,3306:3307 -m comment --comment "proxy-init/ignore-port-443,6443,3306:3307" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment "proxy-init/redirect-all-outgoing-to-proxy-port" -j REDIRECT --to-ports 5140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191,8080:8090,9000 -m comment --comment "proxy-init/ignore-port-4190,4191,8080:8090,9000" -j RETURN
"""
CUSTOM_V4 = HEAD + JUMPS + CUSTOM_OUTPUT + """\
-A PROXY_INIT_REDIRECT -s 10.1.0.0/16 -m comment --comment "proxy-init/ignore-subnet-10.1.0.0/16" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 5143
COMMIT
"""
CUSTOM_V6 = HEAD + JUMPS + CUSTOM_OUTPUT + """\
-A PROXY_INIT_REDIRECT -s fd00::/8 -m comment --comment "proxy-init/ignore-subnet-fd00::/8" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 5143
COMMIT
"""

# 15 port references per multiport rule, a range counting two (Linkerd's packing): 14 + 2 > 15.
MANY = ProxyInitConfig(
    proxy_uid=None,
    inbound_ports_to_ignore=(),
    outbound_ports_to_ignore=parse_ports(",".join(str(p) for p in range(1, 15)) + ",20-29,30", "outbound"),
)
MANY_TEXT = HEAD + JUMPS + """\
-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14 -m comment --comment "proxy-init/ignore-port-1,2,3,4,5,6,7,8,9,10,11,12,13,14" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 20:29,30 -m comment --comment "proxy-init/ignore-port-20:29,30" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment "proxy-init/redirect-all-outgoing-to-proxy-port" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191 -m comment --comment "proxy-init/ignore-port-4190,4191" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 4143
COMMIT
"""

INSTALLED = """\
*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT
COMMIT
"""


@pytest.mark.parametrize(
    ("config", "ipv6", "installed", "expected"),
    [
        pytest.param(ProxyInitConfig(), False, "", DEFAULT, id="default"),
        pytest.param(ProxyInitConfig(), True, "", DEFAULT, id="default-ipv6"),
        pytest.param(CUSTOM, False, "", CUSTOM_V4, id="custom-ipv4-subnets-only"),
        pytest.param(CUSTOM, True, "", CUSTOM_V6, id="custom-ipv6-subnets-only"),
        pytest.param(MANY, False, "", MANY_TEXT, id="multiport-chunks-no-uid"),
        pytest.param(ProxyInitConfig(), False, INSTALLED, DEFAULT.replace(JUMPS, ""), id="jumps-already-installed"),
    ],
)
def test_rule_text(config: ProxyInitConfig, ipv6: bool, installed: str, expected: str) -> None:
    assert nat_rules(config, ipv6=ipv6, installed=installed) == expected


def test_duplicate_ignored_ports_appear_once() -> None:
    config = ProxyInitConfig(inbound_ports_to_ignore=parse_ports("4190,4191,4567,4567", "inbound"))
    assert '--dports 4190,4191,4567 -m comment --comment "proxy-init/ignore-port-4190,4191,4567"' in nat_rules(config)


def test_a_jump_to_another_chain_is_not_mistaken_for_ours() -> None:
    installed = "-A PREROUTING -j PROXY_INIT_REDIRECT_OTHER\n-A OUTPUT -p udp -j KUBE-SERVICES\n"
    assert nat_rules(ProxyInitConfig(), installed=installed) == DEFAULT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4190", (PortRange(4190, 4190),)),
        (" 1 , 65535,,", (PortRange(1, 1), PortRange(65535, 65535))),
        ("4000-4010", (PortRange(4000, 4010),)),
        ("7-7", (PortRange(7, 7),)),
        ("", ()),
    ],
)
def test_parse_ports(text: str, expected: tuple[PortRange, ...]) -> None:
    assert parse_ports(text, "f") == expected


@pytest.mark.parametrize(
    ("text", "culprit"),
    [("0", "0"), ("65536", "65536"), ("10-9", "10-9"), ("http", "http"), ("1-2-3", "1-2-3"), ("80,-5", "-5")],
)
def test_bad_ports_name_the_field_and_the_item(text: str, culprit: str) -> None:
    with pytest.raises(ProxyInitError) as err:
        parse_ports(text, "inbound_ports_to_ignore")
    assert err.value.field == "inbound_ports_to_ignore"
    assert repr(culprit) in err.value.reason


def test_parse_subnets() -> None:
    assert parse_subnets("10.1.2.3/16, fd00::/8", "s") == (
        ipaddress.ip_network("10.1.0.0/16"),
        ipaddress.ip_network("fd00::/8"),
    )
    with pytest.raises(ProxyInitError, match="subnets_to_ignore: '10.0.0.0/33' is not a valid CIDR"):
        parse_subnets("10.0.0.0/33", "subnets_to_ignore")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("incoming_proxy_port", 0),
        ("outgoing_proxy_port", 70000),
        ("proxy_uid", 0),
        ("proxy_gid", -5),
    ],
)
def test_bad_config_names_the_field(field: str, value: int) -> None:
    with pytest.raises(ProxyInitError) as err:
        ProxyInitConfig(**{field: value})
    assert err.value.field == field
