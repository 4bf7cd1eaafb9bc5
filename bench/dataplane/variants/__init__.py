"""The paths under test. A variant is a small declarative class; the registry is ``VARIANTS``.

Every variant is *load generator -> [client-side proxy -> mTLS -> server-side
proxy ->] nginx backend*. A variant says how to start its proxies (``plan``:
one ``ProxySpec`` per proxy, with its command line and config files) and which
address the load goes to (``Plan.entry``); the harness starts, pins, measures
and stops them. Optionally it checks, after the run, that the comparison was
fair (``verify``: TLS version, connection reuse...).

A variant's ``load`` says what goes through it: HTTP/1.1 (wrk and the
open-loop generator), HTTP/2 GETs or gRPC unary calls (h2load, over h2c to
the client-side proxy; the variant ends at nginx's HTTP/2 port).

To add a variant (e.g. tether-http): write a ``Variant`` subclass in a module
here, with ``name``, ``description``, ``available()`` and ``plan()``, then add
it to ``VARIANTS`` below. See docs/benchmarks.md.
"""

from __future__ import annotations

from bench.dataplane.variants.base import LOADS, Check, Context, Plan, ProxySpec, Variant
from bench.dataplane.variants.direct import Direct, DirectGrpc, DirectH2
from bench.dataplane.variants.envoy import Envoy, EnvoyGrpc, EnvoyH2
from bench.dataplane.variants.haproxy import HAProxyGrpc, HAProxyH2, HAProxyHTTP, HAProxyTCP
from bench.dataplane.variants.tether import (
    TetherGrpc,
    TetherH2,
    TetherHTTP,
    TetherHTTPNoUpgrade,
    TetherHTTPPolicy,
    TetherHTTPTap,
    TetherHTTPTapped,
    TetherHTTPTappedAll,
    TetherTCP,
)

# Order matters only for display; measurements are interleaved and rotated.
VARIANTS: dict[str, type[Variant]] = {
    v.name: v for v in (Direct, Envoy, HAProxyHTTP, HAProxyTCP, TetherHTTP, TetherHTTPNoUpgrade, TetherHTTPTap, TetherHTTPTapped, TetherHTTPTappedAll,
                        TetherHTTPPolicy, TetherTCP,
                        DirectH2, EnvoyH2, HAProxyH2, TetherH2,
                        DirectGrpc, EnvoyGrpc, HAProxyGrpc, TetherGrpc)
}

__all__ = ["LOADS", "VARIANTS", "Check", "Context", "Plan", "ProxySpec", "Variant"]
