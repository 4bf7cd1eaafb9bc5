"""InboundServerPolicies over mTLS: default servers, the six default policies, probes, opaque ports, errors."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from policy_helpers import NS, Harness, Pki, namespace, pod, sa_id

from tether.policy.config import parse_networks
from tether.policy.defaults import DefaultPolicy

ALL = ["0.0.0.0/0", "::/0"]
CLUSTER = ["10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"]


async def test_a_port_no_server_selects_gets_the_cluster_default(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod()) as h:
        server = await h.get(8080)
        assert server["labels"] == {"group": "", "kind": "default", "name": "all-unauthenticated"}
        assert server["protocol"] == "detect" and server["detect_timeout_s"] == 10
        assert server["authorizations"] == [
            {"ref": "default:all-unauthenticated", "networks": ALL, "authentication": "unauthenticated"}]
        assert [r["ref"] for r in server["http_routes"]] == ["default:default"]
        assert server["http_routes"][0]["rules"] == [{"matches": [{"path": "prefix:/"}], "filters": []}]


@pytest.mark.parametrize("policy, networks, authentication", [
    ("all-unauthenticated", ALL, "unauthenticated"),
    ("all-authenticated", ALL, "identities"),
    ("cluster-unauthenticated", CLUSTER, "unauthenticated"),
    ("cluster-authenticated", CLUSTER, "identities"),
    ("audit", ALL, "unauthenticated"),
    ("deny", None, None),
])
async def test_each_default_policy_from_the_cluster_flag(
    workdir: Path, pki: Pki, policy: str, networks: list[str] | None, authentication: str | None
) -> None:
    async with Harness(workdir, pki, namespace(), pod(), default_policy=DefaultPolicy.parse(policy)) as h:
        server = await h.get(8080)
        assert server["labels"]["name"] == policy
        if networks is None:
            assert server["authorizations"] == []
            return
        (authz,) = server["authorizations"]
        assert authz["ref"] == f"default:{policy}"
        assert authz["networks"] == networks
        assert authz["authentication"] == authentication
        if authentication == "identities":
            assert authz["suffixes"] == ["*"] and authz["identities"] == []


async def test_the_pod_annotation_wins_over_the_namespace_which_wins_over_the_cluster(
    workdir: Path, pki: Pki
) -> None:
    key = "config.linkerd.io/default-inbound-policy"
    async with Harness(workdir, pki, namespace(annotations={key: "deny"}), pod(),
                       pod("web-1", annotations={key: "cluster-authenticated"})) as h:
        assert (await h.get(8080))["labels"]["name"] == "deny"
        assert (await h.get(8080, "web-1"))["labels"]["name"] == "cluster-authenticated"
        watch = h.watch(8080)
        assert (await watch.next())["labels"]["name"] == "deny"
        h.apply(namespace(annotations={}))  # the namespace changes: the port follows
        assert (await watch.next())["labels"]["name"] == "all-unauthenticated"
        h.apply(pod(annotations={key: "not-a-policy"}))  # invalid: ignored, the default holds
        assert (await h.get(8080))["labels"]["name"] == "all-unauthenticated"


async def test_require_identity_ports_turn_allow_into_authenticated(workdir: Path, pki: Pki) -> None:
    annotations = {"config.linkerd.io/proxy-require-identity-inbound-ports": "8080,9000-9010",
                   "config.linkerd.io/default-inbound-policy": "cluster-unauthenticated"}
    async with Harness(workdir, pki, namespace(), pod(annotations=annotations)) as h:
        assert (await h.get(8080))["labels"]["name"] == "cluster-authenticated"
        assert (await h.get(9005))["labels"]["name"] == "cluster-authenticated"
        assert (await h.get(9011))["labels"]["name"] == "cluster-unauthenticated"


async def test_opaque_ports_from_the_pod_else_the_defaults(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(annotations={"config.linkerd.io/opaque-ports": "http,7000"}),
                       pod("db-0", app="db")) as h:
        assert (await h.get(8080))["protocol"] == "opaque"  # by container-port name
        assert (await h.get(7000))["protocol"] == "opaque"
        assert (await h.get(5432))["protocol"] == "detect"  # the pod's own list replaces the defaults
        assert (await h.get(5432, "db-0"))["protocol"] == "opaque"  # a default opaque port


async def test_probe_paths_get_a_probe_route_from_the_probe_networks(workdir: Path, pki: Pki) -> None:
    probes = {"liveness": ("http", "/live"), "readiness": (8080, "/ready"), "startup": (9090, "/started")}
    async with Harness(workdir, pki, namespace(), pod(probes=probes, annotations={
            "config.linkerd.io/default-inbound-policy": "deny"}),
            probe_networks=parse_networks("10.1.0.0/16")) as h:
        server = await h.get(8080)
        assert server["authorizations"] == []  # deny: nothing but the probes
        default, probe = server["http_routes"]
        assert default["ref"] == "default:default"
        assert probe["ref"] == "default:probe"
        assert probe["rules"] == [{"matches": [{"path": "exact:/live", "method": "GET"},
                                               {"path": "exact:/ready", "method": "GET"}], "filters": []}]
        assert probe["authorizations"] == [
            {"ref": "default:probe", "networks": ["10.1.0.0/16"], "authentication": "unauthenticated"}]
        assert [r["ref"] for r in (await h.get(9090))["http_routes"]] == ["default:default", "default:probe"]
        assert [r["ref"] for r in (await h.get(7000))["http_routes"]] == ["default:default"]


async def test_a_native_sidecar_proxys_admin_probes_get_the_probe_route(workdir: Path, pki: Pki) -> None:
    """The proxy as a native sidecar (an init container, restartPolicy Always) is probed on its admin port: its
    paths and its named port count as an app container's do (Linkerd's ``pod_http_probes``)."""
    manifest = pod(annotations={"config.linkerd.io/default-inbound-policy": "deny"})
    manifest["spec"]["initContainers"] = [{
        "name": "linkerd-proxy", "image": "example/proxy:v1", "restartPolicy": "Always",
        "ports": [{"name": "linkerd-admin", "containerPort": 4191}],
        "livenessProbe": {"httpGet": {"port": 4191, "path": "/live"}},
        "readinessProbe": {"httpGet": {"port": "linkerd-admin", "path": "/ready"}},
    }]
    async with Harness(workdir, pki, namespace(), manifest) as h:
        server = await h.get(4191)
        assert server["authorizations"] == []
        default, probe = server["http_routes"]
        assert probe["rules"] == [{"matches": [{"path": "exact:/live", "method": "GET"},
                                               {"path": "exact:/ready", "method": "GET"}], "filters": []}]
        assert [r["ref"] for r in (await h.get(8080))["http_routes"]] == ["default:default"]


async def test_no_probe_networks_means_no_probe_route(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(probes={"liveness": ("http", "/live")}),
                       probe_networks=()) as h:
        assert [r["ref"] for r in (await h.get(8080))["http_routes"]] == ["default:default"]


@pytest.mark.parametrize("raw, port", [
    ("", 8080), ("not json", 8080), ("{\"ns\": \"emojivoto\"}", 8080), ("[1]", 8080), ("{", 8080),
    (json.dumps({"ns": "emojivoto", "pod": "web-0"}), 0), (json.dumps({"ns": "emojivoto", "pod": "web-0"}), 70000),
    (json.dumps({"ns": "Bad_NS", "pod": "web-0"}), 8080),
])
async def test_bad_workloads_and_ports_are_invalid_argument(workdir: Path, pki: Pki, raw: str, port: int) -> None:
    async with Harness(workdir, pki, namespace(), pod()) as h:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await h.get(port, raw=raw)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (await h.watch(port, raw=raw).error()).code() == grpc.StatusCode.INVALID_ARGUMENT
        handled = h.metric("grpc_server_handled_total", {
            "grpc_service": "io.linkerd.proxy.inbound.InboundServerPolicies", "grpc_method": "GetPort",
            "grpc_type": "unary", "grpc_code": "INVALID_ARGUMENT"})
        assert handled == 1


async def test_legacy_workload_strings_and_unknown_pods(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), pod(), pod("plain-0", meshed=False)) as h:
        assert (await h.get(8080, raw=f"{NS}:web-0"))["labels"]["name"] == "all-unauthenticated"
        for raw in (f"{NS}:nope", f"{NS}:plain-0", json.dumps({"ns": NS, "external_workload": "vm"})):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await h.get(8080, raw=raw)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "unknown server" in (caught.value.details() or "")


async def test_a_client_without_a_certificate_is_refused(workdir: Path, pki: Pki) -> None:
    from tether.serving.channel import open_channel

    async with Harness(workdir, pki, namespace(), pod()) as h:
        async with open_channel(h.address, h.client_tls(with_cert=False)) as anonymous:
            watch = h.watch(8080, channel=anonymous)
            assert (await watch.error()).code() == grpc.StatusCode.UNAVAILABLE


def test_identity_names_follow_the_control_plane() -> None:
    assert sa_id("web") == "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
