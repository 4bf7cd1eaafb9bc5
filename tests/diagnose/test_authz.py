"""The policy layer's judgement of a policy controller's answer (``server_dict`` shape) for one client."""

from __future__ import annotations

from tether.diagnose.authz import allowing

CLIENT = "web.shop.serviceaccount.identity.linkerd.cluster.local"


def server(*authzs: dict, routes: list[dict] | None = None) -> dict:
    return {"labels": {"kind": "server", "name": "api"}, "protocol": "detect", "authorizations": list(authzs),
            "http_routes": routes or []}


def authz(ref: str, authentication: str, networks: tuple[str, ...] = ("0.0.0.0/0",), **extra) -> dict:
    return {"ref": ref, "authentication": authentication, "networks": list(networks), **extra}


def test_no_authorization_denies_everyone() -> None:
    assert allowing(server(), CLIENT, "10.0.0.5") == []


def test_authentication_kinds() -> None:
    assert allowing(server(authz("a", "unauthenticated")), "", "10.0.0.5") == ["a"]
    assert allowing(server(authz("m", "mtls")), "", "10.0.0.5") == []
    assert allowing(server(authz("m", "mtls")), CLIENT, "10.0.0.5") == ["m"]
    named = authz("n", "identities", identities=[CLIENT])
    assert allowing(server(named), CLIENT, "10.0.0.5") == ["n"]
    assert allowing(server(named), "other.shop.serviceaccount.identity.linkerd.cluster.local", "10.0.0.5") == []
    suffix = authz("s", "identities", suffixes=["*.shop.serviceaccount.identity.linkerd.cluster.local"])
    assert allowing(server(suffix), CLIENT, "10.0.0.5") == ["s"]
    assert allowing(server(authz("any", "identities", suffixes=["*"])), CLIENT, "10.0.0.5") == ["any"]


def test_networks_and_their_exceptions() -> None:
    inside = authz("net", "unauthenticated", networks=("10.0.0.0/8 except 10.9.0.0/16",))
    assert allowing(server(inside), "", "10.1.2.3") == ["net"]
    assert allowing(server(inside), "", "10.9.2.3") == []
    assert allowing(server(inside), "", "192.168.1.1") == []


def test_route_level_authorizations_count() -> None:
    route = {"ref": "httproute/get", "authorizations": [authz("r", "mtls")]}
    assert allowing(server(routes=[route]), CLIENT, "10.0.0.5") == ["httproute/get r"]
