"""The patch against its consumers: the proxy's environment parses with ``ProxyConfig.from_env`` once the
kubelet has filled it in, the init container's arguments run ``tether init --simulate``, and two
golden pods pin the whole output."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tether.cli.init_cmd import init
from tether.injector import MeshConfig, Origin, inject
from tether.injector.manifests import dump_yaml
from tether.platform.local.proxy_init import ProxyInitConfig, nat_rules, parse_ports, parse_subnets
from tether.proxy.core.config import DefaultPolicy, ProxyConfig

from .helpers import DATA, POD_FIELDS, container, deployment, kubelet_env, pod, template_of

GOLDEN = DATA / "golden"
C = "config.linkerd.io/"


def _injected(obj: dict[str, Any], config: MeshConfig, **kw: Any) -> dict[str, Any]:
    result = inject(obj, {"linkerd.io/inject": "enabled"}, config, **kw)
    assert result.report.action == "injected"
    return result.obj


def _proxy(obj: dict[str, Any]) -> dict[str, Any]:
    spec = template_of(obj)["spec"]
    return container(spec.get("initContainers", []) + spec["containers"], "linkerd-proxy")


CASES = {
    "defaults": {},
    "tuned": {
        C + "proxy-log-level": "debug",
        C + "proxy-log-format": "json",
        C + "default-inbound-policy": "cluster-authenticated",
        C + "opaque-ports": "db,9000-9010",
        C + "admin-port": "5191",
        C + "inbound-port": "5143",
        C + "outbound-port": "5140",
        C + "proxy-outbound-connect-timeout": "3s",
        C + "proxy-inbound-discovery-cache-unused-timeout": "2m",
        C + "proxy-disable-inbound-protocol-detect-timeout": "true",
        C + "shutdown-grace-period": "45s",
        C + "proxy-admin-shutdown": "enabled",
        C + "enable-external-profiles": "true",
        "linkerd.io/inject": "ingress",
    },
}


@pytest.mark.parametrize("ipv6", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_proxy_environment_parses_with_the_proxy(config: MeshConfig, case: str, ipv6: bool) -> None:
    obj = pod(ports=(("db", 5432), 8080), annotations=CASES[case])
    proxy = _proxy(_injected(obj, config.replace(disable_ipv6=not ipv6)))
    env = kubelet_env(proxy, POD_FIELDS)
    parsed = ProxyConfig.from_env(env)
    assert parsed.identity.local_name == "web.shop.serviceaccount.identity.linkerd.cluster.local"
    assert parsed.identity.svc.identity == "linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local"
    assert parsed.destination.identity == "linkerd-destination.linkerd.serviceaccount.identity.linkerd.cluster.local"
    assert parsed.identity.trust_anchors_pem == config.trust_anchors_pem
    assert parsed.identity.dir == "/var/run/linkerd/identity/end-entity"
    assert parsed.policy_workload == '{"ns":"shop", "pod":"web-7d9c-x2x4q"}'
    assert parsed.destination_context == '{"ns":"shop", "nodeName":"node-1", "pod":"web-7d9c-x2x4q"}'
    assert str(parsed.destination.addr) == "linkerd-dst-headless.linkerd.svc.cluster.local.:8086"
    assert 5432 in parsed.inbound.ports and 8080 in parsed.inbound.ports
    admin_port = proxy["ports"][1]["containerPort"]
    assert parsed.admin_listen_addr.port == admin_port
    assert parsed.inbound.listen_addr.port == proxy["ports"][0]["containerPort"]
    if case == "tuned":
        assert parsed.inbound.default_policy is DefaultPolicy.CLUSTER_AUTHENTICATED
        assert 5432 in parsed.inbound.opaque_ports and 9005 in parsed.inbound.opaque_ports
        assert parsed.outbound.connect_timeout.total_seconds() == 3
        assert parsed.inbound.discovery_idle_timeout.total_seconds() == 120
        assert parsed.shutdown_grace_period.total_seconds() == 45
        assert parsed.shutdown_endpoint_enabled is True
        assert parsed.profile_suffixes == (".",)
        assert parsed.outbound.listen_addrs[0].port == 5140
    else:
        assert parsed.inbound.default_policy is DefaultPolicy.ALL_UNAUTHENTICATED
        assert 3306 in parsed.inbound.opaque_ports and 8080 not in parsed.inbound.opaque_ports
        assert parsed.profile_suffixes == ("svc.cluster.local.",)
    assert len(parsed.outbound.listen_addrs) == (2 if ipv6 else 1)


def test_environment_refers_only_to_earlier_variables(config: MeshConfig) -> None:
    proxy = _proxy(_injected(pod(), config))
    env = kubelet_env(proxy, POD_FIELDS)
    assert not [name for name, value in env.items() if "$(" in value]


def test_environment_with_other_control_plane_and_trust_domain(anchors_pem: str) -> None:
    cfg = MeshConfig(trust_anchors_pem=anchors_pem, control_plane_ns="tether", trust_domain="mesh.example",
                     cluster_domain="k8s.example")  # fmt: skip
    parsed = ProxyConfig.from_env(kubelet_env(_proxy(_injected(pod(), cfg)), POD_FIELDS))
    assert parsed.identity.local_name == "web.shop.serviceaccount.identity.tether.mesh.example"
    assert str(parsed.identity.svc.addr) == "linkerd-identity-headless.tether.svc.k8s.example.:8080"
    assert parsed.profile_suffixes == ("svc.k8s.example.",)


def _simulate(args: list[str]) -> str:
    result = CliRunner().invoke(init, [*args, "--simulate"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {C + "skip-inbound-ports": "25,8080-8090", C + "skip-outbound-ports": "443", C + "skip-subnets": "10.1.0.0/16"},
        {C + "proxy-gid": "2103", C + "inbound-port": "5143", C + "outbound-port": "5140"},
        {C + "skip-outbound-ports": ""},
    ],
)
def test_init_arguments_run_tether_init(config: MeshConfig, annotations: dict[str, str]) -> None:
    out = _injected(deployment(annotations=annotations), config)
    init_container = container(out["spec"]["template"]["spec"]["initContainers"], "linkerd-init")
    assert init_container["command"] == ["tether", "init"]
    printed = _simulate(init_container["args"])
    a = {k.removeprefix(C): v for k, v in annotations.items()}
    expected = ProxyInitConfig(
        incoming_proxy_port=int(a.get("inbound-port", 4143)),
        outgoing_proxy_port=int(a.get("outbound-port", 4140)),
        proxy_gid=int(a["proxy-gid"]) if "proxy-gid" in a else None,
        inbound_ports_to_ignore=parse_ports("4190,4191," + a.get("skip-inbound-ports", "4567,4568"), "i"),
        outbound_ports_to_ignore=parse_ports(a.get("skip-outbound-ports", "4567,4568"), "o"),
        subnets_to_ignore=parse_subnets(a.get("skip-subnets", ""), "s"),
        ipv6=False,
    )
    assert printed == f"# iptables-nft-restore --noflush\n{nat_rules(expected)}"


# --- golden files -----------------------------------------------------------------------------------------
# Regenerate after an intended change with: TETHER_UPDATE_GOLDEN=1 pytest tests/injector/test_contracts.py

GOLDEN_CASES = {
    "deployment-native.yaml": ({}, {}),
    "deployment-legacy.yaml": ({"config.alpha.linkerd.io/proxy-enable-native-sidecar": "false"}, {}),
    "deployment-cni.yaml": ({C + "skip-outbound-ports": "5432"}, {"cni_enabled": True}),
}


@pytest.mark.parametrize("name", list(GOLDEN_CASES))
def test_golden(config: MeshConfig, workloads: dict[str, dict[str, Any]], name: str) -> None:
    annotations, changes = GOLDEN_CASES[name]
    obj = workloads["Deployment"]
    obj["spec"]["template"]["metadata"].setdefault("annotations", {}).update(annotations)
    out = inject(obj, {}, config.replace(version="0.0.0-test", proxy_version="0.0.0-test", **changes),
                 origin=Origin.CLI).obj  # fmt: skip
    text = dump_yaml(out)
    path = GOLDEN / name
    if os.environ.get("TETHER_UPDATE_GOLDEN"):
        path.write_text(text)
    assert yaml.safe_load(text) == out
    assert text == path.read_text(), f"{name} differs; see the docstring above GOLDEN_CASES to regenerate"
