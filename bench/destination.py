"""Destination benchmark: endpoint propagation, from the store write that makes a pod ready to every stream.

``python -m bench destination [-- --streams N --rounds R --small-only|--large-only ...]`` (about a minute).

The destination runs as its own process (``tether destination serve`` over TLS,
on a store in a temp dir); this process is every client and the writer.  Each
round writes one pod's readiness (ready, then unready, alternately) to the
store, with its Service's EndpointSlices as the local platform's EndpointSlice
controller (``tether platform run``) would write them -- the destination reads
slices, and that controller is not part of what is measured -- and stamps the
time just before the write; every subscribed stream
stamps the time its diff arrives (``time.monotonic`` is system-wide, so the
stamps compare across processes).  Printed per case: p50 and p99 of the
per-stream delay, p50 and p99 of the per-round time until the *last* stream
had it, the destination's own delivery-lag p99 (from its ``/metrics``), and
the destination process's RSS (now and peak).

Cases: 1 service x 1,000 streams, and 1,000 services x 10 endpoints x 5,000
streams (5 per service, rounds spread over the services).  Both sides share this machine's cores, so client-side reading
time is included in the figures.  Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from rich.console import Console
from rich.table import Table

from bench.dataplane.procs import stop_process
from bench.dataplane.procstat import MIB, cpu_seconds, peak_rss_bytes, rss_bytes
from tether.api import destination_pb2
from tether.naming import control_plane_identity
from tether.platform.local.endpointslices import desired_slices
from tether.store import Store

NS = "bench"
GET = "/io.linkerd.proxy.destination.Destination/Get"
SERVER_NAME = control_plane_identity("destination").dns_name


# -- set-up --------------------------------------------------------------------------------------------


def _pki(directory: Path) -> tuple[Path, Path, Path]:
    """(ca, cert, key): a root and the destination's serving certificate, as files."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    root = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root.linkerd.cluster.local")])
    ca = (x509.CertificateBuilder().subject_name(root).issuer_name(root).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "linkerd-destination")]))
            .issuer_name(root).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = directory / "ca.crt", directory / "dst.crt", directory / "dst.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def _service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def _pod(app: str, index: int, ip: str, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{app}-{index}", "namespace": NS,
                     "labels": {"app": app, "pod-template-hash": "7f9c6", "linkerd.io/control-plane-ns": "linkerd"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-7f9c6",
                                          "controller": True}]},
        "spec": {"serviceAccountName": app, "containers": [
            {"name": "linkerd-proxy", "image": "proxy", "ports": [{"name": "linkerd-proxy", "containerPort": 4143}]},
            {"name": app, "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _ip(service: int, index: int) -> str:
    return f"10.{service // 250}.{service % 250}.{index + 1}"


@dataclass
class Destination:
    proc: subprocess.Popen[bytes]
    port: int
    admin_port: int
    log: Path

    def rss_mb(self) -> tuple[float, float]:
        """(current, peak) resident set size of the destination process, MiB."""
        return rss_bytes(self.proc.pid) / MIB, peak_rss_bytes(self.proc.pid) / MIB

    def lag_p99(self) -> float | None:
        """The destination's own p99 delivery lag (event seen -> stream write), from its histogram."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        buckets = [(float("inf") if le == "+Inf" else float(le), float(count)) for le, count in re.findall(
            r'destination_delivery_lag_seconds_bucket\{kind="endpoints",le="([^"]+)"\} (\S+)', text)]
        if not buckets or buckets[-1][1] == 0:
            return None
        total = buckets[-1][1]
        return next(le for le, count in buckets if count >= 0.99 * total)

    def cpu_seconds(self) -> float:
        """CPU time (user + system, every thread) the destination process has used so far."""
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc, 30)


def _start_destination(tmp: Path, store_path: Path, cert: Path, key: Path) -> Destination:
    log = tmp / "destination.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from tether.cli.main import main; main()", "destination", "serve",
             "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--store", str(store_path),
             "--tls-cert", str(cert), "--tls-key", str(key)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 300
    while (match := re.search(r"serving gRPC on port (\d+), admin on port (\d+)", log.read_text())) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"the destination exited: {log.read_text()}")
        if time.monotonic() > deadline:
            stop_process(proc, 30)
            raise RuntimeError("the destination did not start in time")
        time.sleep(0.05)
    return Destination(proc, int(match[1]), int(match[2]), log)


# -- measuring -----------------------------------------------------------------------------------------------


class Subscribers:
    """Many ``Get`` streams spread over a few channels; records when each receives a message."""

    def __init__(self, ca: Path, port: int, channels: int) -> None:
        credentials = grpc.ssl_channel_credentials(ca.read_bytes())
        options = [("grpc.ssl_target_name_override", SERVER_NAME), ("grpc.use_local_subchannel_pool", 1),
                   ("grpc.max_receive_message_length", 64 << 20)]
        self.channels = [grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options)
                         for _ in range(channels)]
        self.received: dict[int, float] = {}
        self.counts: list[int] = []
        self._target = 0
        self._reached = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.groups: dict[str, list[int]] = {}

    def open(self, authority: str, count: int) -> None:
        request = destination_pb2.GetDestination(scheme="k8s", path=authority).SerializeToString()
        ids = self.groups.setdefault(authority, [])
        for _ in range(count):
            stream_id = len(self.counts)
            self.counts.append(0)
            ids.append(stream_id)
            channel = self.channels[stream_id % len(self.channels)]
            call = channel.unary_stream(GET, request_serializer=None, response_deserializer=None)(request)
            self._tasks.append(asyncio.create_task(self._read(stream_id, call)))

    async def _read(self, stream_id: int, call: Any) -> None:
        async for _ in call:
            self.received[stream_id] = time.monotonic()
            self.counts[stream_id] += 1
            if len(self.received) >= self._target:
                self._reached.set()

    async def wait(self, expected: int, timeout: float) -> None:
        """Wait until ``expected`` streams have received since the last ``reset``."""
        self._target = expected
        if len(self.received) < expected:
            await asyncio.wait_for(self._reached.wait(), timeout)

    def reset(self) -> None:
        self.received = {}
        self._reached = asyncio.Event()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


@dataclass
class Result:
    case: str
    streams: int
    rounds: int
    per_stream: list[float]
    per_round: list[float]
    server_lag_p99: float | None
    server_cpu_ms: float  # destination CPU per measured round
    client_cpu_ms: float  # this process's CPU per measured round (every stream's reading, the store write)
    rss_now: float
    rss_peak: float
    setup_s: float


def _progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Cluster:
    """The Services and pods written so far, to write each change with its Service's EndpointSlices."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, dict[str, Any]]] = {}  # by Service, then pod name

    def add(self, service: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``service``, ``pods`` and the service's slices, to store."""
        name = service["metadata"]["name"]
        self.services[name] = service
        self.pods[name] = {pod["metadata"]["name"]: pod for pod in pods}
        return [service, *pods, *desired_slices(service, pods)]

    def put(self, app: str, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """``pod`` (new or changed) and its Service's slices as they become, to store."""
        self.pods[app][pod["metadata"]["name"]] = pod
        return [pod, *desired_slices(self.services[app], self.pods[app].values())]


async def _rounds(store: Store, cluster: Cluster, subscribers: Subscribers, targets: list[tuple[str, int, str]],
                  rounds: int, streams_per_round: int,
                  destination: Destination) -> tuple[list[float], list[float], float, float]:
    """Flip one pod per round (service chosen round-robin over ``targets``) and time the diffs.

    Returns the per-stream and per-round delays, and the destination's and this process's CPU
    milliseconds per measured round.
    """
    per_stream: list[float] = []
    per_round: list[float] = []
    ready = {t[0]: False for t in targets}
    server_cpu = client_cpu = 0.0
    for round_ in range(rounds + 2):  # two warm-up rounds, not counted
        app, index, ip = targets[round_ % len(targets)]
        ready[app] = not ready[app]
        subscribers.reset()
        await asyncio.sleep(0.05)  # let the previous round's stragglers settle
        server_before, client_before = destination.cpu_seconds(), time.process_time()
        start = time.monotonic()
        store.apply_many(cluster.put(app, _pod(app, index, ip, ready[app])))
        await subscribers.wait(streams_per_round, timeout=60)
        if round_ < 2:
            continue
        server_cpu += destination.cpu_seconds() - server_before
        client_cpu += time.process_time() - client_before
        delays = [at - start for at in subscribers.received.values()]
        per_stream.extend(delays)
        per_round.append(max(delays))
    return per_stream, per_round, server_cpu / rounds * 1e3, client_cpu / rounds * 1e3


async def _case(tmp: Path, services: int, pods: int, streams: int, rounds: int, channels: int,
                pki: tuple[Path, Path, Path]) -> Result:
    ca, cert, key = pki
    store_path = tmp / f"store-{services}.db"
    store = Store(store_path)
    begin = time.monotonic()
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
    cluster = Cluster()
    for s in range(services):
        objects += cluster.add(_service(f"svc-{s}"), [_pod(f"svc-{s}", i, _ip(s, i), True) for i in range(pods)])
    for chunk in range(0, len(objects), 2000):
        store.apply_many(objects[chunk:chunk + 2000])
    _progress(f"stored {len(objects):,} objects in {time.monotonic() - begin:.1f}s")
    destination = _start_destination(tmp, store_path, cert, key)
    _progress(f"destination synced and serving after {time.monotonic() - begin:.1f}s")
    subscribers = Subscribers(ca, destination.port, channels)
    try:
        per_service = max(1, streams // services)
        for s in range(services):
            subscribers.open(f"svc-{s}.{NS}.svc.cluster.local:80", per_service)
        await subscribers.wait(per_service * services, timeout=600)  # every snapshot arrived
        setup = time.monotonic() - begin
        _progress(f"{per_service * services:,} streams have their snapshot after {setup:.1f}s")
        # The flapping pod of each service is an extra one (index ``pods``), so snapshots stay as set up.
        targets = [(f"svc-{s}", pods, _ip(s, pods)) for s in random.Random(7).sample(range(services),
                                                                                     min(services, rounds))]
        per_stream, per_round, server_cpu, client_cpu = await _rounds(
            store, cluster, subscribers, targets, rounds, per_service, destination
        )
        rss_now, rss_peak = destination.rss_mb()
        lag = destination.lag_p99()
    finally:
        await subscribers.close()
        destination.stop()
        store.close()
    return Result(f"{services} service(s) x {pods} endpoints", per_service * services, rounds, per_stream,
                  per_round, lag, server_cpu, client_cpu, rss_now, rss_peak, setup)


def _print(results: list[Result]) -> None:
    table = Table(title="destination: endpoint propagation (store write -> diff on every subscribed stream)")
    for column in ("case", "streams", "rounds", "stream p50", "stream p99", "last p50", "last p99",
                   "server lag p99", "CPU/round server, client", "RSS now / peak", "setup"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in results:
        table.add_row(
            r.case.replace("service(s)", "svc"), f"{r.streams:,}", str(r.rounds),
            f"{_pct(r.per_stream, 0.5) * 1e3:.1f} ms", f"{_pct(r.per_stream, 0.99) * 1e3:.1f} ms",
            f"{_pct(r.per_round, 0.5) * 1e3:.1f} ms", f"{_pct(r.per_round, 0.99) * 1e3:.1f} ms",
            "-" if r.server_lag_p99 is None else f"≤{r.server_lag_p99 * 1e3:g} ms",
            f"{r.server_cpu_ms:.1f}, {r.client_cpu_ms:.1f} ms",
            f"{r.rss_now:.0f} / {r.rss_peak:.0f} MiB", f"{r.setup_s:.1f} s",
        )
    console = Console(width=max(140, shutil.get_terminal_size().columns))
    console.print(table)
    console.print("stream: the delay until each subscribed stream had the diff; last: until the last one of the "
                  "round had it; server lag: the destination's own histogram bucket (event seen -> write done).")
    console.print(f"{os.cpu_count()} CPUs shared by the destination process and this client process "
                    "(all streams and the store writer); on a busy machine the delays grow, the CPU per round "
                    "does not.")


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench destination")
    parser.add_argument("--streams", type=int, default=1000, help="streams of the small case (one service)")
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds per case")
    parser.add_argument("--channels", type=int, default=20, help="client connections the streams share")
    parser.add_argument("--small-only", action="store_true", help="only 1 service x --streams streams")
    parser.add_argument("--large-only", action="store_true", help="only 1,000 services x 10 endpoints x 5,000 streams")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="tether-bench-destination-") as tmp_dir:
        tmp = Path(tmp_dir)
        pki = _pki(tmp)
        if not args.large_only:
            results.append(asyncio.run(_case(tmp, 1, 10, args.streams, args.rounds, args.channels, pki)))
        if not args.small_only:
            results.append(asyncio.run(_case(tmp, 1000, 10, 5000, args.rounds, max(args.channels, 50), pki)))
    _print(results)
    if args.json:
        print(json.dumps([{"case": r.case, "streams": r.streams,
                           "p50_ms": _pct(r.per_stream, 0.5) * 1e3, "p99_ms": _pct(r.per_stream, 0.99) * 1e3,
                           "last_p50_ms": _pct(r.per_round, 0.5) * 1e3, "last_p99_ms": _pct(r.per_round, 0.99) * 1e3,
                           "server_cpu_ms_per_round": r.server_cpu_ms, "client_cpu_ms_per_round": r.client_cpu_ms,
                           "rss_mib": r.rss_now, "rss_peak_mib": r.rss_peak} for r in results]))


if __name__ == "__main__":
    run(sys.argv[1:])
