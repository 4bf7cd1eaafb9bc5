"""Meshed pods on the local platform: the proxy beside the app, as uid 2102, traffic through it.

Runs only once the proxy exists (``tether.proxy.main`` importable); until then it is skipped.
"""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import threading

import pytest

from up import uplab
from up.uplab import client, ready, wait_for, web_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: meshed, annotations: {linkerd.io/inject: enabled}}
"""


def _ready_pods(p: uplab.Platform, namespace: str, prefix: str, count: int) -> list[dict]:
    def check() -> list[dict] | None:
        pods = [x for x in p.pods(namespace) if x["metadata"]["name"].startswith(prefix)]
        return pods if len(pods) == count and all(ready(x) for x in pods) else None

    return wait_for(f"{count} ready pods {prefix}* in {namespace}", check, timeout=60)


def test_meshed_pods_talk_through_their_proxies(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web", "meshed", 1))
    (server,) = _ready_pods(p, "meshed", "web-", 1)
    init = [c["name"] for c in server["spec"]["initContainers"]]
    assert init == ["linkerd-init", "linkerd-proxy"]
    assert server["metadata"]["labels"]["linkerd.io/control-plane-ns"] == "linkerd"
    proxy = server["spec"]["initContainers"][1]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["LINKERD2_PROXY_IDENTITY_LOCAL_NAME"] == "default.meshed.serviceaccount.identity.linkerd.cluster.local"
    assert proxy["securityContext"]["runAsUser"] == 2102

    # The proxy runs as uid 2102 inside the pod; the redirect rules are proxy-init's.
    netns = p.netns_of(server)
    nat = subprocess.run(["ip", "netns", "exec", netns, "iptables", "-t", "nat", "-S"], capture_output=True,
                         text=True).stdout
    assert "--uid-owner 2102" in nat and "--to-ports 4140" in nat and "--to-ports 4143" in nat
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    uids = {int(open(f"/proc/{pid}/status").read().split("Uid:")[1].split()[0]) for pid in pids}
    assert 2102 in uids

    p.apply(client("client", "meshed", "http://web.meshed.svc.cluster.local/"))
    (caller,) = _ready_pods(p, "meshed", "client-", 1)
    name = caller["metadata"]["name"]
    wait_for("answers through both proxies",
             lambda: p.tether("logs", "-n", "meshed", name).stdout.count("ok 200") >= 3, timeout=45)
    proxy_log = p.tether("logs", "-n", "meshed", name, "-c", "proxy").stdout
    assert re.search(r"certified as default\.meshed\.serviceaccount", proxy_log), proxy_log


def test_an_unmeshed_pod_reaches_a_meshed_one(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web2", "meshed", 1))
    _ready_pods(p, "meshed", "web2-", 1)
    p.apply(client("plain", "outside", "http://web2.meshed.svc.cluster.local/"))
    (caller,) = _ready_pods(p, "outside", "plain-", 1)
    assert "initContainers" not in caller["spec"]
    name = caller["metadata"]["name"]
    wait_for("answers from the meshed server",
             lambda: p.tether("logs", "-n", "outside", name).stdout.count("ok 200") >= 3, timeout=45)


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
    _ready_pods(p, "meshed", "web3-", 1)
    frames: list[tuple[str, bytes]] = []
    stop = threading.Event()
    capture = threading.Thread(target=_capture_on, args=(p.prefix, stop, frames), daemon=True)
    capture.start()
    try:
        p.apply(client("sealed", "meshed", "http://web3.meshed.svc.cluster.local/"))
        p.apply(client("open", "outside", "http://web3.meshed.svc.cluster.local/"))
        (sealed,) = _ready_pods(p, "meshed", "sealed-", 1)
        (open_,) = _ready_pods(p, "outside", "open-", 1)
        for pod in (sealed, open_):
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            wait_for(f"{name} gets answers", lambda: p.tether("logs", "-n", ns, name).stdout.count("ok 200") >= 5,
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
