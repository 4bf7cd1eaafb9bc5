"""Gateway API route parts to their ``http_route.proto`` / ``grpc_route.proto`` messages.

One home for these rules, shared by the inbound translator and the outbound
one (``tether.policy.outbound``): host matches (suffix labels reversed), request
matches (path, headers, query parameters, method), header modifiers and
redirects, gRPC method matches.  Pure functions of the typed resource model.
"""

from __future__ import annotations

from tether.api import grpc_route_pb2 as grpc_pb
from tether.api import http_route_pb2 as http_pb
from tether.api import http_types_pb2 as types_pb
from tether.resources.routes import (
    GRPCRouteMatch,
    HeaderModifier,
    HTTPRouteMatch,
    RequestRedirect,
    ValueMatch,
)

_METHODS = set(types_pb.HttpMethod.Registered.keys())


def host_match(hostname: str) -> http_pb.HostMatch:
    """``*.example.com`` -> a suffix (labels reversed, as the proto wants), else an exact host."""
    if hostname.startswith("*."):
        return http_pb.HostMatch(suffix=http_pb.HostMatch.Suffix(reverse_labels=list(reversed(hostname[2:].split(".")))))
    return http_pb.HostMatch(exact=hostname)


def method(name: str) -> types_pb.HttpMethod:
    if name in _METHODS:
        return types_pb.HttpMethod(registered=types_pb.HttpMethod.Registered.Value(name))
    return types_pb.HttpMethod(unregistered=name)


def _header_match(match: ValueMatch) -> http_pb.HeaderMatch:
    if match.type == "RegularExpression":
        return http_pb.HeaderMatch(name=match.name, regex=match.value)
    return http_pb.HeaderMatch(name=match.name, exact=match.value.encode())


def http_match(match: HTTPRouteMatch) -> http_pb.HttpRouteMatch:
    out = http_pb.HttpRouteMatch()
    path = match.path
    if path.type == "Exact":
        out.path.exact = path.value
    elif path.type == "RegularExpression":
        out.path.regex = path.value
    else:
        out.path.prefix = path.value
    out.headers.extend(_header_match(h) for h in match.headers)
    for q in match.query_params:
        if q.type == "RegularExpression":
            out.query_params.add(name=q.name, regex=q.value)
        else:
            out.query_params.add(name=q.name, exact=q.value)
    if match.method:
        out.method.CopyFrom(method(match.method))
    return out


def _headers(pairs: tuple[tuple[str, str], ...]) -> types_pb.Headers:
    return types_pb.Headers(headers=[types_pb.Headers.Header(name=n, value=v.encode()) for n, v in pairs])


def request_header_modifier(modifier: HeaderModifier) -> http_pb.RequestHeaderModifier:
    return http_pb.RequestHeaderModifier(add=_headers(modifier.add), set=_headers(modifier.set),
                                         remove=list(modifier.remove))


def response_header_modifier(modifier: HeaderModifier) -> http_pb.ResponseHeaderModifier:
    return http_pb.ResponseHeaderModifier(add=_headers(modifier.add), set=_headers(modifier.set),
                                          remove=list(modifier.remove))


def redirect(spec: RequestRedirect) -> http_pb.RequestRedirect:
    out = http_pb.RequestRedirect(host=spec.hostname or "", port=spec.port or 0, status=spec.status_code)
    if spec.scheme is not None:
        out.scheme.registered = types_pb.Scheme.Registered.Value(spec.scheme.upper())
    if spec.path is not None:
        if spec.path.type == "ReplaceFullPath":
            out.path.full = spec.path.value
        else:
            out.path.prefix = spec.path.value
    return out


def grpc_match(match: GRPCRouteMatch) -> grpc_pb.GrpcRouteMatch:
    out = grpc_pb.GrpcRouteMatch()
    if match.method is not None:
        out.rpc.service = match.method.service or ""
        out.rpc.method = match.method.method or ""
    out.headers.extend(_header_match(h) for h in match.headers)
    return out
