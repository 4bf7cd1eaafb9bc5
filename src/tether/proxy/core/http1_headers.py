"""The header policy of an HTTP/1 hop (proxy.md §7.8): what goes up, what comes back down.

Up: hop-by-hop headers dropped (``Upgrade`` kept for a protocol switch), a
``Host`` added when the request had none, inbound ``l5d-client-id`` set from
the verified client identity (a forged one dropped), ``l5d-dst-canonical``
naming a profile's service, and ``l5d-dst-override`` dropped once an ingress
acted on it. Down: hop-by-hop dropped, outbound ``l5d-proxy-error`` and
``l5d-proxy-connection`` from the remote proxy dropped, and the response
re-framed for this client (chunked when the upstream gave no length).

A route's ``RequestHeaderModifier`` (inbound policy) edits a head's end-to-end
headers only (``edited``); the edited head is serialised anew.

The codec marks heads with nothing to rewrite (``rewrite`` False: no
hop-by-hop, no ``l5d-*`` header) and keeps their bytes (``raw``): such a head
goes on as it came, with only the lines the proxy adds appended to its bytes.
A response whose only hop-by-hop header is ``Connection: keep-alive`` is one
of them while that says nothing to its client (HTTP/1.1, connection kept:
``downstream_response``).

Callers: ``core.http1_proxy``; the header names and the ``l5d-*`` rules every version shares are
``core.http``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from tether.proxy.codec.http1 import (
    HOP_BY_HOP,
    Headers,
    RequestHead,
    ResponseHead,
    scan_framing,
    serialise_lines,
)
from tether.proxy.core.http import (
    L5D_CLIENT_ID,
    L5D_DST_CANONICAL,
    HeaderEdit,
    HttpSettings,
    Pick,
    mesh_request_headers,
    strip_proxy_errors,
)

_UPGRADE = frozenset({b"upgrade"})
_NONE: frozenset[bytes] = frozenset()


def end_to_end(headers: Headers, keep: frozenset[bytes] = _NONE,
               found: dict[bytes, list[bytes]] | None = None) -> Headers:
    """``headers`` without the hop-by-hop ones (those of RFC 9110 and those ``Connection`` lists), but ``keep``.
    ``found``: the head's framing values as the codec found them, whose ``connection`` entry holds the listed
    names already (lowercased, split, stripped), so they are not looked for again."""
    listed: Collection[bytes] = (scan_framing(headers) if found is None else found).get(b"connection", ())
    kept: list[tuple[bytes, bytes]] = []
    for header in headers:  # a loop, not a list comprehension: a call less per head
        low = header[0].lower()
        if low in keep or (low not in HOP_BY_HOP and low not in listed):
            kept.append(header)
    return tuple(kept)


_CONNECTION_OWNED = HOP_BY_HOP | {b"content-length"}


def edited(request: RequestHead, edit: HeaderEdit) -> RequestHead:
    """``request`` with a route's header edit applied (``core.http.RequestPolicy``). Its framing and
    hop-by-hop headers belong to the connection, not to the route: kept as they came, whatever the edit says."""
    owned = [(n, v) for n, v in request.headers if n.lower() in _CONNECTION_OWNED]
    changed = edit(tuple([(n, v) for n, v in request.headers if n.lower() not in _CONNECTION_OWNED]))
    headers = [(n, v) for n, v in changed if n.lower() not in _CONNECTION_OWNED] + owned
    return RequestHead(request.method, request.target, tuple(headers), request.version)


def upstream_request(request: RequestHead, pick: Pick, settings: HttpSettings) -> RequestHead:
    """The head sent to the endpoint ``pick`` chose."""
    framing = request.found if request.found is not None else scan_framing(request.headers)
    switch = request.method == b"CONNECT" or b"upgrade" in framing
    client_id = settings.client_id.encode() if settings.client_id else None
    route = pick.route
    dst = route.dst if route is not None else b""
    if pick.rewrite is None and not request.rewrite and not switch and request.found is not None \
            and request.version == b"1.1":
        # Parsed, HTTP/1.1 (so it has its one Host), nothing hop-by-hop and no l5d-*: it goes up as it came,
        # with the proxy's own lines appended.
        extra: Headers = ()
        if client_id is not None:
            extra += ((L5D_CLIENT_ID, client_id),)
        if dst:
            extra += ((L5D_DST_CANONICAL, dst),)
        if not extra:  # as it came: the same head
            return request
        # Its bytes kept, extended by the lines appended.
        raw = request.raw
        if raw is not None:
            raw += serialise_lines(extra)
        return RequestHead(request.method, request.target, request.headers + extra, b"1.1", False, framing, raw)
    upgrade = switch and request.method != b"CONNECT"
    headers = list(end_to_end(request.headers, _UPGRADE if upgrade else _NONE))
    if upgrade:
        headers.append((b"connection", b"upgrade"))
    if not any(n.lower() == b"host" for n, _ in headers):
        headers.insert(0, (b"host", pick.authority))
    if b"transfer-encoding" in framing:  # hop-by-hop, so dropped above: the body is sent with the same framing
        headers.extend((n, v) for n, v in request.headers if n.lower() == b"transfer-encoding")
    headers = mesh_request_headers(headers, pick, settings)
    # Sent as HTTP/1.1, but over the l5d-orig-proto upgrade: its leg marks the request with its own version.
    version = request.version if pick.connect.upgrade else b"1.1"
    return RequestHead(request.method, request.target, tuple(headers), version)


def informational(head: ResponseHead) -> ResponseHead:
    """A 1xx head passed on to the client."""
    return ResponseHead(head.status, end_to_end(head.headers), head.reason)


def downstream_response(head: ResponseHead, request: RequestHead, keep_alive: bool,
                        settings: HttpSettings, respond: Callable[[Headers], Headers] | None = None) -> ResponseHead:
    """The response head sent to the client; ``keep_alive``: whether the client's connection stays open;
    ``respond``: the client policy route's ResponseHeaderModifier (never l5d-* or framing headers)."""
    if respond is not None:
        head = ResponseHead(head.status, respond(end_to_end(head.headers)), head.reason, head.version)
    status = head.status
    if status == 101:
        upgraded = (*end_to_end(head.headers, _UPGRADE), (b"connection", b"upgrade"))
        return ResponseHead(status, _strip_proxy_errors(upgraded, settings), head.reason, b"1.1")
    if request.method == b"CONNECT" and 200 <= status < 300:  # a tunnel: no body framing to speak of
        tunnel = tuple((n, v) for n, v in end_to_end(head.headers) if n.lower() != b"content-length")
        return ResponseHead(status, _strip_proxy_errors(tunnel, settings), head.reason, b"1.1")
    up_found = head.found if head.found is not None else scan_framing(head.headers)
    plain = not head.rewrite
    if plain and b"connection" in up_found and not (keep_alive and request.version == head.version == b"1.1"):
        # The codec lets a response's Connection: keep-alive pass as "nothing to rewrite" (nginx's every
        # response: its bytes go on as they came, not filtered and serialised anew: five Python calls less). An
        # intermediary removes the Connection field "or replaces it with its own control options" (RFC 9110
        # §7.6.1): to an HTTP/1.1 client whose connection stays open, keep-alive is this proxy's own option too
        # (and what HTTP/1.1 means anyway, RFC 9112 §9.3). Not so for an HTTP/1.0 client (its own line is
        # added) nor a connection this response closes (``connection: close`` is): filtered as any other head.
        plain = False
    headers: Headers = head.headers
    if not plain:
        headers = end_to_end(headers, _NONE, up_found)
        if settings.strip_proxy_errors:
            headers = _strip_proxy_errors(headers, settings)
    framing: dict[bytes, list[bytes]] = {}
    no_body = request.method == b"HEAD" or status in (204, 304)
    extra: Headers = ()
    if b"content-length" in up_found:  # kept by end_to_end; the codec refused it next to Transfer-Encoding
        framing[b"content-length"] = up_found[b"content-length"]
    elif not no_body and request.version == b"1.1":
        extra = ((b"transfer-encoding", b"chunked"),)
        framing[b"transfer-encoding"] = [b"chunked"]
    # else: no body, or an HTTP/1.0 client reads until the close.
    if not keep_alive:
        extra += ((b"connection", b"close"),)
        framing[b"connection"] = [b"close"]
    elif request.version == b"1.0":
        extra += ((b"connection", b"keep-alive"),)
        framing[b"connection"] = [b"keep-alive"]
    if plain and not extra and head.version == b"1.1" and head.found is not None:
        # As it came (nothing hop-by-hop, so its framing is its Content-Length or nothing, as ``framing`` says):
        # the same head, not a copy.
        return head
    raw = head.raw if plain and head.version == b"1.1" else None
    if raw is not None and extra:
        raw += serialise_lines(extra)
    return ResponseHead(status, headers + extra if extra else headers, head.reason, b"1.1", False, framing, raw)


def _strip_proxy_errors(headers: Headers, settings: HttpSettings) -> Headers:
    return tuple(strip_proxy_errors(list(headers), settings))
