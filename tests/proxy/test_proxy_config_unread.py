"""Proxy variables the proxy does not read are warned about by name (core.config_unread): nothing in the
``LINKERD2_PROXY_*`` environment is accepted and ignored in silence."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tether.proxy.core.config import ProxyConfig
from tether.proxy.core.config_unread import NOT_APPLIED, NOT_READ_BY_LINKERD

GOLDEN = Path(__file__).parent.parent / "injector" / "data" / "golden"


def test_a_complete_environment_gives_no_warning(minimal_env: dict[str, str]) -> None:
    assert ProxyConfig.from_env(minimal_env).unread == ()


def test_an_unknown_variable_is_warned_about_by_name(minimal_env: dict[str, str]) -> None:
    env = dict(minimal_env, LINKERD2_PROXY_INBOUND_PORT="8080", TETHER_PROXY_ORIG_DST_FALBACK="local-addr",
               LINKERD2_OTHER="x", HOME="/root")
    assert ProxyConfig.from_env(env).unread == (
        "LINKERD2_PROXY_INBOUND_PORT is not a variable this proxy knows: ignored (misspelt?)",
        "TETHER_PROXY_ORIG_DST_FALBACK is not a variable this proxy knows: ignored (misspelt?)",
    )
    assert ProxyConfig.from_env(env).unread[0] in ProxyConfig.from_env(env).unapplied  # logged at start


@pytest.mark.parametrize("var", sorted(NOT_APPLIED))
def test_a_linkerd_variable_this_proxy_does_not_apply_is_warned_with_the_reason(
        minimal_env: dict[str, str], var: str) -> None:
    # Fails once the variable is read: then its entry in NOT_APPLIED must go.
    assert ProxyConfig.from_env(dict(minimal_env, **{var: "2"})).unread == (
        f"{var}='2' is not applied: {NOT_APPLIED[var]}",)


def test_one_core_is_what_the_proxy_does(minimal_env: dict[str, str]) -> None:
    env = dict(minimal_env, LINKERD2_PROXY_CORES_MIN="1", LINKERD2_PROXY_CORES_MAX="1", LINKERD2_PROXY_CORES="2")
    assert ProxyConfig.from_env(env).unread == (
        "LINKERD2_PROXY_CORES='2' is not applied: the proxy runs one event loop on one thread whatever the cores",)


def test_what_linkerd2_proxy_does_not_read_either_is_not_warned_about(minimal_env: dict[str, str]) -> None:
    env = dict(minimal_env, **{var: "x" for var in NOT_READ_BY_LINKERD})
    assert ProxyConfig.from_env(env).unread == ()


def _proxy_env(manifest: Path) -> dict[str, str]:
    """The ``LINKERD2_PROXY_*`` variables the injector gave the proxy container, with literal values."""
    env = {}
    for doc in yaml.safe_load_all(manifest.read_text()):
        spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            if container.get("name") == "linkerd-proxy":
                env |= {e["name"]: e["value"] for e in container.get("env", [])
                        if e["name"].startswith("LINKERD2_PROXY_") and "value" in e}
    return env


@pytest.mark.parametrize("manifest", sorted(GOLDEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_no_variable_the_injector_writes_is_unknown_to_the_proxy(minimal_env: dict[str, str],
                                                                 manifest: Path) -> None:
    injected = _proxy_env(manifest)
    if "LINKERD2_PROXY_DESTINATION_SVC_ADDR" not in injected:
        pytest.skip("no injected proxy in this manifest")
    # The pod-specific values ($(...) references to the downward API) are the fixture's.
    env = minimal_env | {k: v for k, v in injected.items() if "$(" not in v}
    unknown = [w for w in ProxyConfig.from_env(env).unread if "not a variable this proxy knows" in w]
    assert unknown == []
