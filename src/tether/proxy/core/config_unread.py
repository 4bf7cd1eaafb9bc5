"""What the proxy says of the variables it was given and does not read.

``ProxyConfig.from_env`` records every variable it reads; each other
``LINKERD2_PROXY_*`` or ``TETHER_PROXY_*`` variable in the environment is
either one that linkerd2-proxy 2.20 reads and this proxy does not apply
(``NOT_APPLIED``: warned at start with the reason) or one that no proxy
reads (warned as unknown: a misspelt name would otherwise be ignored in
silence). Linkerd's chart sets a few that linkerd2-proxy itself declares and
never reads (``NOT_READ_BY_LINKERD``): those take effect elsewhere, or
nowhere in Linkerd either, and are not warned about.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

_TRACING = "spans are not exported (this proxy has no tracing)"
_CORES = "the proxy runs one event loop on one thread whatever the cores"
_DNS = "control-plane names are resolved by the system resolver at each connect: there are no cached TTLs to clamp"

# Read by linkerd2-proxy 2.20 (../shared/reference/proxy.md §2), not applied here: the reason, as the warning says it.
NOT_APPLIED: dict[str, str] = {
    "LINKERD2_PROXY_CORES": _CORES,
    "LINKERD2_PROXY_CORES_MIN": _CORES,
    "LINKERD2_PROXY_CORES_MAX": _CORES,
    "LINKERD2_PROXY_CORES_MAX_RATIO": _CORES,
    "LINKERD2_PROXY_DNS_MIN_TTL": _DNS,
    "LINKERD2_PROXY_DNS_MAX_TTL": _DNS,
    "LINKERD2_PROXY_INBOUND_GATEWAY_SUFFIXES": "this proxy is not a multicluster gateway",
    "LINKERD2_PROXY_TRACE_COLLECTOR_SVC_ADDR": _TRACING,
    "LINKERD2_PROXY_TRACE_COLLECTOR_SVC_NAME": _TRACING,
    "LINKERD2_PROXY_TRACE_SERVICE_NAME": _TRACING,
    "LINKERD2_PROXY_TRACE_EXTRA_ATTRIBUTES": _TRACING,
    "LINKERD2_PROXY_TRACE_ATTRIBUTES_PATH": _TRACING,
}

# Set by Linkerd's chart, declared and never read by linkerd2-proxy (reference §2.5, §2.8): the require-identity and
# require-TLS ports are applied by the policy controller from the pod's annotations, the trace settings nowhere.
NOT_READ_BY_LINKERD = frozenset({
    "LINKERD2_PROXY_INBOUND_PORTS_REQUIRE_IDENTITY",
    "LINKERD2_PROXY_INBOUND_PORTS_REQUIRE_TLS",
    "LINKERD2_PROXY_TRACE_PROTOCOL",
    "LINKERD2_PROXY_TRACE_ANNOTATIONS_PATH",
})

# One core is what the proxy does: the chart's LINKERD2_PROXY_CORES_MIN=1 (on every proxy) asks for nothing else.
_ONE_CORE = frozenset({"LINKERD2_PROXY_CORES", "LINKERD2_PROXY_CORES_MIN", "LINKERD2_PROXY_CORES_MAX"})

_PREFIXES = ("LINKERD2_PROXY_", "TETHER_PROXY_")


def unread_warnings(env: Mapping[str, str], read: Collection[str]) -> tuple[str, ...]:
    """A warning for each proxy variable in ``env`` that was not ``read``, naming it, in name order."""
    warnings = []
    for var in sorted(env):
        if not var.startswith(_PREFIXES) or var in read or var in NOT_READ_BY_LINKERD:
            continue
        if var in _ONE_CORE and env[var].strip() == "1":
            continue
        reason = NOT_APPLIED.get(var)
        if reason is not None:
            warnings.append(f"{var}={env[var]!r} is not applied: {reason}")
        else:
            warnings.append(f"{var} is not a variable this proxy knows: ignored (misspelt?)")
    return tuple(warnings)
