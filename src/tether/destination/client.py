"""A debugging client of the Destination API: open the real streams and read what a proxy would receive.

Used by ``tether diagnostics endpoints|profile`` (and the tests and benchmark).
It connects like a proxy (TLS, verifying the destination's identity), sends
``GetDestination`` and turns the messages into plain dictionaries that say
everything the proxy would act on.  gRPC errors are raised as ``DestinationError``
carrying the status code, so callers can tell "unknown service" (NOT_FOUND)
from "no endpoints" (a ``no_endpoints`` message with ``exists`` true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from tether.api import destination_pb2 as pb
from tether.api import destination_pb2_grpc, http_types_pb2
from tether.api.addresses import from_tcp_address
from tether.serving.channel import ClientTls, open_channel, read_messages

__all__ = ["ClientTls", "open_channel"]  # re-exported: the CLI and tests reach them through here


class DestinationError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _addr(message: Any) -> str:
    ip, port = from_tcp_address(message)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def weighted_addr_dict(addr: pb.WeightedAddr) -> dict[str, Any]:
    """One endpoint as the proxy would use it."""
    out: dict[str, Any] = {"addr": _addr(addr.addr), "weight": addr.weight, "metric_labels": dict(addr.metric_labels)}
    if addr.HasField("tls_identity"):
        identity = addr.tls_identity
        kind = identity.WhichOneof("strategy")
        dns_like = kind == "dns_like_identity"
        out["tls_identity"] = identity.dns_like_identity.name if dns_like else identity.uri_like_identity.uri
        if identity.HasField("server_name"):
            out["server_name"] = identity.server_name.name
    if addr.HasField("protocol_hint"):
        hint = addr.protocol_hint
        out["protocol_hint"] = hint.WhichOneof("protocol") or "unknown"
        if hint.HasField("opaque_transport"):
            out["opaque_transport_port"] = hint.opaque_transport.inbound_port
    if addr.HasField("authority_override"):
        out["authority_override"] = addr.authority_override.authority_override
    if addr.HasField("http2"):
        keep_alive = addr.http2.keep_alive
        out["http2"] = {
            "keep_alive_interval_s": keep_alive.interval.ToTimedelta().total_seconds(),
            "keep_alive_timeout_s": keep_alive.timeout.ToTimedelta().total_seconds(),
            "keep_alive_while_idle": keep_alive.while_idle,
        }
    if addr.HasField("resource_ref") and addr.resource_ref.HasField("resource"):
        resource = addr.resource_ref.resource
        out["resource"] = {"kind": resource.kind, "namespace": resource.namespace, "name": resource.name}
    return out


def update_dict(update: pb.Update) -> dict[str, Any]:
    """One ``Get`` message: ``{"add": {...}}``, ``{"remove": [...]}`` or ``{"no_endpoints": {"exists": ...}}``."""
    kind = update.WhichOneof("update")
    if kind == "add":
        return {"add": {"metric_labels": dict(update.add.metric_labels),
                        "addrs": [weighted_addr_dict(a) for a in update.add.addrs]}}
    if kind == "remove":
        return {"remove": [_addr(a) for a in update.remove.addrs]}
    if kind == "no_endpoints":
        return {"no_endpoints": {"exists": update.no_endpoints.exists}}
    return {}


def _request_match(match: pb.RequestMatch) -> Any:
    kind = match.WhichOneof("match")
    if kind in ("all", "any"):
        return {kind: [_request_match(m) for m in getattr(match, kind).matches]}
    if kind == "not":
        return {"not": _request_match(getattr(match, "not"))}
    if kind == "path":
        return {"path_regex": match.path.regex}
    if kind == "method":
        method = match.method
        name = (http_types_pb2.HttpMethod.Registered.Name(method.registered)
                if method.WhichOneof("type") == "registered" else method.unregistered)
        return {"method": name}
    return {}


def _response_match(match: pb.ResponseMatch) -> Any:
    kind = match.WhichOneof("match")
    if kind in ("all", "any"):
        return {kind: [_response_match(m) for m in getattr(match, kind).matches]}
    if kind == "not":
        return {"not": _response_match(getattr(match, "not"))}
    if kind == "status":
        return {"status": {"min": match.status.min, "max": match.status.max}}
    return {}


def profile_dict(profile: pb.DestinationProfile) -> dict[str, Any]:
    """One ``GetProfile`` message, every field the proxy reads."""
    out: dict[str, Any] = {
        "fully_qualified_name": profile.fully_qualified_name,
        "opaque_protocol": profile.opaque_protocol,
        "routes": [],
        "dst_overrides": [{"authority": d.authority, "weight": d.weight} for d in profile.dst_overrides],
    }
    for route in profile.routes:
        entry: dict[str, Any] = {
            "metrics_labels": dict(route.metrics_labels),
            "condition": _request_match(route.condition),
            "response_classes": [
                {"condition": _response_match(rc.condition), "is_failure": rc.is_failure}
                for rc in route.response_classes
            ],
            "is_retryable": route.is_retryable,
        }
        if route.HasField("timeout"):
            entry["timeout_s"] = route.timeout.ToTimedelta().total_seconds()
        out["routes"].append(entry)
    if profile.HasField("retry_budget"):
        budget = profile.retry_budget
        out["retry_budget"] = {"retry_ratio": round(budget.retry_ratio, 6),
                               "min_retries_per_second": budget.min_retries_per_second,
                               "ttl_s": budget.ttl.ToTimedelta().total_seconds()}
    if profile.HasField("endpoint"):
        out["endpoint"] = weighted_addr_dict(profile.endpoint)
    for ref in ("parent_ref", "profile_ref"):
        if profile.HasField(ref) and getattr(profile, ref).HasField("resource"):
            resource = getattr(profile, ref).resource
            out[ref] = {"group": resource.group, "kind": resource.kind, "namespace": resource.namespace,
                        "name": resource.name, **({"port": resource.port} if resource.port else {})}
    return out


def _error(exc: grpc.aio.AioRpcError) -> DestinationError:
    return DestinationError(exc.code(), exc.details() or "")


async def stream_endpoints(
    channel: grpc.aio.Channel, authority: str, context_token: str = "", timeout: float | None = None
) -> AsyncIterator[pb.Update]:
    """Every ``Update`` of a ``Get`` stream; ``timeout`` bounds the wait for each message."""
    stub = destination_pb2_grpc.DestinationStub(channel)
    call = stub.Get(pb.GetDestination(scheme="k8s", path=authority, context_token=context_token))
    async for message in _messages(call, timeout):
        yield message


async def stream_profile(
    channel: grpc.aio.Channel, authority: str, context_token: str = "", timeout: float | None = None
) -> AsyncIterator[pb.DestinationProfile]:
    stub = destination_pb2_grpc.DestinationStub(channel)
    call = stub.GetProfile(pb.GetDestination(scheme="k8s", path=authority, context_token=context_token))
    async for message in _messages(call, timeout):
        yield message


async def _messages(call: Any, timeout: float | None) -> AsyncIterator[Any]:
    try:
        async for message in read_messages(call, timeout):
            yield message
    except grpc.aio.AioRpcError as exc:
        raise _error(exc) from None
