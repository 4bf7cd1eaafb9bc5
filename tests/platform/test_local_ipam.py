"""ipam.Ipam: deterministic, round-robin, persistent, safe across processes, clear when exhausted."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tether.platform.local.ipam import (
    DEFAULT_POD_CIDR,
    AddressTaken,
    Ipam,
    IpamConfig,
    IpamError,
    PoolExhausted,
    workload_owner,
)


def _ipam(path: Path, cidr: str = "10.9.0.0/29") -> Ipam:
    return Ipam(IpamConfig(state_dir=path, pod_cidr=ipaddress.IPv4Network(cidr)))


def _ips(ipam: Ipam, *owners: str) -> list[str]:
    return [str(ipam.allocate(owner)) for owner in owners]


def test_default_range_and_gateway(tmp_path: Path) -> None:
    ipam = Ipam(IpamConfig(state_dir=tmp_path))
    assert DEFAULT_POD_CIDR == ipaddress.IPv4Network("10.213.0.0/16")
    assert str(ipam.gateway) == "10.213.0.1/16"
    assert str(ipam.allocate("a")) == "10.213.0.2/16"


def test_hands_out_every_host_address_but_the_gateway_then_says_exhausted(tmp_path: Path) -> None:
    ipam = _ipam(tmp_path)  # /29: .0 network, .1 gateway, .7 broadcast
    assert _ips(ipam, "a", "b", "c", "d", "e") == [f"10.9.0.{n}/29" for n in range(2, 7)]
    with pytest.raises(PoolExhausted, match=r"pod range 10\.9\.0\.0/29 is exhausted: all 5 pod addresses are in use"):
        ipam.allocate("f")


def test_same_owner_same_address(tmp_path: Path) -> None:
    ipam = _ipam(tmp_path)
    assert _ips(ipam, "a", "a", "b", "a") == ["10.9.0.2/29", "10.9.0.2/29", "10.9.0.3/29", "10.9.0.2/29"]


def test_release_frees_and_reuse_is_round_robin(tmp_path: Path) -> None:
    ipam = _ipam(tmp_path)
    _ips(ipam, "a", "b", "c")
    assert str(ipam.release("b")) == "10.9.0.3/29"
    assert ipam.release("b") is None
    assert _ips(ipam, "d", "e", "f") == ["10.9.0.5/29", "10.9.0.6/29", "10.9.0.3/29"]  # .3 only after wrapping
    assert {owner: str(ip) for owner, ip in ipam.allocations().items()} == {
        "a": "10.9.0.2/29",
        "f": "10.9.0.3/29",
        "c": "10.9.0.4/29",
        "d": "10.9.0.5/29",
        "e": "10.9.0.6/29",
    }


def test_a_reserved_address_is_never_handed_to_a_pod(tmp_path: Path) -> None:
    ipam = _ipam(tmp_path)  # /29: pods get .2 to .6
    vm = workload_owner("billing", "vm-1")
    assert ipam.reserve(vm, "10.9.0.3") is True
    assert ipam.reserve(vm, "10.9.0.3") is True  # again: unchanged
    assert _ips(ipam, "a", "b", "c", "d") == ["10.9.0.2/29", "10.9.0.4/29", "10.9.0.5/29", "10.9.0.6/29"]
    with pytest.raises(PoolExhausted):
        ipam.allocate("e")
    assert ipam.reserve(vm, "192.168.50.10") is False  # outside the range: nothing to hold ...
    assert str(ipam.allocations()[vm]) == "10.9.0.3/29"  # ... and the held one is the caller's to release
    ipam.release(vm)
    assert str(ipam.allocate("e")) == "10.9.0.3/29"


def test_a_reservation_moves_and_a_taken_address_is_refused_by_its_holder(tmp_path: Path) -> None:
    ipam = _ipam(tmp_path)
    vm, other = workload_owner("billing", "vm-1"), workload_owner("billing", "vm-2")
    assert _ips(ipam, "web/web-0") == ["10.9.0.2/29"]
    with pytest.raises(AddressTaken, match=r"^10\.9\.0\.2 is the address of pod web/web-0$") as taken:
        ipam.reserve(vm, "10.9.0.2")
    assert taken.value.holder == "web/web-0"
    with pytest.raises(AddressTaken, match=r"10\.9\.0\.1 is the address of the platform's gateway"):
        ipam.reserve(vm, "10.9.0.1")
    ipam.reserve(vm, "10.9.0.5")
    ipam.reserve(vm, "10.9.0.6")  # moved: .5 is free again
    with pytest.raises(AddressTaken, match=r"10\.9\.0\.6 is the address of ExternalWorkload billing/vm-1"):
        ipam.reserve(other, "10.9.0.6")
    assert {o: str(a.ip) for o, a in ipam.allocations().items()} == {"web/web-0": "10.9.0.2", vm: "10.9.0.6"}


def test_state_survives_a_new_instance(tmp_path: Path) -> None:
    _ips(_ipam(tmp_path), "a", "b")
    again = _ipam(tmp_path)
    assert _ips(again, "b", "c") == ["10.9.0.3/29", "10.9.0.4/29"]


def test_changing_the_range_with_addresses_in_use_is_refused(tmp_path: Path) -> None:
    _ips(_ipam(tmp_path), "a")
    with pytest.raises(IpamError, match=r"^pod_cidr: .* holds addresses from 10\.9\.0\.0/29, not 10\.8\.0\.0/24"):
        _ipam(tmp_path, "10.8.0.0/24")


def test_changing_the_range_when_empty_is_allowed(tmp_path: Path) -> None:
    first = _ipam(tmp_path)
    first.allocate("a")
    first.release("a")
    assert _ips(_ipam(tmp_path, "10.8.0.0/24"), "a") == ["10.8.0.2/24"]


@pytest.mark.parametrize("cidr", ["10.9.0.0/31", "10.9.0.0/32"])
def test_too_small_range_is_refused(tmp_path: Path, cidr: str) -> None:
    with pytest.raises(IpamError, match=f"^pod_cidr: {cidr} is too small"):
        _ipam(tmp_path, cidr)


WORKER = """
import ipaddress, json, sys
from pathlib import Path
from tether.platform.local.ipam import Ipam, IpamConfig
ipam = Ipam(IpamConfig(state_dir=Path(sys.argv[1]), pod_cidr=ipaddress.IPv4Network("10.9.0.0/24")))
print(json.dumps([str(ipam.allocate(f"{sys.argv[2]}-{n}")) for n in range(25)]))
"""


def test_concurrent_processes_never_share_an_address(tmp_path: Path) -> None:
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), f"w{n}"], stdout=subprocess.PIPE, text=True)
        for n in range(8)
    ]
    handed_out = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        handed_out += json.loads(out)
    assert len(handed_out) == 200
    assert len(set(handed_out)) == 200
    assert set(handed_out) == {f"10.9.0.{n}/24" for n in range(2, 202)}
    assert len(_ipam(tmp_path, "10.9.0.0/24").allocations()) == 200
