"""Whether an inbound policy (as ``tether.policy.client.server_dict`` reads it) lets a client in.

The rules are the proxy's (proxy.md, inbound authorization): a connection is
allowed when one authorization of the Server — or, for HTTP, of one of its
routes — matches both the client's network (an address inside one of its
networks and outside their exceptions) and its authentication
(``unauthenticated``: anyone; ``mtls``: any meshed client; ``identities``: the
client's identity among the names, or under one of the suffixes, ``*`` being
any identity).  Pure.  Caller: ``tether.diagnose.layers`` (the policy layer).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any


def _in_networks(networks: Sequence[str], ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    for text in networks:
        net, _, excepted = text.partition(" except ")
        if address in ipaddress.ip_network(net, strict=False) and not any(
                address in ipaddress.ip_network(e, strict=False) for e in excepted.split(",") if e):
            return True
    return False


def _authenticated(authz: Mapping[str, Any], client_id: str) -> bool:
    kind = authz.get("authentication")
    if kind == "unauthenticated":
        return True
    if not client_id:
        return False
    if kind == "mtls":
        return True
    if client_id in authz.get("identities", ()):
        return True
    return any(s == "*" or client_id.endswith(s[1:]) for s in authz.get("suffixes", ()))


def permits(authz: Mapping[str, Any], client_id: str, client_ip: str) -> bool:
    return _in_networks(authz.get("networks", ()), client_ip) and _authenticated(authz, client_id)


def allowing(server: Mapping[str, Any], client_id: str, client_ip: str) -> list[str]:
    """The refs of the authorizations (server-wide, then per route) that let this client in; empty: denied."""
    found = [a["ref"] for a in server.get("authorizations", ()) if permits(a, client_id, client_ip)]
    for key in ("http_routes", "grpc_routes"):
        for route in server.get(key, ()):
            found += [f"{route['ref']} {a['ref']}" for a in route.get("authorizations", ())
                      if permits(a, client_id, client_ip)]
    return found
