"""Meshed pods on the local platform: the proxy beside the app, as the pod's own uid, traffic through it.

Runs only once the proxy exists (``tether.proxy.main`` importable); until then it is skipped.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
import socket
import subprocess
import sys
import threading

import pytest

from up import uplab
from up.uplab import client, wait_for, web_server

from tether.platform.local import config as platform_config
from tether.platform.local.containers import build_env
from tether.platform.local.sandbox import POD_UID_BASE

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: meshed, annotations: {linkerd.io/inject: enabled}}
"""


def test_meshed_pods_talk_through_their_proxies(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web", "meshed", 1))
    (server,) = p.ready_pods("meshed", 1, "web-")
    init = [c["name"] for c in server["spec"]["initContainers"]]
    assert init == ["linkerd-init", "linkerd-proxy"]
    assert server["metadata"]["labels"]["linkerd.io/control-plane-ns"] == "linkerd"
    proxy = server["spec"]["initContainers"][1]
    env = build_env(server, proxy, {})  # the injector's $(_pod_sa).$(_pod_ns)... as the platform expands it
    assert env["LINKERD2_PROXY_IDENTITY_LOCAL_NAME"] == "default.meshed.serviceaccount.identity.linkerd.cluster.local"
    assert proxy["securityContext"]["runAsUser"] == 2102

    # The proxy's uid 2102 is, on the host, a uid of this pod alone; the redirect rules are proxy-init's for it.
    netns = p.netns_of(server)
    server_uid = _host_uid(p, server)
    nat = subprocess.run(["ip", "netns", "exec", netns, "iptables", "-t", "nat", "-S"], capture_output=True,
                         text=True).stdout
    assert f"--uid-owner {server_uid}" in nat and "--to-ports 4140" in nat and "--to-ports 4143" in nat
    assert server_uid in _uids(netns)

    p.apply(client("client", "meshed", "http://web.meshed.svc.cluster.local/"))
    (caller,) = p.ready_pods("meshed", 1, "client-")
    name = caller["metadata"]["name"]
    wait_for("answers through both proxies",
             lambda: p.logs("meshed", name).count("ok 200") >= 3, timeout=45)
    proxy_log = p.tether("logs", "-n", "meshed", name, "-c", "proxy").stdout
    assert re.search(r"certified as default\.meshed\.serviceaccount", proxy_log), proxy_log

    # One pod cannot take another's identity (#19 item 2): running as the client pod's proxy uid, inside
    # the client pod, nothing of the server pod's proxy can be read: its token, key directory, or process.
    caller_uid, caller_netns = _host_uid(p, caller), p.netns_of(caller)
    assert caller_uid != server_uid and caller_uid in _uids(caller_netns)
    config = platform_config.load(p.home)
    assert config is not None
    layout = config.layout.pod_run_dir("meshed", server["metadata"]["name"])
    server_proxy = next(pid for pid in _pids(netns) if _uid(pid) == server_uid)
    targets = [layout / "identity-token", layout / "identity", f"/proc/{server_proxy}/environ",
               f"/proc/{server_proxy}/root/", f"/proc/{server_proxy}/mem"]
    for target in targets:
        as_caller = _read_as(caller_netns, caller_uid, str(target))
        assert as_caller.returncode != 0 and "Permission denied" in as_caller.stderr, (target, as_caller)
    as_owner = _read_as(netns, server_uid, str(layout / "identity-token"))  # the control: its own proxy can
    assert as_owner.returncode == 0 and as_owner.stdout.startswith("eyJ"), as_owner  # a JWT


def _pids(netns: str) -> list[int]:
    return [int(x) for x in subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()]


def _uid(pid: int) -> int:
    return int(open(f"/proc/{pid}/status").read().split("Uid:")[1].split()[0])


def _uids(netns: str) -> set[int]:
    return {_uid(pid) for pid in _pids(netns)}


def _host_uid(p: uplab.Platform, pod: dict) -> int:
    """The host uid of the pod's proxy: the local platform's base plus the pod address's index in the range."""
    index = int(ipaddress.ip_address(pod["status"]["podIP"])) - int(ipaddress.ip_network(p.pod_cidr).network_address)
    return POD_UID_BASE + index


def _read_as(netns: str, uid: int, path: str) -> subprocess.CompletedProcess:
    """Read ``path`` (a file, or list a directory) from inside ``netns`` as ``uid``."""
    code = "import os,sys; p=sys.argv[1]; print(os.listdir(p) if os.path.isdir(p) else open(p).read(64))"
    argv = ["ip", "netns", "exec", netns, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            sys.executable, "-c", code, path]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_an_unmeshed_pod_reaches_a_meshed_one(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web2", "meshed", 1))
    p.ready_pods("meshed", 1, "web2-")
    p.apply(client("plain", "outside", "http://web2.meshed.svc.cluster.local/"))
    (caller,) = p.ready_pods("outside", 1, "plain-")
    assert "initContainers" not in caller["spec"]
    name = caller["metadata"]["name"]
    wait_for("answers from the meshed server",
             lambda: p.logs("outside", name).count("ok 200") >= 3, timeout=45)


def _capture_on(prefix: str, stop: threading.Event, frames: list[tuple[str, bytes]]) -> None:
    """Collect IPv4 frames seen on this run's host-side veths (and bridge) until ``stop``."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
    sock.settimeout(0.1)
    with sock:
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(65535)
            except TimeoutError:
                continue
            if addr[0].startswith(prefix) and data[12:14] == b"\x08\x00":
                frames.append((socket.inet_ntoa(data[26:30]), data))


def test_a_capture_between_pods_shows_no_readable_payload_between_meshed_pods(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web3", "meshed", 1))
    p.ready_pods("meshed", 1, "web3-")
    frames: list[tuple[str, bytes]] = []
    stop = threading.Event()
    capture = threading.Thread(target=_capture_on, args=(p.prefix, stop, frames), daemon=True)
    capture.start()
    try:
        p.apply(client("sealed", "meshed", "http://web3.meshed.svc.cluster.local/"))
        p.apply(client("open", "outside", "http://web3.meshed.svc.cluster.local/"))
        (sealed,) = p.ready_pods("meshed", 1, "sealed-")
        (open_,) = p.ready_pods("outside", 1, "open-")
        for pod in (sealed, open_):
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            wait_for(f"{name} gets answers", lambda: p.logs(ns, name).count("ok 200") >= 5,
                     timeout=45)
    finally:
        stop.set()
        capture.join()
    marker = b"Python-urllib"  # the User-Agent both clients' requests carry
    sealed_frames = [f for src, f in frames if src == sealed["status"]["podIP"]]
    open_frames = [f for src, f in frames if src == open_["status"]["podIP"]]
    # The control: the unmeshed client's plaintext is readable on the wire, so the capture works.
    assert any(marker in f for f in open_frames)
    # The meshed client's bytes crossed the wire (TLS application-data records), never in clear.
    assert any(b"\x17\x03\x03" in f for f in sealed_frames)
    assert not any(marker in f for f in sealed_frames)


def test_the_destination_answers_only_clients_with_a_mesh_certificate(running: uplab.Platform) -> None:
    """#19 item 3: without a certificate issued under the trust anchor, no stream opens; proxies present theirs."""
    p = running
    config = platform_config.load(p.home)
    assert config is not None
    pki_dir = p.home / "pki"
    ask = ["diagnostics", "endpoints", "kubernetes.default.svc.cluster.local:443",
           "--destination-addr", config.address(config.ports.destination), "--trust-anchors", str(pki_dir / "ca.crt")]
    anonymous = p.tether(*ask, ok=False)
    assert "cannot reach the destination" in anonymous.stderr, anonymous.stderr
    foreign = pki_dir.parent / "foreign"  # a certificate from another trust anchor is refused too
    p.tether("identity", "create-trust-anchor", "--out", str(foreign))
    assert "cannot reach the destination" in p.tether(
        *ask, "--tls-cert", str(foreign / "ca.crt"), "--tls-key", str(foreign / "ca.key"), ok=False).stderr
    member = p.tether(*ask, "--tls-cert", str(pki_dir / "cli.crt"), "--tls-key", str(pki_dir / "cli.key"), ok=None)
    assert "cannot reach the destination" not in member.stderr, member.stderr
