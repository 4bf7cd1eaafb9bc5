"""HTTPRoute and GRPCRoute filters, one home for both directions (``linkerd/http/route/src/{http,grpc}/filter``).

Version-agnostic: a filter works on a request's header list and its target,
whatever HTTP version carried them, so the HTTP/1 and HTTP/2 cores share it;
inbound routes (``core.server_policy``, applied by ``core.inbound_authz``) and
outbound ones (``core.client_policy``, applied by ``core.policy_routes``) hold
the same objects.

- ``HeaderModifier`` (``RequestHeaderModifier``, ``ResponseHeaderModifier``):
  add (append a value), then set (replace every value), then remove, as
  linkerd2-proxy applies them; names lower-case, matched case-insensitively.
  It never names an ``l5d-*`` header (the proxies' own: a policy cannot forge
  ``l5d-client-id``) nor one that frames the message (hop-by-hop,
  ``content-length``): such a modifier is refused when the policy is read.
- ``Redirect`` (``RequestRedirect``): the ``Location`` is the request's URI
  with the scheme, host, port and path replaced as configured (a host without
  a port keeps the request's non-default port; a prefix replacement needs the
  rule to have matched by path prefix, else ``InvalidRedirect``); a location
  equal to the request's own is no redirect. Status 301 when the message says 0.
- ``FailureInjector`` (``HttpFailureInjector``, ``GrpcFailureInjector``): the
  request fails with probability numerator/denominator (all, when unset), with
  its status, or for a gRPC route its code.
- ``Invalid``: what the proxy could not use or the controller could not
  express: the request fails with a 500.

``*_from_proto`` read the ``http_route``/``grpc_route`` messages, raising
``InvalidPolicy`` (naming the field) for what the proxy refuses.

Pure. Callers: ``core.policy_translation``, ``core.client_policy_translation``, ``core.server_policy``,
``core.client_policy``, ``core.inbound_authz``, ``core.policy_routes``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from tether.api import grpc_route_pb2, http_route_pb2, http_types_pb2
from tether.proxy.codec.http1 import HOP_BY_HOP, Headers, RequestHead

L5D_PREFIX = b"l5d-"
GRPC_INTERNAL = 13
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
_FRAMING = HOP_BY_HOP | {b"content-length"}


class InvalidPolicy(ValueError):
    """A policy message the proxy cannot use; the text names the field."""


class InvalidRedirect(ValueError):
    """A redirect that cannot be made for this request (linkerd2-proxy answers 500 for it)."""


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    add: Headers = ()
    set: Headers = ()
    remove: frozenset[bytes] = frozenset()

    def apply(self, headers: Headers) -> Headers:
        out = (*headers, *self.add)
        if self.set:
            replaced = {name for name, _ in self.set}
            out = (*((n, v) for n, v in out if n.lower() not in replaced), *self.set)
        if self.remove:
            out = tuple((n, v) for n, v in out if n.lower() not in self.remove)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Redirect:
    status: int = 301
    scheme: str | None = None  # None: the request's
    host: str | None = None  # None: the request's
    port: int | None = None  # None: the request's
    full_path: str | None = None
    prefix: str | None = None  # replaces the matched path prefix

    def location(self, scheme: str, authority: str, target: str, matched_prefix: str | None) -> str | None:
        """Where to send the request (its scheme, ``Host``/``:authority`` and request target), or None when that
        is where it already is. ``matched_prefix``: the rule's path prefix that matched, if one did."""
        new_scheme = self.scheme or scheme
        host, port = _split_authority(authority)
        if self.host is not None and self.port is not None:
            new_authority = f"{self.host}:{self.port}"
        elif self.host is not None:
            keep = _non_default(new_scheme, port)
            new_authority = f"{self.host}:{keep}" if keep is not None else self.host
        elif self.port is not None:
            if not host:
                raise InvalidRedirect("no authority to redirect to")
            override = _non_default(new_scheme, self.port)
            if override is not None and override != port:
                new_authority = f"{_bracketed(host)}:{override}"
            elif override is None and port is not None:
                new_authority = _bracketed(host)
            else:
                new_authority = authority
        else:
            new_authority = authority
        if not new_authority:
            raise InvalidRedirect("no authority to redirect to")
        path, sep, query = target.partition("?")
        if self.full_path is not None:
            new_target = self.full_path
        elif self.prefix is not None:
            if matched_prefix is None or len(matched_prefix) > len(path):
                raise InvalidRedirect("redirects may only replace the path prefix when a path prefix match applied")
            rest = path[len(matched_prefix):]
            new_target = self.prefix + ("/" if rest and not rest.startswith("/") else "") + rest
            if sep:
                new_target += "?" + query
        else:
            new_target = target
        location = f"{new_scheme}://{new_authority}{new_target}"
        return None if location == f"{scheme}://{authority}{target}" else location

    def location_of(self, request: RequestHead, matched_prefix: str | None) -> str | None:
        """``location`` for a request head (origin or absolute form; ``Host`` or ``:authority``)."""
        target = request.target.decode("latin-1")
        scheme = next((v.decode("latin-1") for n, v in request.headers if n == b":scheme"), "http")
        if "://" in target:
            scheme, _, rest = target.partition("://")
            authority, slash, path = rest.partition("/")
            return self.location(scheme.lower(), authority, slash + path or "/", matched_prefix)
        host = next((v for n, v in request.headers if n.lower() in (b":authority", b"host")), b"")
        return self.location(scheme, host.decode("latin-1"), target or "/", matched_prefix)


@dataclass(frozen=True, slots=True)
class FailureInjector:
    """Fails ``numerator``/``denominator`` of the requests with ``status`` (HTTP) or ``grpc_code``."""

    status: int
    message: str
    numerator: int = 1
    denominator: int = 1
    grpc_code: int | None = None

    def hits(self, draw: float) -> bool:
        """Whether this request fails; ``draw`` is a uniform number in [0, 1)."""
        return draw * self.denominator < self.numerator


@dataclass(frozen=True, slots=True)
class Invalid:
    """What the proxy could not use or the controller could not express: 500."""

    message: str


RequestFilter = HeaderModifier | Redirect | FailureInjector | Invalid


def chain(modifiers: Sequence[HeaderModifier]) -> Callable[[Headers], Headers] | None:
    """The header modifiers of a request (or response), in order, as one edit; None when there are none."""
    if not modifiers:
        return None
    if len(modifiers) == 1:
        return modifiers[0].apply
    return partial(_apply_all, tuple(modifiers))


def _apply_all(modifiers: tuple[HeaderModifier, ...], headers: Headers) -> Headers:
    for modifier in modifiers:
        headers = modifier.apply(headers)
    return headers


def refuse_l5d(names: Sequence[bytes]) -> list[bytes]:
    """The ``l5d-*`` names among ``names``: a header modifier never touches them."""
    return [n for n in names if n.lower().startswith(L5D_PREFIX)]


# -- from the policy API ------------------------------------------------------------------------------------


def header_modifier_from_proto(message: http_route_pb2.RequestHeaderModifier | http_route_pb2.ResponseHeaderModifier,
                               where: str) -> HeaderModifier:
    def pairs(headers: http_types_pb2.Headers, field: str) -> Headers:
        out = []
        for i, header in enumerate(headers.headers):
            name = _name(header.name, f"{where}.{field}.headers[{i}].name")
            value = bytes(header.value)
            if b"\r" in value or b"\n" in value or b"\0" in value:
                raise InvalidPolicy(f"{where}.{field}.headers[{i}].value: not a valid header value")
            out.append((name, value))
        return tuple(out)

    add, set_ = pairs(message.add, "add"), pairs(message.set, "set")
    remove = frozenset(_name(text, f"{where}.remove[{i}]") for i, text in enumerate(message.remove))
    names = [n for n, _ in add] + [n for n, _ in set_] + sorted(remove)
    forged = refuse_l5d(names)
    if forged:
        raise InvalidPolicy(f"{where}: {forged[0].decode('latin-1')} is the proxies' own header")
    framing = [n for n in names if n in _FRAMING]
    if framing:
        raise InvalidPolicy(f"{where}: {framing[0].decode('latin-1')} frames the message; it cannot be modified")
    return HeaderModifier(add, set_, remove)


def redirect_from_proto(message: http_route_pb2.RequestRedirect, where: str) -> Redirect:
    scheme = None
    if message.HasField("scheme"):
        which = message.scheme.WhichOneof("type")
        if which == "registered":
            scheme = "https" if message.scheme.registered == http_types_pb2.Scheme.HTTPS else "http"
        elif which == "unregistered" and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", message.scheme.unregistered):
            scheme = message.scheme.unregistered.lower()
        else:
            raise InvalidPolicy(f"{where}.scheme: not a valid scheme")
    if message.port > 65535:
        raise InvalidPolicy(f"{where}.port: {message.port} is not a port")
    if message.host and not re.fullmatch(r"[A-Za-z0-9.\-_\[\]:]+", message.host):
        raise InvalidPolicy(f"{where}.host: {message.host!r} is not a valid host")
    full = prefix = None
    if message.HasField("path"):
        which = message.path.WhichOneof("replace")
        value = getattr(message.path, which) if which else ""
        if which is not None and not value.startswith("/"):
            raise InvalidPolicy(f"{where}.path.{which}: redirect paths must be absolute")
        if which == "full":
            full = value
        elif which == "prefix":
            prefix = value
    status = message.status or 301
    if not 300 <= status <= 399:
        raise InvalidPolicy(f"{where}.status: {status} is not a redirection")
    return Redirect(status, scheme, message.host or None, message.port or None, full, prefix)


def failure_from_proto(message: http_route_pb2.HttpFailureInjector | grpc_route_pb2.GrpcFailureInjector,
                       where: str) -> FailureInjector:
    numerator, denominator = (message.ratio.numerator, message.ratio.denominator) if message.HasField("ratio") \
        else (1, 1)
    if denominator == 0:
        raise InvalidPolicy(f"{where}.ratio.denominator: 0")
    if isinstance(message, grpc_route_pb2.GrpcFailureInjector):
        code = message.code if 0 < message.code <= 16 else GRPC_INTERNAL  # Linkerd's controller sends 500 for "internal"
        return FailureInjector(200, message.message or "gRPC request failed", numerator, denominator, code)
    status = message.status if 100 <= message.status <= 599 else 500
    return FailureInjector(status, message.message or "HTTP request failed", numerator, denominator)


def _name(text: str, where: str) -> bytes:
    name = text.encode("latin-1", "replace")
    if not _TOKEN.fullmatch(name):
        raise InvalidPolicy(f"{where}: {text!r} is not a header name")
    return name.lower()


def _split_authority(authority: str) -> tuple[str, int | None]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = authority.rpartition(":")
        if not sep:
            host, port = authority, ""
    return host, int(port) if port.isdigit() else None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _non_default(scheme: str, port: int | None) -> int | None:
    if port is None or (scheme == "http" and port == 80) or (scheme == "https" and port == 443):
        return None
    return port
