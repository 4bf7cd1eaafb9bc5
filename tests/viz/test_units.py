"""viz's pure parts: resource arguments, the PromQL, durations, discovery target groups, workloads, tables."""

from __future__ import annotations

import pytest

from tether.viz import promql, scrape_config, tables
from tether.viz.metrics_api import Edge, Row, Stats, window_seconds
from tether.viz.targets import AUTHORITY, DEPLOYMENT, NAMESPACE, POD, SERVICE, Target, TargetError, parse_targets
from tether.viz.workloads import deployment_of, select
from viz.promlab import meshed_pod

# -- resource arguments ---------------------------------------------------------------------------


def test_targets_read_as_linkerd_viz_stat_reads_them() -> None:
    assert parse_targets(["deploy"], "ns") == [Target(DEPLOYMENT, "ns")]
    assert parse_targets(["deploy", "web", "emoji"], "ns") == [Target(DEPLOYMENT, "ns", "web"),
                                                               Target(DEPLOYMENT, "ns", "emoji")]
    assert parse_targets(["deploy/web", "po"], None) == [Target(DEPLOYMENT, None, "web"), Target(POD, None)]
    assert parse_targets(["deploy,svc"], "x") == [Target(DEPLOYMENT, "x"), Target(SERVICE, "x")]
    assert parse_targets(["au/web.svc:80"], "x") == [Target(AUTHORITY, "x", "web.svc:80")]
    with pytest.raises(TargetError, match="unknown resource type 'widgets'"):
        parse_targets(["widgets"], "x")
    with pytest.raises(TargetError, match="names no object"):
        parse_targets(["deploy/"], "x")


# -- PromQL ---------------------------------------------------------------------------------------


def test_stat_queries_are_linkerd_s() -> None:
    q = promql.stat(Target(DEPLOYMENT, "emojivoto", "web"), "1m")
    assert q.group_by == ("namespace", "deployment")
    assert q.queries[promql.REQUESTS] == (
        'sum(increase(response_total{deployment="web", direction="inbound", namespace="emojivoto"}[1m])) '
        "by (namespace, deployment, classification, tls)")
    assert q.queries["0.95"] == (
        'histogram_quantile(0.95, sum(irate(response_latency_ms_bucket{deployment="web", direction="inbound", '
        'namespace="emojivoto"}[1m])) by (le, namespace, deployment))')
    assert q.queries[promql.TCP_READ] == (
        'sum(increase(tcp_read_bytes_total{deployment="web", direction="inbound", namespace="emojivoto", '
        'peer="src"}[1m])) by (namespace, deployment)')


def test_stat_to_and_from_use_the_outbound_side_and_dst_labels() -> None:
    to = promql.stat(Target(DEPLOYMENT, "ns"), "30s", to=Target(DEPLOYMENT, "ns", "emoji"))
    assert to.queries[promql.REQUESTS].startswith(
        'sum(increase(response_total{direction="outbound", dst_deployment="emoji", dst_namespace="ns", '
        'namespace="ns"}[30s]))')
    assert 'peer="dst"' in to.queries[promql.TCP_WRITE]
    frm = promql.stat(Target(POD, "ns"), "30s", from_=Target(DEPLOYMENT, "ns", "web"))
    assert frm.group_by == ("dst_namespace", "dst_pod")
    assert '{deployment="web", direction="outbound", namespace="ns"}' in frm.queries[promql.REQUESTS]


def test_service_stat_matches_the_authority() -> None:
    q = promql.stat(Target(SERVICE, "ns", "web"), "1m")
    assert q.group_by == ("dst_namespace", "dst_service")
    assert 'authority=~"^web\\\\.ns\\\\.svc\\\\.cluster.local.+"' in q.queries[promql.REQUESTS]
    assert promql.TCP_CONNECTIONS not in q.queries


def test_namespace_stat_groups_by_namespace_only() -> None:
    q = promql.stat(Target(NAMESPACE, None, "emojivoto"), "1m")
    assert q.group_by == ("namespace",)
    assert '{direction="inbound", namespace="emojivoto"}' in q.queries[promql.REQUESTS]


def test_routes_edges_and_authz_queries() -> None:
    r = promql.routes(Target(DEPLOYMENT, "ns", "web"), "1m", ["a.ns.svc.cluster.local", "b.ns.svc.cluster.local"],
                      to=Target(DEPLOYMENT, "ns", "b"))
    assert r.queries[promql.REQUESTS] == (
        'sum(increase(route_response_total{deployment="web", direction="outbound", '
        'dst=~"(a.ns.svc.cluster.local|b.ns.svc.cluster.local)(:\\\\d+)?", namespace="ns"}[1m])) '
        "by (rt_route, dst, classification)")
    assert promql.ACTUAL_REQUESTS in r.queries
    assert promql.ACTUAL_REQUESTS not in promql.routes(Target(DEPLOYMENT, "ns", "web"), "1m", []).queries
    e = promql.edges("deployment")
    assert e.queries[promql.TCP_CONNECTIONS] == (
        'sum(tcp_open_connections{deployment!="", direction="outbound", dst_deployment!=""}) '
        "by (deployment, dst_deployment, pod, server_id, namespace, dst_namespace, no_tls_reason)")
    a = promql.authz(Target(DEPLOYMENT, "ns", "web"), "1m")
    assert a.queries[promql.ALLOWED] == (
        'sum(increase(inbound_http_authz_allow_total{deployment="web", namespace="ns"}[1m])) '
        "by (route_kind, route_name, authz_kind, authz_name, srv_kind, srv_name)")


def test_label_values_are_escaped() -> None:
    assert promql.selector({"a": 'x"y\\z'}) == '{a="x\\"y\\\\z"}'


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("1m", 60), ("1h30m", 5400), ("500ms", 0.5)])
def test_window_seconds(text: str, seconds: float) -> None:
    assert window_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10", "m", "0s", "1x"])
def test_bad_windows_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        window_seconds(text)


# -- discovery target groups ----------------------------------------------------------------------


def test_target_groups_carry_kubernetes_discovery_s_labels() -> None:
    pod = meshed_pod("web-5d8f7c9b4-abcde", "emojivoto", "web", 4191, ip="10.1.0.5")
    groups = scrape_config.pod_target_groups([pod, {"metadata": {"name": "no-ip"}, "status": {}}])
    by_target = {g["targets"][0]: g["labels"] for g in groups}
    assert set(by_target) == {"10.1.0.5:4143", "10.1.0.5:4191", "10.1.0.5:8080"}
    admin = by_target["10.1.0.5:4191"]
    assert admin["__meta_kubernetes_pod_container_name"] == "linkerd-proxy"
    assert admin["__meta_kubernetes_pod_container_port_name"] == "linkerd-admin"
    assert admin["__meta_kubernetes_pod_container_init"] == "true"
    assert admin["__meta_kubernetes_pod_label_linkerd_io_proxy_deployment"] == "web"
    assert admin["__meta_kubernetes_pod_label_linkerd_io_control_plane_ns"] == "linkerd"
    assert admin["__meta_kubernetes_pod_phase"] == "Running"
    assert admin["__meta_kubernetes_pod_controller_kind"] == "ReplicaSet"


def test_the_proxy_job_keeps_only_this_control_plane_s_proxies() -> None:
    relabel = scrape_config.proxy_relabel_configs("linkerd")
    keep = relabel[1]
    assert keep["action"] == "keep" and keep["regex"] == "^linkerd-proxy;linkerd-admin;linkerd$"
    assert {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_linkerd_io_proxy_(.+)"} in relabel


# -- tables ---------------------------------------------------------------------------------------


def test_stat_table_formats_like_linkerd() -> None:
    stats = Stats(success=92, failure=8, mtls=100, latency_ms={"0.5": 2.0, "0.95": 0.5, "0.99": None}, tcp_open=3,
                  read_bytes=600, write_bytes=None)
    rows = [Row(DEPLOYMENT, "ns", "web", stats, 1, 2), Row(DEPLOYMENT, "ns", "idle", None, 0, 0)]
    grid = tables.stat_table(rows, 60, all_namespaces=False, wide=True)
    assert grid[1] == ["web", "1/2", "92.00%", "1.7rps", "2ms", "0.5ms", "-", "3", "10.0B/s", "-", "100%"]
    assert grid[2] == ["idle", "0/0", "-", "-", "-", "-", "-", "-", "-", "-", "-"]


def test_edges_table_says_why_not_mtls() -> None:
    edges = [Edge("ns", "a", "ns", "b", DEPLOYMENT, "a.ns.serviceaccount.identity.linkerd.cluster.local",
                  "b.ns.serviceaccount.identity.linkerd.cluster.local", ""),
             Edge("ns", "c", "ns", "b", DEPLOYMENT, "", "", "Not Provided By Remote")]
    grid = tables.edges_table(edges, wide=True)
    assert grid[1] == ["a", "b", "ns", "ns", "√", "a.ns", "b.ns", "-"]
    assert grid[2][4] == "Not Provided By Remote"


# -- workloads ------------------------------------------------------------------------------------


def _pod(name: str, deploy: str | None, *, ns: str = "emojivoto", meshed: bool = True, phase: str = "Running",
         ip: str | None = "10.0.0.9") -> dict:
    labels = {"app": deploy or name}
    meta: dict = {"name": name, "namespace": ns, "labels": labels}
    if deploy:
        labels["pod-template-hash"] = "abc12"
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deploy}-abc12",
                                    "controller": True}]
    if meshed:
        labels["linkerd.io/control-plane-ns"] = "linkerd"
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def _deploy(name: str, ns: str = "emojivoto") -> dict:
    return {"metadata": {"name": name, "namespace": ns}}


def test_pods_belong_to_the_deployment_of_their_replicaset() -> None:
    assert deployment_of(_pod("web-abc12-x", "web")) == "web"
    assert deployment_of(_pod("my-app-abc12-x", "my-app")) == "my-app"
    assert deployment_of(_pod("bare", None)) is None
    odd = _pod("x", "web")
    odd["metadata"]["labels"]["pod-template-hash"] = "zzz"
    assert deployment_of(odd) is None


def test_select_groups_pods_by_deployment_counts_meshed_and_keeps_empty_deployments() -> None:
    pods = [_pod("web-abc12-a", "web"), _pod("web-abc12-b", "web", meshed=False),
            _pod("web-abc12-c", "web", phase="Succeeded"), _pod("emoji-abc12-a", "emoji", phase="Pending", ip=None),
            _pod("bare", None)]
    found = select(DEPLOYMENT, pods, deployments=[_deploy("web"), _deploy("emoji"), _deploy("idle")])
    assert [(w.name, w.meshed, w.total) for w in found] == [("emoji", 1, 1), ("idle", 0, 0), ("web", 1, 2)]
    web = found[-1]
    assert [p.name for p in web.pods if p.scrapable] == ["web-abc12-a"]
    assert [w.name for w in select(DEPLOYMENT, pods, deployments=[_deploy("web"), _deploy("emoji")],
                                   names=["web"])] == ["web"]


def test_select_pods_and_namespaces() -> None:
    pods = [_pod("a", None), _pod("b", None, ns="other", meshed=False)]
    assert [(w.namespace, w.name) for w in select(POD, pods)] == [("emojivoto", "a"), ("other", "b")]
    spaces = select(NAMESPACE, pods, namespaces=[{"metadata": {"name": "empty"}}])
    assert [(w.name, w.meshed, w.total) for w in spaces] == [("emojivoto", 1, 1), ("empty", 0, 0), ("other", 0, 1)]
