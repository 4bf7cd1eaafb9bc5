"""Policy controller benchmark: from a policy change to the update on 1,000 watch streams; memory at scale.

``python -m bench policy [-- --pods 1000 --rounds 20 --channels 20]`` (a minute or two).

The controller runs as its own process (``tether policy serve`` over TLS, on a
store in a temp dir); this process holds every stream and writes the store.
The cluster: ``pods`` meshed pods in namespaces of 10; in each namespace 10
Servers (ports 8000-8009, selecting that namespace's pods) and 10
AuthorizationPolicies per Server (so ``pods`` x 10 Servers x 10 policies seen
from the pods; 100 policies per namespace), each policy requiring one shared
MeshTLSAuthentication of namespace ``bench-shared``.  One WatchPort stream per
pod and port, on ports 8000 up (``--ports``, 1 by default).  With ``--change
authn`` (the default) each round rewrites the shared MeshTLSAuthentication's
identities (alternately), which changes the policy of every watched port; with
``--change policy`` it rewrites one AuthorizationPolicy of ``srv-0`` in every
namespace (naming, alternately, a second shared MeshTLSAuthentication), which
changes port 8000's policy only: the other watched ports' answers cannot change,
and the controller's CPU per round shows what deciding them would cost.  With
``--change route`` the cluster is outbound instead: in each namespace 10
Services (``svc-0``..``svc-9``, port 80), each with one accepted HTTPRoute (its
status as the status controller writes it), and one OutboundPolicies ``Watch``
stream per Service from a client of its namespace (``pods`` streams); each
round rewrites ``svc-0``'s route in every namespace (its backend's weight,
alternately), which changes ``svc-0``'s policy only.  The
time from just before the store write to each changed stream's message is
recorded (``time.monotonic`` is system-wide).  Printed: p50/p99 per stream,
p50/p99 until the last stream had it, the controller's CPU per round and its
RSS after the streams opened (and peak).  Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.dataplane.procs import stop_process
from bench.dataplane.procstat import MIB, cpu_seconds, peak_rss_bytes, rss_bytes
from tether.api import inbound_pb2, outbound_pb2
from tether.identity import pem, pki
from tether.identity.ca import CertificateAuthority, IssuanceSettings, Issuer
from tether.naming import control_plane_identity
from tether.store import Store

WATCH = "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort"
OUTBOUND_WATCH = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch"
SERVER_IDENTITY = control_plane_identity("destination")
SHARED = "bench-shared"
P = "policy.linkerd.io"


def _pki(directory: Path) -> tuple[Path, Path, Path]:
    now = dt.datetime.now(dt.timezone.utc)
    anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                 valid_for=dt.timedelta(days=1), now=now)
    issuer_cert, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                                trust_domain="cluster.local", valid_for=dt.timedelta(days=1), now=now)
    issuer = Issuer.validated([issuer_cert], issuer_key, [anchor])
    key = pki.new_key()
    leaf = CertificateAuthority(issuer, IssuanceSettings()).issue(key.public_key(), SERVER_IDENTITY, now)
    paths = directory / "ca.crt", directory / "policy.crt", directory / "policy.key"
    pem.write_file(paths[0], pem.certificate_pem(anchor), private=False)
    pem.write_file(paths[1], pem.certificate_pem(leaf, *issuer.intermediates), private=False)
    pem.write_file(paths[2], pem.private_key_pem(key), private=True)
    return paths


def _objects(pods: int, change: str) -> list[dict[str, Any]]:
    if change == "route":
        return _outbound_objects(pods)
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SHARED}},
                                     _shared_authn(0)]
    if change == "policy":
        objects.append(_shared_authn(1, "clients-b"))
    for n in range(max(1, pods // 10)):
        ns = f"bench-{n}"
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(10):
            objects.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"pod-{i}", "namespace": ns, "labels": {"app": "bench", "linkerd.io/control-plane-ns": "linkerd"}},
                "spec": {"containers": [{"name": "app", "image": "x",
                                         "ports": [{"name": f"p{p}", "containerPort": 8000 + p} for p in range(10)]}]},
                "status": {"phase": "Running", "podIP": f"10.{n // 250}.{n % 250}.{i + 1}"}})
        for s in range(10):
            objects.append({"apiVersion": f"{P}/v1beta3", "kind": "Server", "metadata": {"name": f"srv-{s}",
                                                                                        "namespace": ns},
                            "spec": {"podSelector": {"matchLabels": {"app": "bench"}}, "port": 8000 + s}})
            objects += [_policy(ns, s, a, "clients") for a in range(10)]
    return objects


def _outbound_objects(pods: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for n in range(max(1, pods // 10)):
        ns = f"bench-{n}"
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(10):
            objects.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": ns},
                            "spec": {"clusterIP": f"10.{96 + n // 250}.{n % 250}.{i + 1}",
                                     "ports": [{"name": "http", "port": 80}], "selector": {"app": f"svc-{i}"}}})
            objects.append(_route(ns, i, 1))
    return objects


def _route(ns: str, service: int, weight: int) -> dict[str, Any]:
    """``svc-N``'s HTTPRoute to itself, with the status the controller writes (so it applies, and the status
    loop has nothing to write)."""
    name = f"svc-{service}"
    accepted = [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
                {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": ""}]
    return {"apiVersion": f"{P}/v1beta3", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": name, "port": 80}],
                     "rules": [{"backendRefs": [{"name": name, "port": 80, "weight": weight}]}]},
            "status": {"parents": [{"parentRef": {"group": "core", "kind": "Service", "namespace": ns, "name": name,
                                                  "port": 80},
                                    "controllerName": "linkerd.io/policy-controller", "conditions": accepted}]}}


def _policy(ns: str, server: int, n: int, authn: str) -> dict[str, Any]:
    return {"apiVersion": f"{P}/v1alpha1", "kind": "AuthorizationPolicy",
            "metadata": {"name": f"srv-{server}-authz-{n}", "namespace": ns},
            "spec": {"targetRef": {"group": P, "kind": "Server", "name": f"srv-{server}"},
                     "requiredAuthenticationRefs": [{"group": P, "kind": "MeshTLSAuthentication",
                                                     "name": authn, "namespace": SHARED}]}}


def _shared_authn(round_: int, name: str = "clients") -> dict[str, Any]:
    identities = [f"client-{round_ % 2}.{SHARED}.serviceaccount.identity.linkerd.cluster.local"]
    return {"apiVersion": f"{P}/v1alpha1", "kind": "MeshTLSAuthentication",
            "metadata": {"name": name, "namespace": SHARED}, "spec": {"identities": identities}}


def _round_change(change: str, round_: int, pods: int) -> list[dict[str, Any]]:
    """What one round writes: the shared authentication, srv-0's first policy or svc-0's route in every
    namespace."""
    if change == "authn":
        return [_shared_authn(round_)]
    if change == "route":
        return [_route(f"bench-{n}", 0, 1 + round_ % 2) for n in range(max(1, pods // 10))]
    authn = "clients-b" if round_ % 2 else "clients"
    return [_policy(f"bench-{n}", 0, 0, authn) for n in range(max(1, pods // 10))]


class Controller:
    def __init__(self, tmp: Path, store: Path, ca: Path, cert: Path, key: Path) -> None:
        self.log = tmp / "policy.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from tether.cli.main import main; main()", "policy", "serve",
                 "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--store", str(store),
                 "--tls-cert", str(cert), "--tls-key", str(key), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT)

    def wait_serving(self) -> None:
        """Until both ports listen: the gRPC port opens only once the index has synced."""
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the controller did not start in time")
            ports = _listening_ports(self.proc.pid)
            if len(ports) >= 2:
                return
            time.sleep(0.2)

    def rss_mb(self) -> tuple[float, float]:
        """(current, peak) resident set size of the controller process, MiB."""
        return rss_bytes(self.proc.pid) / MIB, peak_rss_bytes(self.proc.pid) / MIB

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc, 30)


def _listening_ports(pid: int) -> list[int]:
    """The TCP ports ``pid`` listens on (from /proc: no log parsing at warning level)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("tcp", "tcp6"):  # gRPC core may bind 127.0.0.1 as a v4-mapped IPv6 socket
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _measure(ca: Path, ports: list[int], pods: int, rounds: int, channels: int, store: Store,
                   controller: Controller, watched_ports: int, change: str) -> dict[str, Any]:
    credentials = grpc.ssl_channel_credentials(ca.read_bytes())
    options = [("grpc.ssl_target_name_override", SERVER_IDENTITY.dns_name)]
    port = await _grpc_port(ports, credentials, options)
    chans = [grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) for _ in range(channels)]
    received: dict[int, float] = {}
    expected = [0]
    reached = asyncio.Event()

    async def read(stream_id: int, call: Any) -> None:
        async for _ in call:
            received[stream_id] = time.monotonic()
            if len(received) >= expected[0]:
                reached.set()

    tasks = []
    requests = _watch_requests(pods, watched_ports, change)
    streams = len(requests)
    for stream_id, (method, request) in enumerate(requests):
        call = chans[stream_id % channels].unary_stream(method, request_serializer=None, response_deserializer=None)(
            request)
        tasks.append(asyncio.create_task(read(stream_id, call)))
    expected[0] = streams
    await asyncio.wait_for(reached.wait(), 300)
    # The streams each round changes: every one for the shared authentication, port 8000's for srv-0's policy,
    # svc-0's for its route.
    changing = streams if change == "authn" else streams // (10 if change == "route" else watched_ports)
    rss_streams = controller.rss_mb()
    per_stream: list[float] = []
    per_round: list[float] = []
    cpu_before = controller.cpu_seconds()
    expected[0] = changing
    for round_ in range(1, rounds + 1):
        received.clear()
        reached.clear()
        started = time.monotonic()
        await asyncio.to_thread(store.apply_many, _round_change(change, round_, pods))
        await asyncio.wait_for(reached.wait(), 120)
        delays = [t - started for t in received.values()]
        per_stream += delays
        per_round.append(max(delays))
    cpu = (controller.cpu_seconds() - cpu_before) / rounds
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for chan in chans:
        await chan.close()
    return {"streams": streams, "changed_streams": changing, "rounds": rounds, "stream_p50_ms": _pct(per_stream, 0.5) * 1000,
            "stream_p99_ms": _pct(per_stream, 0.99) * 1000, "last_stream_p50_ms": _pct(per_round, 0.5) * 1000,
            "last_stream_p99_ms": _pct(per_round, 0.99) * 1000, "controller_cpu_ms_per_round": cpu * 1000,
            "rss_mib": rss_streams[0], "rss_peak_mib": controller.rss_mb()[1]}


def _watch_requests(pods: int, watched_ports: int, change: str) -> list[tuple[str, bytes]]:
    """(method, serialised request) of every stream: WatchPort per pod and port, or Watch per Service."""
    out = []
    for pod_id in range(max(1, pods // 10) * 10):
        n, i = divmod(pod_id, 10)
        if change == "route":
            spec = outbound_pb2.TrafficSpec(source_workload=json.dumps({"ns": f"bench-{n}", "pod": "client"}),
                                            authority=f"svc-{i}.bench-{n}.svc.cluster.local:80")
            out.append((OUTBOUND_WATCH, spec.SerializeToString()))
            continue
        for port_offset in range(watched_ports):
            port_spec = inbound_pb2.PortSpec(workload=json.dumps({"ns": f"bench-{n}", "pod": f"pod-{i}"}),
                                             port=8000 + port_offset)
            out.append((WATCH, port_spec.SerializeToString()))
    return out


async def _grpc_port(ports: list[int], credentials: grpc.ChannelCredentials, options: list[Any]) -> int:
    """Which of the controller's two listening ports speaks gRPC (the other is the admin port)."""
    for port in sorted(ports):
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as chan:
            try:
                await asyncio.wait_for(chan.channel_ready(), 5)
                return port
            except (TimeoutError, grpc.aio.AioRpcError):
                continue
    raise RuntimeError(f"no gRPC port among {ports}")


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench policy")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--ports", type=int, default=1, choices=range(1, 11), metavar="1-10",
                        help="watched ports per pod (8000 up)")
    parser.add_argument("--change", choices=("authn", "policy", "route"), default="authn",
                        help="each round: the shared authentication (every port), srv-0's policy (port 8000), or "
                             "svc-0's HTTPRoute (outbound: one Watch per Service)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp_text:
        tmp = Path(tmp_text)
        ca, cert, key = _pki(tmp)
        store_path = tmp / "store.db"
        objects = _objects(args.pods, args.change)
        with Store(store_path) as store:
            for start in range(0, len(objects), 2000):
                store.apply_many(objects[start:start + 2000])
            print(f"  .. {len(objects)} objects stored", file=sys.stderr, flush=True)
            setup = time.monotonic()
            controller = Controller(tmp, store_path, ca, cert, key)
            try:
                controller.wait_serving()
                ports = _listening_ports(controller.proc.pid)
                idle_rss = controller.rss_mb()[0]
                startup = time.monotonic() - setup
                result = asyncio.run(_measure(ca, ports, args.pods, args.rounds, args.channels, store, controller,
                                              args.ports, args.change))
            finally:
                controller.stop()
    result.update(objects=len(objects), startup_s=startup, rss_idle_mib=idle_rss)
    cluster = (f"{max(1, args.pods // 10) * 10} Services with an HTTPRoute each" if args.change == "route" else
               f"{args.pods} pods x 10 Servers x 10 AuthorizationPolicies")
    print(f"objects {len(objects)} ({cluster}), controller ready in {startup:.1f} s, RSS {idle_rss:.0f} MiB "
          "before streams")
    what = {"authn": "one shared MeshTLSAuthentication change", "policy": "srv-0's policy changed",
            "route": "svc-0's route changed"}[args.change]
    kind = "Watch" if args.change == "route" else "WatchPort"
    print(f"{result['streams']} {kind} streams ({result['changed_streams']} changed per round), "
          f"{result['rounds']} rounds of {what}:")
    print(f"  per stream p50 {result['stream_p50_ms']:.0f} ms, p99 {result['stream_p99_ms']:.0f} ms; "
          f"last stream p50 {result['last_stream_p50_ms']:.0f} ms, p99 {result['last_stream_p99_ms']:.0f} ms")
    print(f"  controller CPU {result['controller_cpu_ms_per_round']:.0f} ms per round; "
          f"RSS {result['rss_mib']:.0f} MiB with the streams open (peak {result['rss_peak_mib']:.0f} MiB)")
    print(json.dumps(result))
