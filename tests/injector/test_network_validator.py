"""``tether network-validator`` inside network namespaces this test makes, never in the host's.

Each namespace is sealed: ``lo`` plus, where a route is wanted, a veth pair whose *both* ends
stay inside the namespace (default route via one end, the other has no address and forwarding
is off), so a connection to 1.1.1.1 can at most reach ARP on that pair; nothing leaves the
machine even if a rule were missing.  With proxy-init's nat rules the connection is redirected
to the validator's own listener on 4140.  Namespaces are named ``tv<pid hex>-...``; each is
removed by its own finalizer, and the session first removes those of test runs that are gone.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from executables import TETHER

from tether.cli.network_validator import UNSUCCESSFUL_EXIT_CODE, network_validator
from tether.injector import MeshConfig, inject
from tether.platform.local.firewall import apply_rules
from tether.platform.local.network_validator import SocketAddr, ValidationFailed, validate
from tether.platform.local.proxy_init import ProxyInitConfig

from .helpers import ANCHOR_FILE, deployment

DEADLINE_S = 30.0
PREFIX = f"tv{os.getpid():x}"
_OURS = re.compile(r"^tv([0-9a-f]+)-")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_numbers = itertools.count()

CAN_NETNS = os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("iptables"))


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _netns_names() -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return [entry["name"] for entry in json.loads(out or "[]")]


def _delete(netns: str) -> None:
    if netns not in _netns_names():
        return
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    ip("netns", "del", netns)


@pytest.fixture(scope="session", autouse=True)
def _remove_dead_runs() -> None:
    if not CAN_NETNS:
        return
    for name in _netns_names():
        match = _OURS.match(name)
        if match and not Path(f"/proc/{int(match.group(1), 16)}").exists():
            _delete(name)


@pytest.fixture
def make_netns(request: pytest.FixtureRequest) -> Callable[..., str]:
    """A sealed namespace; ``route`` adds the in-namespace veth pair and a default route over it."""
    if not CAN_NETNS:
        pytest.skip("needs root, iproute2 and iptables")

    def make(name: str, *, route: bool, rules: ProxyInitConfig | None = None) -> str:
        netns = f"{PREFIX}-{name}{next(_numbers)}"
        ip("netns", "add", netns)
        request.addfinalizer(lambda: _delete(netns))
        ip("-n", netns, "link", "set", "lo", "up")
        if route:
            ip("-n", netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            ip("-n", netns, "addr", "add", "10.254.0.1/24", "dev", "v0")
            ip("-n", netns, "link", "set", "v0", "up")
            ip("-n", netns, "link", "set", "v1", "up")
            ip("-n", netns, "route", "add", "default", "dev", "v0")
        links = subprocess.run(["ip", "-n", netns, "-j", "link", "show"], check=True, capture_output=True, text=True).stdout
        assert {link["ifname"] for link in json.loads(links)} <= {"lo", "v0", "v1"}  # nothing reaches the host
        if rules is not None:
            apply_rules(rules, netns)
        return netns

    return make


def run_validator(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", netns, TETHER, "network-validator", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S)


@pytest.fixture(scope="module")
def rendered_args() -> list[str]:
    """The CNI-mode init container's arguments, exactly as the injector renders them."""
    config = MeshConfig(trust_anchors_pem=ANCHOR_FILE.read_text(), cni_enabled=True)
    result = inject(deployment(), {"linkerd.io/inject": "enabled"}, config)
    spec = result.obj["spec"]["template"]["spec"]
    validator = next(c for c in spec["initContainers"] if c["name"] == "linkerd-network-validator")
    assert validator["command"] == ["tether", "network-validator"]
    network_validator.make_context("network-validator", list(validator["args"]))  # the flags parse
    return list(validator["args"])


PROXY_INIT = ProxyInitConfig(ipv6=False)


def test_redirected_connection_lands_on_the_listener(make_netns: Callable[..., str], rendered_args: list[str]) -> None:
    assert "1.1.1.1:20001" in rendered_args and "0.0.0.0:4140" in rendered_args
    netns = make_netns("redir", route=True, rules=PROXY_INIT)
    done = run_validator(netns, *rendered_args)
    assert done.returncode == 0, done.stderr
    assert "Listening for connections on 0.0.0.0:4140" in done.stderr
    assert "Connecting to 1.1.1.1:20001" in done.stderr
    assert "Accepted connection from" in done.stderr  # --log-level debug, as rendered
    assert done.stderr.rstrip().endswith("Validated")


def test_no_rules_and_no_route_fails_with_a_clear_message(make_netns: Callable[..., str], rendered_args: list[str]) -> None:
    netns = make_netns("noroute", route=False)
    done = run_validator(netns, *rendered_args)
    assert done.returncode == UNSUCCESSFUL_EXIT_CODE
    assert "ERROR network_validator: cannot connect to 1.1.1.1:20001: Network is unreachable" in done.stderr
    assert "iptables redirection (CNI plugin or proxy-init) is not in place" in done.stderr
    assert "Validated" not in done.stderr


def test_no_rules_times_out_with_a_clear_message(make_netns: Callable[..., str]) -> None:
    netns = make_netns("norules", route=True)
    done = run_validator(netns, "--connect-addr", "1.1.1.1:20001", "--timeout", "500ms", "--log-format", "json")
    assert done.returncode == UNSUCCESSFUL_EXIT_CODE
    last = json.loads(done.stderr.splitlines()[-1])
    assert last["level"] == "ERROR"
    assert last["fields"]["message"].startswith("failed to validate networking configuration within 0.5s")
    assert "neither established nor refused" in last["fields"]["message"]


def test_rules_to_another_port_are_refused(make_netns: Callable[..., str]) -> None:
    netns = make_netns("wrongport", route=True, rules=PROXY_INIT)
    done = run_validator(netns, "--connect-addr", "1.1.1.1:20001", "--listen-addr", "0.0.0.0:4141", "--timeout", "10s")
    assert done.returncode == UNSUCCESSFUL_EXIT_CODE
    assert "cannot connect to 1.1.1.1:20001: Connection refused; the connection was not redirected to 0.0.0.0:4141" in done.stderr


# --- the check in-process, still inside a namespace: sockets are made on this thread after setns ---


@contextmanager
def in_netns(netns: str) -> Iterator[None]:
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            if _libc.setns(home, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(target)
        os.close(home)


def test_direct_connection_to_the_listener_validates(make_netns: Callable[..., str]) -> None:
    netns = make_netns("direct", route=False)
    with in_netns(netns):
        validate(SocketAddr.parse("127.0.0.1:4140"), SocketAddr.parse("127.0.0.1:4140"), 5.0)


def test_someone_else_answering_is_not_validation(make_netns: Callable[..., str]) -> None:
    netns = make_netns("decoy", route=False)
    with in_netns(netns):
        decoy = socket.create_server(("127.0.0.1", 20001))
    accepted: list[Any] = []

    def answer() -> None:
        conn, _ = decoy.accept()
        with conn:
            conn.sendall(b"hello from somebody else\n" + b"x" * 64)
            accepted.append(True)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with in_netns(netns), pytest.raises(ValidationFailed, match="reached something other than this validator"):
            validate(SocketAddr.parse("127.0.0.1:4140"), SocketAddr.parse("127.0.0.1:20001"), 5.0)
    finally:
        decoy.close()
        thread.join(DEADLINE_S)
    assert accepted == [True]


def test_listen_address_in_use_is_reported(make_netns: Callable[..., str]) -> None:
    netns = make_netns("busy", route=False)
    with in_netns(netns):
        busy = socket.create_server(("127.0.0.1", 4140), reuse_port=False)
    try:
        with in_netns(netns), pytest.raises(ValidationFailed, match="cannot listen on 127.0.0.1:4140: Address already in use"):
            validate(SocketAddr.parse("127.0.0.1:4140"), SocketAddr.parse("127.0.0.1:4140"), 5.0)
    finally:
        busy.close()


@pytest.mark.parametrize(
    ("text", "family", "shown"),
    [
        ("1.1.1.1:20001", socket.AF_INET, "1.1.1.1:20001"),
        ("[fd00::1]:20001", socket.AF_INET6, "[fd00::1]:20001"),
        ("[::]:4140", socket.AF_INET6, "[::]:4140"),
    ],
)
def test_socket_addresses(text: str, family: socket.AddressFamily, shown: str) -> None:
    addr = SocketAddr.parse(text)
    assert (addr.family, str(addr)) == (family, shown)


@pytest.mark.parametrize("text", ["1.1.1.1", "fd00::1:20001", "[1.1.1.1]:1", "example.com:80", "1.1.1.1:70000", ":4140"])
def test_bad_socket_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="socket address"):
        SocketAddr.parse(text)
