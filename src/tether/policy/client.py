"""A debugging client of the inbound policy API, and the readable form of what a proxy receives.

``tether diagnostics policy`` (and ``tether diagnose``'s policy layer, the tests
and the benchmark) connect like a proxy (mTLS, checking the controller's
identity), ask ``GetPort``/``WatchPort`` and turn each ``Server`` message into a
plain dictionary (``server_dict``) that says everything the proxy acts on.
gRPC errors are raised as ``PolicyError`` with the status code.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tether.api import inbound_pb2 as pb
from tether.api import http_types_pb2, inbound_pb2_grpc, meta_pb2, net_pb2
from tether.api.addresses import from_ip_address
from tether.serving.channel import read_messages


class PolicyError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def workload_string(namespace: str, pod: str, *, external: bool = False) -> str:
    """The ``PortSpec.workload`` a proxy of that pod (or, ``external``, of that ExternalWorkload's VM) sends
    (JSON, as Linkerd's proxies)."""
    return json.dumps({"ns": namespace, "external_workload" if external else "pod": pod})


def _net(net: net_pb2.IPNetwork) -> str:
    return str(ipaddress.ip_network(f"{from_ip_address(net.ip)}/{net.prefix_len}", strict=False))


def _meta(meta: meta_pb2.Metadata) -> str:
    if meta.WhichOneof("kind") == "default":
        return f"default:{meta.default}"
    r = meta.resource
    return f"{r.kind}/{r.name}" if r.kind else ""


def authz_dict(authz: pb.Authz) -> dict[str, Any]:
    networks = []
    for network in authz.networks:
        text = _net(network.net)
        excluded = [_net(e) for e in getattr(network, "except")]
        networks.append(text + (f" except {','.join(excluded)}" if excluded else ""))
    out: dict[str, Any] = {"ref": _meta(authz.metadata), "networks": networks}
    permit = authz.authentication.WhichOneof("permit")
    if permit == "unauthenticated":
        out["authentication"] = "unauthenticated"
    elif authz.authentication.meshTLS.WhichOneof("clients") == "unauthenticated":
        out["authentication"] = "mtls"
    else:
        ids = authz.authentication.meshTLS.identities
        out["authentication"] = "identities"
        out["identities"] = [i.name for i in ids.identities]
        out["suffixes"] = ["*" if not s.parts else "*." + ".".join(s.parts) for s in ids.suffixes]
    return out


def _route_dict(route: pb.HttpRoute | pb.GrpcRoute, grpc_route: bool) -> dict[str, Any]:
    hosts = [h.exact if h.WhichOneof("match") == "exact" else "*." + ".".join(reversed(h.suffix.reverse_labels))
             for h in route.hosts]
    rules = []
    for rule in route.rules:
        matches = []
        for m in rule.matches:
            if grpc_route:
                matches.append({"service": m.rpc.service, "method": m.rpc.method})
            else:
                kind = m.path.WhichOneof("kind")
                entry: dict[str, Any] = {"path": f"{kind}:{getattr(m.path, kind)}" if kind else ""}
                if m.HasField("method"):
                    entry["method"] = (http_types_pb2.HttpMethod.Registered.Name(m.method.registered)
                                       if m.method.WhichOneof("type") == "registered" else m.method.unregistered)
                if m.headers:
                    entry["headers"] = [h.name for h in m.headers]
                matches.append(entry)
        rules.append({"matches": matches, "filters": [f.WhichOneof("kind") for f in rule.filters]})
    return {"ref": _meta(route.metadata), "hosts": hosts, "rules": rules,
            "authorizations": [authz_dict(a) for a in route.authorizations]}


def server_dict(server: pb.Server) -> dict[str, Any]:
    """One ``Server`` message, every field the proxy reads."""
    kind = server.protocol.WhichOneof("kind") or ""
    out: dict[str, Any] = {"labels": dict(server.labels), "protocol": kind,
                           "authorizations": [authz_dict(a) for a in server.authorizations]}
    protocol = getattr(server.protocol, kind) if kind else None
    routes: list[Any] = []
    limit = None
    if kind == "detect":
        out["detect_timeout_s"] = protocol.timeout.ToTimedelta().total_seconds()
        routes = list(protocol.http_routes)
        limit = protocol.http_local_rate_limit if protocol.HasField("http_local_rate_limit") else None
    elif kind in ("http1", "http2"):
        routes = list(protocol.routes)
        limit = protocol.local_rate_limit if protocol.HasField("local_rate_limit") else None
    elif kind == "grpc":
        out["grpc_routes"] = [_route_dict(r, True) for r in protocol.routes]
    if kind in ("detect", "http1", "http2"):
        out["http_routes"] = [_route_dict(r, False) for r in routes]
    if limit is not None:
        out["ratelimit"] = {
            "ref": _meta(limit.metadata),
            "total": limit.total.requestsPerSecond if limit.HasField("total") else None,
            "identity": limit.identity.requestsPerSecond if limit.HasField("identity") else None,
            "overrides": [{"rps": o.limit.requestsPerSecond, "identities": [i.name for i in o.clients.identities]}
                          for o in limit.overrides],
        }
    return out


async def get_port(channel: grpc.aio.Channel, workload: str, port: int, timeout: float | None = None) -> pb.Server:
    stub = inbound_pb2_grpc.InboundServerPoliciesStub(channel)
    try:
        return await stub.GetPort(pb.PortSpec(workload=workload, port=port), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise PolicyError(exc.code(), exc.details() or "") from None


async def watch_port(
    channel: grpc.aio.Channel, workload: str, port: int, timeout: float | None = None
) -> AsyncIterator[pb.Server]:
    """Every ``Server`` of a ``WatchPort`` stream; ``timeout`` bounds the wait for each message."""
    stub = inbound_pb2_grpc.InboundServerPoliciesStub(channel)
    call = stub.WatchPort(pb.PortSpec(workload=workload, port=port))
    try:
        async for message in read_messages(call, timeout):
            yield message
    except grpc.aio.AioRpcError as exc:
        raise PolicyError(exc.code(), exc.details() or "") from None


async def inbound_policy(channel: grpc.aio.Channel, namespace: str, pod: str, port: int,
                         timeout: float | None = None, *, external: bool = False) -> dict[str, Any]:
    """The inbound policy the proxy of pod ``namespace/pod`` receives for ``port``, readable (``server_dict``).

    The lookup behind ``tether diagnostics policy po/NAME PORT`` and ``tether diagnose``'s policy layer;
    raises ``PolicyError`` (``NOT_FOUND`` for a pod the controller does not know).
    """
    return server_dict(await get_port(channel, workload_string(namespace, pod, external=external), port, timeout))
