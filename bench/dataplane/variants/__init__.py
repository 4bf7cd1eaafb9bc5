"""The paths under test. A variant is a small declarative class; the registry is ``VARIANTS``.

Every variant is *load generator -> [client-side proxy -> mTLS -> server-side
proxy ->] nginx backend*. A variant says how to start its proxies (``plan``:
one ``ProxySpec`` per proxy, with its command line and config files) and which
address the load goes to (``Plan.entry``); the harness starts, pins, measures
and stops them. Optionally it checks, after the run, that the comparison was
fair (``verify``: TLS version, connection reuse...).

To add a variant (e.g. tether-http): write a ``Variant`` subclass in a module
here, with ``name``, ``description``, ``available()`` and ``plan()``, then add
it to ``VARIANTS`` below. See docs/benchmarks.md.
"""

from __future__ import annotations

from bench.dataplane.variants.base import Check, Context, Plan, ProxySpec, Variant
from bench.dataplane.variants.direct import Direct
from bench.dataplane.variants.envoy import Envoy
from bench.dataplane.variants.haproxy import HAProxyHTTP, HAProxyTCP
from bench.dataplane.variants.tether import TetherHTTP, TetherTCP

# Order matters only for display; measurements are interleaved and rotated.
VARIANTS: dict[str, type[Variant]] = {
    v.name: v for v in (Direct, Envoy, HAProxyHTTP, HAProxyTCP, TetherHTTP, TetherTCP)
}

__all__ = ["VARIANTS", "Check", "Context", "Plan", "ProxySpec", "Variant"]
