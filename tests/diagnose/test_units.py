"""Pure parts of the diagnosis: reading --to, and what a proxy's synthesized error says."""

from __future__ import annotations

import pytest

from tether.diagnose.layers import http2_server_preface
from tether.diagnose.walk import Authority, DiagnoseError, parse_authority, proxy_error_meaning


@pytest.mark.parametrize("text", ["web.shop:80", "web.shop.svc.cluster.local:80", "WEB.shop.svc:80"])
def test_authorities(text: str) -> None:
    assert parse_authority(text, "cluster.local") == Authority("web", "shop", 80, "cluster.local")
    assert parse_authority(text, "cluster.local").fqdn == "web.shop.svc.cluster.local:80"


@pytest.mark.parametrize("text, why", [
    ("web", "is not SVC.NS:PORT"),
    ("web.shop", "is not SVC.NS:PORT"),
    ("web.shop.svc.other.domain:80", "not in the cluster domain"),
    ("web.shop:0", "out of range"),
    ("web.shop:70000", "out of range"),
])
def test_bad_authorities(text: str, why: str) -> None:
    with pytest.raises(DiagnoseError, match=why):
        parse_authority(text, "cluster.local")


def test_proxy_errors_are_explained() -> None:
    assert "fail-fast" in proxy_error_meaning("logical service web.shop.svc.cluster.local:80: service in fail-fast")
    assert "shed load" in proxy_error_meaning("service overloaded: load shed")
    assert proxy_error_meaning("something else") == ""


def test_an_http2_server_preface_is_not_a_banner() -> None:
    settings = bytes.fromhex("000018 04 00 00000000".replace(" ", "")) + bytes(24)  # SETTINGS, 4 settings, stream 0
    assert http2_server_preface(settings)
    assert not http2_server_preface(b"220 banner ready\r\n")
    assert not http2_server_preface(bytes.fromhex("000000 04 01 00000000"))  # a SETTINGS ack opens nothing
    assert not http2_server_preface(bytes.fromhex("000018 04 00 00000001") + bytes(24))  # not on stream 0
    assert not http2_server_preface(bytes.fromhex("000005 04 00 00000000") + bytes(5))  # not whole settings
