"""netns.HostNet makes pods as real namespaces on a real bridge, runs processes in them, cleans up."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
from collections.abc import Callable

import netlab
import pytest

from tether.platform.local.firewall import apply_rules
from tether.platform.local.netns import CommandError, HostNet, LocalNetError, NetnsConfig, PodNet, bridge_mac
from tether.platform.local.proxy_init import ProxyInitConfig

Keep = Callable[[socket.socket], socket.socket]


def _ip_json(*argv: str) -> list[dict]:
    return json.loads(subprocess.run(["ip", "-j", *argv], capture_output=True, text=True, check=True).stdout or "[]")


@pytest.mark.parametrize("direction", ["a-to-b", "b-to-a"])
def test_two_pods_on_the_bridge_reach_each_other(make_pod: Callable[..., PodNet], keep: Keep, direction: str) -> None:
    a, b = make_pod("a"), make_pod("b")
    client, server = (a, b) if direction == "a-to-b" else (b, a)
    listener = keep(netlab.listen(server, 8080))
    conn = keep(netlab.connect(client, str(server.address.ip), 8080))
    accepted, (peer_ip, _) = listener.accept()
    keep(accepted)
    assert peer_ip == str(client.address.ip)
    conn.sendall(b"ping")
    assert accepted.recv(4) == b"ping"
    accepted.sendall(b"pong")
    assert conn.recv(4) == b"pong"


def test_pod_layout(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    pod = make_pod("layout")
    inside = {link["ifname"]: link for link in _ip_json("-n", pod.netns, "addr", "show")}
    assert set(inside) == {"lo", "eth0"}
    assert "UP" in inside["lo"]["flags"]
    eth0_v4 = [(a["local"], a["prefixlen"]) for a in inside["eth0"]["addr_info"] if a["family"] == "inet"]
    assert eth0_v4 == [(str(pod.address.ip), pod.address.network.prefixlen)]
    routes = _ip_json("-n", pod.netns, "route", "show", "default")
    assert [(r["gateway"], r["dev"]) for r in routes] == [(str(lab.ipam.gateway.ip), "eth0")]

    host_end = _ip_json("link", "show", pod.host_veth)[0]
    assert host_end["master"] == lab.net.config.bridge
    bridge_v4 = [a["local"] for a in _ip_json("addr", "show", lab.net.config.bridge)[0]["addr_info"] if a["family"] == "inet"]
    assert bridge_v4 == [str(lab.ipam.gateway.ip)]
    assert len(pod.host_veth) <= 15 and pod.host_veth.startswith(lab.net.config.prefix)


def test_the_gateway_keeps_its_mac_as_pods_come_and_go(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    # A bridge left to itself takes the lowest MAC of its ports: a pod joining with a lower one changed the
    # gateway's MAC under every other pod's ARP entry (they hear of it by one gratuitous ARP only).
    bridge = lab.net.config.bridge
    make_pod("mac")
    want = bridge_mac(bridge)
    assert _ip_json("link", "show", bridge)[0]["address"] == want
    lowest = make_pod("low")
    subprocess.run(["ip", "link", "set", lowest.host_veth, "address", "02:00:00:00:00:01"], check=True)
    assert _ip_json("link", "show", bridge)[0]["address"] == want
    lab.net.delete_pod(lowest.name)
    assert _ip_json("link", "show", bridge)[0]["address"] == want


@pytest.mark.parametrize(
    ("uid", "gid", "ids", "groups"),
    [(2102, None, "2102 2102", "2102"), (2102, 3000, "2102 3000", "3000"), (None, None, "0 0", None)],
)
def test_spawn_runs_inside_the_pod_as_the_given_user(
    make_pod: Callable[..., PodNet], lab: netlab.Lab, uid: int | None, gid: int | None, ids: str, groups: str | None
) -> None:
    pod = make_pod("user")
    script = "echo $(id -u) $(id -g); id -G; ip -j -4 addr show dev eth0"
    proc = lab.net.spawn(pod.name, ["bash", "-c", script], uid=uid, gid=gid, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=netlab.DEADLINE_S)
    got_ids, got_groups, addresses = out.split("\n", 2)
    assert got_ids == ids
    if groups is not None:
        assert got_groups == groups  # supplementary groups dropped
    assert json.loads(addresses)[0]["addr_info"][0]["local"] == str(pod.address.ip)


def test_delete_pod_kills_its_processes_and_removes_its_links(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    pod = make_pod("gone")
    proc = lab.net.spawn(pod.name, ["sleep", "1000"])
    assert {pod.netns, pod.host_veth} <= netlab.names_with(lab.net.config.prefix)

    lab.net.delete_pod(pod.name)

    assert proc.wait(timeout=netlab.DEADLINE_S) == -9
    assert not {pod.netns, pod.host_veth} & netlab.names_with(lab.net.config.prefix)
    assert pod.name not in lab.net.pods()
    lab.net.delete_pod(pod.name)  # deleting again is a no-op


def test_failed_create_leaves_nothing(lab: netlab.Lab) -> None:
    lab.net.ensure_bridge(lab.ipam.gateway)
    address = ipaddress.IPv4Interface("10.198.7.2/24")
    with pytest.raises(CommandError, match="route add default via 10.198.8.1"):
        lab.net.create_pod("broken", address, ipaddress.IPv4Address("10.198.8.1"))
    assert not {lab.net.netns_name("broken"), lab.net.veth_name("broken")} & netlab.names_with(lab.net.config.prefix)


def test_duplicate_pod_is_refused(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    pod = make_pod("dup")
    with pytest.raises(LocalNetError, match=f"network namespace {pod.netns} already exists"):
        lab.net.create_pod(pod.name, pod.address, lab.ipam.gateway.ip)


def test_pods_lists_what_another_instance_made(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    pod = make_pod("seen")
    assert pod.name in HostNet(lab.net.config).pods()


def test_pod_range_overlapping_a_host_route_is_refused(lab: netlab.Lab) -> None:
    host_routes = [r for r in _ip_json("route", "show") if r["dst"] != "default" and r.get("dev") != lab.net.config.bridge]
    if not host_routes:
        pytest.skip("the host has no route to overlap")
    network = ipaddress.ip_network(host_routes[0]["dst"], strict=False)
    clash = ipaddress.IPv4Interface(f"{network.network_address}/{network.prefixlen}")
    before = netlab.names_with(lab.net.config.prefix)
    with pytest.raises(LocalNetError, match=f"overlaps host route {host_routes[0]['dst']}"):
        lab.net.ensure_bridge(clash)
    assert netlab.names_with(lab.net.config.prefix) == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"prefix": "Bad!"}, "prefix"), ({"prefix": "x"}, "prefix"), ({"prefix": "waytoolong1"}, "prefix"), ({"bridge": "b" * 16}, "bridge")],
)
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        NetnsConfig(**kwargs)


def test_bad_pod_name_is_refused(lab: netlab.Lab) -> None:
    with pytest.raises(ValueError, match="^pod: 'Web_1'"):
        lab.net.create_pod("Web_1", ipaddress.IPv4Interface("10.198.7.2/24"), ipaddress.IPv4Address("10.198.7.1"))


def test_teardown_all_removes_every_namespace_link_rule_and_process(make_pod: Callable[..., PodNet], lab: netlab.Lab) -> None:
    prefix = lab.net.config.prefix
    host_nat_before = netlab.host_nat()
    host_devices = {link["ifname"] for link in _ip_json("-d", "link", "show") if "linkinfo" not in link}
    pods = [make_pod("td"), make_pod("td")]
    apply_rules(ProxyInitConfig(), pods[0].netns)
    proc = lab.net.spawn(pods[1].name, ["sleep", "1000"], uid=2102)
    made = netlab.names_with(prefix)
    assert {lab.net.config.bridge, *(p.netns for p in pods), *(p.host_veth for p in pods)} <= made

    lab.net.teardown_all()

    assert proc.wait(timeout=netlab.DEADLINE_S) == -9
    assert netlab.names_with(prefix) == set()
    assert lab.net.pods() == []
    assert netlab.host_nat() == host_nat_before
    assert host_devices <= {link["ifname"] for link in _ip_json("link", "show")}  # lo, eth0... untouched
