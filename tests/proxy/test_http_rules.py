"""The ``l5d-*`` header rules every HTTP version applies (``core.http``), on their own.

Both rules copy a header list only when they change it (a call less per request
without such a header): each is run here with and without a header to act on,
in any case of names (HTTP/1's are as sent).
"""

from __future__ import annotations

from typing import Any

from tether.proxy.core.http import HttpSettings, Pick, mesh_request_headers, strip_proxy_errors

APP = [(b"x-app", b"1"), (b"content-type", b"text/plain")]


def settings(direction: str, **kw: Any) -> HttpSettings:
    return HttpSettings(direction, lambda: 0.0, **kw)


def pick() -> Pick:
    return Pick(None, None, "", b"web")  # (where it connects is no matter here)


def test_the_remote_proxys_error_headers_are_stripped_outbound_only() -> None:
    outbound = settings("outbound", strip_proxy_errors=True)
    assert strip_proxy_errors(APP, outbound) is APP  # nothing to strip: the list as it came
    got = strip_proxy_errors([(b"L5D-Proxy-Error", b"far"), *APP, (b"l5d-proxy-connection", b"close")], outbound)
    assert got == APP
    with_error = [(b"l5d-proxy-error", b"far"), *APP]
    assert strip_proxy_errors(with_error, settings("inbound")) is with_error


def test_inbound_the_client_id_is_the_verified_one_whatever_came() -> None:
    inbound = settings("inbound", client_id="me.ns.serviceaccount")
    verified = (b"l5d-client-id", b"me.ns.serviceaccount")
    assert mesh_request_headers(APP, pick(), inbound) == [*APP, verified]
    assert mesh_request_headers([(b"L5D-Client-Id", b"forged"), *APP], pick(), inbound) == [*APP, verified]
    anonymous = settings("inbound")
    assert mesh_request_headers(APP, pick(), anonymous) is APP  # nothing dropped, nothing added: as it came
    assert mesh_request_headers([*APP, (b"l5d-client-id", b"forged")], pick(), anonymous) == APP
    assert mesh_request_headers(APP, pick(), settings("outbound")) is APP
