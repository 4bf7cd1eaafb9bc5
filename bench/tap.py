"""What tap adds to each request a proxy carries: ``./run bench tap [-- OPTIONS]``.

The HTTP cores call ``HttpSettings.observer`` three times per request (routed,
response head, end: ``core.http.StreamObserver``); with tap enabled that is
``core.tap.TapObserver``. This times exactly those three calls, as the cores
make them -- a real ``RequestHead`` and the endpoint's rendered labels -- in
five cases side by side, best of ``--repeat`` runs of ``--requests`` each:

- ``no observer``: tap disabled (the cores test ``observer is not None``);
- ``no-op observer``: three calls that do nothing (the unit of the last column);
- ``enabled, no tap open``: the cost every request of a tap-enabled proxy pays;
- ``one tap, no match``: a tap open whose match tree (path prefix) refuses the request;
- ``one tap, matching``: every request taken (its three events built and
  buffered; the buffer is drained as the Observe stream would).

``./run bench mesh -- --variants tether-http,tether-http-tap`` measures the
first two on the whole request path (throughput, CPU, calls); docs/viz.md
has both runs' figures.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence

from tether.api import tap_pb2
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.tap import INBOUND, TapObserver, Taps, new_tap

LABELS = ('direction="inbound",target_addr="10.0.0.7:8080",target_ip="10.0.0.7",target_port="8080",tls="true",'
          'client_id="web.emojivoto.serviceaccount.identity.linkerd.cluster.local",srv_kind="default",'
          'srv_name="all-unauthenticated"')
HEAD = RequestHead(b"GET", b"/api/list", ((b"host", b"web.emojivoto.svc.cluster.local:80"),
                                          (b"user-agent", b"vote-bot"), (b"accept", b"*/*")))
CLIENT = ("10.0.0.5", 41234)
RESPONSE = ((b"content-type", b"application/json"), (b"content-length", b"2"))
M = tap_pb2.ObserveRequest.Match


def _requests(observer: TapObserver | _NoopObserver | None, taps: Taps, n: int) -> float:
    """Seconds for ``n`` requests' three observer calls (draining what taps buffered, as Observe would)."""
    stream = object()
    start = time.perf_counter()
    for _ in range(n):
        if observer is not None:
            observer.request(stream, HEAD, LABELS, CLIENT)
        if observer is not None:
            observer.response(stream, 200, RESPONSE)
        if observer is not None:
            observer.end(stream, 200, None)
        for tap in taps.taps:
            tap.events.clear()
    return time.perf_counter() - start


class _NoopObserver:
    """The hook's three calls doing nothing: what any observer costs before it does any work."""

    def request(self, stream: object, request: RequestHead, labels: str, client: tuple[str, int] | None) -> None:
        return None

    def response(self, stream: object, status: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        return None

    def end(self, stream: object, status: int | None, error: object, grpc_status: int | None = None) -> None:
        return None


def _setup(name: str) -> tuple[TapObserver | _NoopObserver | None, Taps]:
    taps = Taps(base=1)
    if name == "no observer":
        return None, taps
    if name == "no-op observer":
        return _NoopObserver(), taps
    if name != "enabled, no tap open":
        prefix = "/nothing" if name == "one tap, no match" else "/api"
        taps.add(new_tap(tap_pb2.ObserveRequest(limit=2**31 - 1, match=M(http=M.Http(
            path=M.Http.StringMatch(prefix=prefix)))), lambda: None))
    return TapObserver(taps, INBOUND, time.monotonic), taps


CASES = ("no observer", "no-op observer", "enabled, no tap open", "one tap, no match", "one tap, matching")


def measure(requests: int, repeat: int) -> dict[str, float]:
    """Seconds per request of each case: runs interleaved, in rotated order, the best of ``repeat`` each."""
    state = {name: _setup(name) for name in CASES}
    best = dict.fromkeys(CASES, float("inf"))
    for r in range(repeat):
        for name in CASES[r % len(CASES):] + CASES[:r % len(CASES)]:
            gc.collect()
            gc.disable()  # as timeit does: one case's garbage must not be collected on another's time
            try:
                took = _requests(*state[name], requests)
            finally:
                gc.enable()
            best[name] = min(best[name], took)
    return {name: seconds / requests for name, seconds in best.items()}


def render(per_request: dict[str, float]) -> str:
    """Each case, and what it adds over no observer in units of the no-op observer's three calls (a shared
    machine's load scales every figure alike; the ratio holds)."""
    lines = ["| case | ns / request | added over no observer | added, in no-op hook calls (3 per request) |",
             "| --- | ---: | ---: | ---: |"]
    base = per_request["no observer"]
    unit = (per_request["no-op observer"] - base) / 3
    for name in CASES:
        added = per_request[name] - base
        lines.append(f"| {name} | {per_request[name] * 1e9:,.0f} | {added * 1e9:,.0f} ns | {added / unit:,.1f} |")
    return "\n".join(lines)


def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="./run bench tap --", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    ap.add_argument("--repeat", type=int, default=10, help="runs per case; the best counts (default 10)")
    args = ap.parse_args(argv)
    print(render(measure(args.requests, args.repeat)))

