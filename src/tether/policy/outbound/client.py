"""A debugging client of ``OutboundPolicies``, and the readable form of the ``OutboundPolicy`` a proxy receives.

``tether diagnostics policy svc/NAME PORT`` asks as a proxy would (mTLS,
``TrafficSpec`` with the client's workload and the Service's authority) and
shows the answer: every field with ``policy_dict`` (``-o json``), or a summary
with ``describe`` (protocol, routes, their matches, backends and weights,
timeouts, retries, failure accrual).  gRPC errors are ``PolicyError``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from tether.api import outbound_pb2 as pb
from tether.api import http_types_pb2, outbound_pb2_grpc
from tether.api.addresses import from_tcp_address
from tether.policy.client import PolicyError
from tether.serving.channel import read_messages

CLIENT_POD = "tether-cli"  # the pod name the CLI's TrafficSpec carries; only its namespace matters


def service_request(namespace: str, service: str, port: int, client_namespace: str,
                    cluster_domain: str) -> pb.TrafficSpec:
    """What a proxy in ``client_namespace`` sends to learn the policy of ``service.namespace:port``."""
    return pb.TrafficSpec(source_workload=json.dumps({"ns": client_namespace, "pod": CLIENT_POD}),
                          authority=f"{service}.{namespace}.svc.{cluster_domain}:{port}")


async def get_outbound(channel: grpc.aio.Channel, spec: pb.TrafficSpec, timeout: float | None = None
                       ) -> pb.OutboundPolicy:
    try:
        return await outbound_pb2_grpc.OutboundPoliciesStub(channel).Get(spec, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise PolicyError(exc.code(), exc.details() or "") from None


async def watch_outbound(channel: grpc.aio.Channel, spec: pb.TrafficSpec, timeout: float | None = None
                         ) -> AsyncIterator[pb.OutboundPolicy]:
    """Every ``OutboundPolicy`` of a ``Watch`` stream; ``timeout`` bounds the wait for each message."""
    call = outbound_pb2_grpc.OutboundPoliciesStub(channel).Watch(spec)
    try:
        async for message in read_messages(call, timeout):
            yield message
    except grpc.aio.AioRpcError as exc:
        raise PolicyError(exc.code(), exc.details() or "") from None


def policy_dict(policy: pb.OutboundPolicy) -> dict[str, Any]:
    """Every field the proxy receives, as the proto names them."""
    return MessageToDict(policy, preserving_proto_field_name=True)


def _meta(meta: Any) -> str:
    if meta.WhichOneof("kind") == "default":
        return f"default:{meta.default}"
    r = meta.resource
    port = f":{r.port}" if r.port else ""
    return f"{r.kind.lower()}/{r.namespace}/{r.name}{port}"


def _seconds(duration: Any) -> str:
    return f"{duration.seconds + duration.nanos / 1e9:g}s"


def _backend(backend: pb.Backend) -> str:
    kind = backend.WhichOneof("kind")
    if kind == "balancer":
        return backend.balancer.discovery.dst.path
    if kind == "forward":
        ip, port = from_tcp_address(backend.forward.addr)
        return f"{ip}:{port} (forward)"
    return f"{_meta(backend.metadata)} (invalid)"


def _distribution(dist: Any) -> str:
    kind = dist.WhichOneof("kind")
    if kind == "first_available":
        return ", ".join(_backend(b.backend) for b in dist.first_available.backends)
    if kind == "random_available":
        return ", ".join(f"{_backend(b.backend.backend)} weight {b.weight}" for b in dist.random_available.backends)
    return "none"


def _match(match: Any) -> str:
    if not hasattr(match, "path"):  # a gRPC match
        return f"{match.rpc.service or '*'}/{match.rpc.method or '*'}"
    kind = match.path.WhichOneof("kind")
    text = f"{kind} {getattr(match.path, kind)}" if kind else "any path"
    if match.HasField("method"):
        method = match.method
        name = method.unregistered or http_types_pb2.HttpMethod.Registered.Name(method.registered)
        text = f"{name} {text}"
    return text


def _rule(rule: Any) -> list[str]:
    lines = [f"    match:    {'; '.join(_match(m) for m in rule.matches) or 'everything'}",
             f"    backends: {_distribution(rule.backends)}"]
    filters = [f.WhichOneof("kind") for f in rule.filters]
    if filters:
        lines.append(f"    filters:  {', '.join(k for k in filters if k)}")
    t = rule.timeouts
    timeouts = [f"{name} {_seconds(getattr(t, name))}" for name in ("request", "response", "idle") if t.HasField(name)]
    if timeouts:
        lines.append(f"    timeouts: {', '.join(timeouts)}")
    if rule.HasField("retry"):
        r = rule.retry
        conditions = (", ".join(f"{s.start}-{s.end}" for s in r.conditions.status_ranges)
                      if hasattr(r.conditions, "status_ranges")
                      else ", ".join(f.name for f, v in r.conditions.ListFields() if v))
        timeout = f", timeout {_seconds(r.timeout)}" if r.HasField("timeout") else ""
        lines.append(f"    retry:    up to {r.max_retries} on {conditions or 'defaults'}{timeout}")
    return lines


def describe(policy: pb.OutboundPolicy) -> list[str]:
    """A summary for people: the target, its protocol, and each route's rules."""
    protocol = policy.protocol
    kind = protocol.WhichOneof("kind") or "none"
    lines = [f"target:   {_meta(policy.metadata)}", f"protocol: {kind}"]
    sections: list[tuple[str, Any]]
    if kind == "detect":
        detect = protocol.detect
        lines[-1] += f" (timeout {_seconds(detect.timeout)})"
        sections = [("http", detect.http1), ("opaque", detect.opaque)]
    else:
        sections = [(kind, getattr(protocol, kind, None))]
    for name, section in sections:
        if section is None:
            continue
        if section.HasField("failure_accrual") if hasattr(section, "failure_accrual") else False:
            accrual = section.failure_accrual
            which = accrual.WhichOneof("kind")
            lines.append(f"failure accrual: {which} {MessageToDict(getattr(accrual, which))}")
        for route in section.routes:
            names = (*getattr(route, "hosts", ()), *getattr(route, "snis", ()))  # HTTP hosts or TLS SNI names
            hosts = [h.exact or "*." + ".".join(reversed(h.suffix.reverse_labels)) for h in names]
            lines.append(f"{name} route {_meta(route.metadata)}" + (f" hosts {', '.join(hosts)}" if hosts else ""))
            for rule in route.rules:
                if isinstance(rule, (pb.OpaqueRoute.Rule, pb.TlsRoute.Rule)):
                    filters = [f.WhichOneof("kind") for f in rule.filters]
                    lines.append(f"    backends: {_distribution(rule.backends)}"
                                 + (f" ({', '.join(k for k in filters if k)})" if filters else ""))
                else:
                    lines.extend(_rule(rule))
    return lines
