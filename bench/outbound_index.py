"""The outbound policy index's cost per change, side by side: recomputing what a change can affect vs everything.

``./run bench outbound_index [-- --namespaces 100 --services 10 --rounds 200]`` (a few seconds).

In one process (no gRPC, no store): ``namespaces`` x ``services`` Services,
each with two HTTPRoutes (weighted backends, a retry annotation), one watch per
Service port from its own namespace plus one consumer-namespace watch per
namespace.  Each round rewrites one route (alternating its weights) and
flushes; measured per round, with ``time.perf_counter``: the index as it runs
(only the watches the change reaches are recomputed) and, side by side,
the same change with every watch marked for recomputation (what the index did
before it tracked what a change reaches).  Also: the cost of encoding one policy, and the
index's Python heap (tracemalloc) with every watch open.  Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from typing import Any

from rich.console import Console
from rich.table import Table

from tether.platform.watch import ResourceEvent
from tether.policy import PolicyConfig
from tether.policy.outbound import OutboundIndex
from tether.policy.outbound.translator import encode

ROUTE_KEY = "HTTPRoute.policy.linkerd.io"


def _event(obj: dict[str, Any]) -> ResourceEvent:
    return ResourceEvent("ADDED", obj, "1", time.monotonic())


def _service(ns: str, i: int, n: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"svc-{i}", "namespace": ns,
                         "annotations": {"retry.linkerd.io/http": "5xx", "retry.linkerd.io/limit": "2"}},
            "spec": {"clusterIP": f"10.{96 + n // 250}.{n % 250}.{i + 1}", "ports": [{"name": "http", "port": 80}],
                     "selector": {"app": f"svc-{i}"}}}


def _route(ns: str, i: int, j: int, weight: int) -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute",
            "metadata": {"name": f"route-{i}-{j}", "namespace": ns},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": f"svc-{i}", "port": 80}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": f"/v{j}"}}],
                                "backendRefs": [{"name": f"svc-{i}", "port": 80, "weight": weight},
                                                {"name": f"svc-{(i + 1) % 10}", "port": 80, "weight": 1}]}]}}


def _build(namespaces: int, services: int) -> tuple[OutboundIndex, list[str]]:
    index = OutboundIndex(PolicyConfig())
    names = [f"ns-{n}" for n in range(namespaces)]
    for n, ns in enumerate(names):
        for i in range(services):
            index.apply("Service", _event(_service(ns, i, n)))
            for j in range(2):
                index.apply(ROUTE_KEY, _event(_route(ns, i, j, 1)))
    for n, ns in enumerate(names):
        for i in range(services):
            index.subscribe(index.service_target(f"svc-{i}.{ns}.svc.cluster.local:80", ns), lambda s, at: None)
        consumer = names[(n + 1) % len(names)]
        index.subscribe(index.service_target(f"svc-0.{ns}.svc.cluster.local:80", consumer), lambda s, at: None)
    return index, names


def _rounds(index: OutboundIndex, names: list[str], rounds: int, everything: bool) -> list[float]:
    times = []
    for r in range(rounds):
        ns = names[r % len(names)]
        route = _route(ns, r % 10, 0, 2 + r % 2)
        start = time.perf_counter()
        index.apply(ROUTE_KEY, _event(route))  # no schedule: apply flushes at once
        if everything:
            # What the index did before it tracked what changes reach: every watch recomputed on every change.
            for watch in index._watches.values():  # noqa: SLF001 - the bench compares against that on purpose
                index._marks.update(watch.reach)  # noqa: SLF001
            index.flush()
        times.append(time.perf_counter() - start)
    return times


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench outbound_index")
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--services", type=int, default=10, help="Services per namespace (at most 250)")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    tracemalloc.start()
    index, names = _build(args.namespaces, args.services)
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    targeted = _rounds(index, names, args.rounds, everything=False)
    full = _rounds(index, names, args.rounds, everything=True)
    target = index.service_target("svc-0.ns-0.svc.cluster.local:80", "ns-0")
    state = index.state(target)
    start = time.perf_counter()
    for _ in range(1000):
        encode(target, state, index.config).SerializeToString()
    encode_us = (time.perf_counter() - start) * 1e3

    table = Table(title=f"outbound index: {index.sizes()['service']} Services, {index.sizes()['route']} routes, "
                        f"{index.watched_targets} watches")
    for column in ("per change", "p50 ms", "p99 ms", "ratio (p50)"):
        table.add_column(column, justify="right")
    p50 = statistics.median(targeted)
    for label, times in (("recompute what it affects", targeted), ("recompute every watch", full)):
        ordered = sorted(times)
        table.add_row(label, f"{ordered[len(ordered) // 2] * 1e3:.3f}",
                      f"{ordered[int(len(ordered) * 0.99) - 1] * 1e3:.3f}", f"{statistics.median(times) / p50:.1f}x")
    Console().print(table)
    print(f"encode + serialise one policy: {encode_us:.1f} us; index heap with every watch open: "
          f"{heap / 2**20:.1f} MiB")
