"""A real Prometheus (Debian's binary) scraping fake proxies on loopback through viz's scrape configuration.

No root needed: the "pods" are Pod objects whose IP is 127.0.0.1 and whose
``linkerd-admin`` port is a small HTTP server serving a proxy's ``/metrics``.
Prometheus finds them through the file-based discovery viz writes, relabels
them with Linkerd's rules, and the metrics API's PromQL reads them back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tether.cli.main import cli
from tether.store import Store
from tether.viz import metrics_api as api
from tether.viz.prometheus import Prometheus, PrometheusError
from tether.viz.targets import DEPLOYMENT, NAMESPACE, POD, SERVICE, Target
from viz.promlab import EMOJI_ID, NS, PROMETHEUS, WEB_ID, Objects, deployment

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus package (dev/setup.sh)")

def test_relabelling_turns_pod_labels_into_linkerd_s_series_labels(lab) -> None:
    prom, _ = lab
    (sample, *_) = prom.client.query('response_total{deployment="web",classification="success",direction="inbound"}')
    labels = sample.labels
    assert labels["job"] == "linkerd-proxy"
    assert labels["namespace"] == NS and labels["pod"] == "web-5d8f7c9b4-abcde"
    assert labels["deployment"] == "web"  # linkerd.io/proxy-deployment
    assert labels["control_plane_ns"] == "linkerd" and labels["workload_ns"] == NS  # linkerd.io/*
    assert labels["app"] == "web" and labels["pod_template_hash"] == "5d8f7c9b4"  # plain pod labels
    assert not any(k.startswith(("proxy_", "__")) for k in labels if k != "__name__")
    # Only the proxies' admin ports are scraped: the app's port and linkerd-proxy's are dropped.
    targets = [t for t in prom.client.targets() if t["labels"]["job"] == "linkerd-proxy"]
    assert sorted(t["labels"]["pod"] for t in targets) == ["emoji-5d8f7c9b4-fghij", "web-5d8f7c9b4-abcde"]


def test_stat_inbound_per_deployment(lab) -> None:
    prom, objs = lab
    rows = api.stat_summary(prom.client, Objects(objs), Target(DEPLOYMENT, NS), "30s")
    by_name = {r.name: r for r in rows}
    assert set(by_name) == {"web", "emoji"}
    web = by_name["web"]
    assert (web.meshed, web.total) == (1, 1)
    assert web.stats is not None and web.stats.requests > 0
    assert web.stats.success_rate() == pytest.approx(10 / 12, rel=0.02)
    assert web.stats.mtls_share() == 1.0
    assert 2 <= web.stats.latency_ms["0.5"] <= 3  # every response in the (2, 3] ms bucket
    assert web.stats.tcp_open == 3
    assert by_name["emoji"].stats is None  # no traffic served


def test_stat_of_pods_and_namespaces(lab) -> None:
    prom, objs = lab
    (pod,) = [r for r in api.stat_summary(prom.client, Objects(objs), Target(POD, NS), "30s")
              if r.name.startswith("web")]
    assert pod.stats is not None and pod.stats.success_rate() == pytest.approx(10 / 12, rel=0.02)
    (ns,) = api.stat_summary(prom.client, Objects(objs), Target(NAMESPACE, None, NS), "30s")
    assert ns.name == NS and (ns.meshed, ns.total) == (2, 2) and ns.stats is not None


def test_stat_to_another_deployment_reads_the_outbound_side(lab) -> None:
    prom, objs = lab
    (row,) = api.stat_summary(prom.client, Objects(objs), Target(DEPLOYMENT, NS), "30s",
                              to=Target(DEPLOYMENT, NS, "emoji"))
    assert row.name == "web" and row.stats is not None
    assert row.stats.failure == 0 and row.stats.success > 0
    (row,) = api.stat_summary(prom.client, Objects(objs), Target(DEPLOYMENT, NS), "30s",
                              from_=Target(DEPLOYMENT, NS, "web"))
    assert row.name == "emoji" and row.stats is not None and row.stats.success > 0


def test_routes_with_effective_and_actual_counts(lab) -> None:
    prom, objs = lab
    rows = api.top_routes(prom.client, Objects(objs), Target(DEPLOYMENT, NS, "web"), "30s",
                          to=Target(DEPLOYMENT, NS, "emoji"))
    by_route = {r.name: r for r in rows}
    assert set(by_route) == {"GET /list", api.DEFAULT_ROUTE}
    listed = by_route["GET /list"].stats
    assert listed is not None
    # Route counters grow by a few per scrape: increase() extrapolates, counts round.
    assert listed.success_rate() == pytest.approx(4 / 5, abs=0.04)
    assert listed.actual_success_rate() == pytest.approx(4 / 7, abs=0.04)
    assert 10 <= listed.latency_ms["0.5"] <= 20
    assert by_route[api.DEFAULT_ROUTE].stats is None


def test_edges_name_both_identities(lab) -> None:
    prom, objs = lab
    (edge,) = api.edges(prom.client, Objects(objs), DEPLOYMENT, NS)
    assert (edge.src, edge.dst, edge.src_namespace, edge.dst_namespace) == ("web", "emoji", NS, NS)
    assert edge.server_id == EMOJI_ID and edge.client_id == WEB_ID and edge.no_tls_reason == ""


def test_authz_counts_per_authorization(lab) -> None:
    prom, _ = lab
    (row,) = api.authz(prom.client, Target(DEPLOYMENT, NS, "web"), "30s")
    assert row.extra["authz_name"] == "all-unauthenticated" and row.extra["srv_kind"] == "default"
    assert row.stats is not None and row.stats.allowed and row.stats.allowed > 0
    assert row.stats.success_rate() == pytest.approx(10 / 12, rel=0.02)


def _home(tmp_path: Path, objs: list[dict[str, Any]]) -> Path:
    with Store(tmp_path / "store.db") as store:
        for obj in objs:
            store.apply(obj)
    return tmp_path


def test_cli_stat_table_and_json(lab, tmp_path: Path) -> None:
    prom, objs = lab
    home = _home(tmp_path, objs)
    env = {"TETHER_HOME": str(home)}
    result = CliRunner().invoke(cli, ["viz", "stat", "deploy", "-n", NS, "-t", "30s", "--prometheus-url", prom.url],
                                env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header, *lines = result.output.splitlines()
    assert header.split() == ["NAME", "MESHED", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99",
                              "TCP_CONN"]
    web = next(line.split() for line in lines if line.startswith("web"))
    assert web[1] == "1/1" and web[2].endswith("%") and web[-1] == "3"
    one = CliRunner().invoke(cli, ["viz", "stat", "deploy/web", "-n", NS, "-o", "json", "-t", "30s"],
                               env={**env, "TETHER_PROMETHEUS_URL": prom.url}, catch_exceptions=False)
    assert one.exit_code == 0, one.output
    (row,) = json.loads(one.output)
    assert row["name"] == "web" and row["meshed"] == "1/1" and row["stats"]["success"] == pytest.approx(10 / 12, rel=0.02)


def test_cli_routes_edges_authz(lab, tmp_path: Path) -> None:
    prom, objs = lab
    env = {"TETHER_HOME": str(_home(tmp_path, objs)), "TETHER_PROMETHEUS_URL": prom.url}
    runner = CliRunner()
    routes = runner.invoke(cli, ["viz", "routes", "deploy/web", "-n", NS, "--to", "deploy/emoji", "-o", "wide",
                                 "-t", "30s"], env=env, catch_exceptions=False)
    assert routes.exit_code == 0, routes.output
    assert routes.output.splitlines()[0].split()[:6] == ["ROUTE", "SERVICE", "EFFECTIVE_SUCCESS", "EFFECTIVE_RPS",
                                                         "ACTUAL_SUCCESS", "ACTUAL_RPS"]
    listed = next(line for line in routes.output.splitlines() if line.startswith("GET /list"))
    cells = listed.split()  # GET /list emoji EFFECTIVE_SUCCESS EFFECTIVE_RPS ACTUAL_SUCCESS ...
    assert float(cells[3].rstrip("%")) == pytest.approx(80, abs=3)  # increase() extrapolates; counts round
    assert float(cells[5].rstrip("%")) == pytest.approx(400 / 7, abs=3)
    edges = runner.invoke(cli, ["viz", "edges", "deploy", "-n", NS, "-o", "wide"], env=env, catch_exceptions=False)
    assert edges.exit_code == 0, edges.output
    assert edges.output.splitlines()[1].split() == ["web", "emoji", NS, NS, "√", "web.emojivoto", "emoji.emojivoto",
                                                    "-"]
    authz = runner.invoke(cli, ["viz", "authz", "deploy/web", "-n", NS, "-t", "30s"], env=env, catch_exceptions=False)
    assert authz.exit_code == 0, authz.output
    assert "default/all-unauthenticated" in authz.output


def test_prometheus_down_is_a_clear_error_naming_the_url(tmp_path: Path) -> None:
    home = _home(tmp_path, [deployment("web", NS)])
    url = "http://127.0.0.1:1"
    result = CliRunner().invoke(cli, ["viz", "stat", "deploy", "-n", NS, "--prometheus-url", url],
                                env={"TETHER_HOME": str(home)})
    assert result.exit_code == 1
    assert f"cannot reach Prometheus at {url}" in result.output and "Traceback" not in result.output
    with pytest.raises(PrometheusError, match="not a Prometheus URL"):
        Prometheus("localhost:9090")


def test_no_prometheus_configured_says_what_to_do(tmp_path: Path) -> None:
    home = _home(tmp_path, [deployment("web", NS)])
    result = CliRunner().invoke(cli, ["viz", "stat", "deploy"], env={"TETHER_HOME": str(home)})
    assert result.exit_code == 1 and "tether viz install" in result.output and "--prometheus-url" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["viz", "stat", "widgets"], "unknown resource type 'widgets'"),
    (["viz", "stat", "deploy", "-t", "soon"], "not a duration"),
    (["viz", "stat", "deploy", "--to", "deploy/a", "--from", "deploy/b"], "cannot be used together"),
    (["viz", "edges", "deploy/web"], "not one object"),
])
def test_usage_errors_name_the_argument(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args, env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 2 and message in result.output, result.output


def test_stat_inbound_per_server_and_route(lab, tmp_path: Path) -> None:
    prom, objs = lab
    (row,) = api.stat_inbound(prom.client, Target(DEPLOYMENT, NS, "web"), "30s")
    assert row.name == "web"
    assert row.extra == {"server": "[default]", "port": "8080", "route": "[default]", "route_type": ""}
    assert row.stats is not None and row.stats.success_rate() == pytest.approx(10 / 12, rel=0.02)
    env = {"TETHER_HOME": str(_home(tmp_path, objs)), "TETHER_PROMETHEUS_URL": prom.url}
    result = CliRunner().invoke(cli, ["viz", "stat-inbound", "deploy/web", "-n", NS, "-t", "30s"], env=env,
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header, line = result.output.splitlines()
    assert header.split() == ["NAME", "SERVER", "ROUTE", "TYPE", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95",
                              "LATENCY_P99"]
    assert line.split()[:3] == ["web", "[default]:8080", "[default]"]


def test_stat_outbound_per_service_route_and_backend(lab, tmp_path: Path) -> None:
    prom, objs = lab
    route, *backends = api.stat_outbound(prom.client, Target(DEPLOYMENT, NS, "web"), "30s")
    assert route.name == "web" and route.extra == {"service": "emoji", "port": "8080", "route": "emoji-split",
                                                   "route_type": "HTTPRoute", "backend": "", "backend_port": ""}
    s = route.stats
    assert s is not None and s.success_rate() == pytest.approx(4 / 5, rel=0.02)
    assert s.timeouts / s.requests == pytest.approx(1 / 5, rel=0.05)
    assert s.retries / (s.requests + s.retries) == pytest.approx(2 / 7, rel=0.05)
    assert s.latency_ms["0.5"] is not None and s.latency_ms["0.5"] <= 50  # every request in the 50 ms bucket
    assert [(b.extra["backend"], b.extra["route"]) for b in backends] == [("emoji-v1", "emoji-split"),
                                                                          ("emoji-v2", "emoji-split")]
    assert backends[0].stats.attempts / backends[1].stats.attempts == pytest.approx(4 / 3, rel=0.05)
    # Each backend's own answers: its success, latency and timeouts (not the route's).
    v1, v2 = (b.stats for b in backends)
    assert v1.success_rate() == pytest.approx(38 / 40, rel=0.02) and v2.success_rate() == pytest.approx(1 / 2, rel=0.05)
    assert v1.latency_ms["0.5"] <= 25 and 250 <= v2.latency_ms["0.5"] <= 500
    assert v1.timeouts == 0 and v2.timeouts / v2.requests == pytest.approx(1 / 2, rel=0.05)
    env = {"TETHER_HOME": str(_home(tmp_path, objs)), "TETHER_PROMETHEUS_URL": prom.url}
    result = CliRunner().invoke(cli, ["viz", "stat-outbound", "deploy/web", "-n", NS, "-t", "30s"], env=env,
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    header, first, v1, v2 = result.output.splitlines()
    assert header.split() == ["NAME", "SERVICE", "ROUTE", "TYPE", "BACKEND", "SUCCESS", "RPS", "LATENCY_P50",
                              "LATENCY_P95", "LATENCY_P99", "TIMEOUTS", "RETRIES"]
    assert first.split()[:4] == ["web", "emoji:8080", "emoji-split", "HTTPRoute"]
    assert v1.split()[:3] == ["├──────────", "────────►", "emoji-v1:8080"]
    assert v2.split()[:3] == ["└──────────", "────────►", "emoji-v2:8080"]
    assert float(v1.split()[3].removesuffix("%")) == pytest.approx(95, abs=1.5)  # the backend's success
    assert float(v2.split()[-1].removesuffix("%")) == pytest.approx(50, abs=3)  # its timeouts
    doc = json.loads(CliRunner().invoke(cli, ["viz", "stat-outbound", "deploy/web", "-n", NS, "-t", "30s", "-o",
                                              "json"], env=env).output)
    assert doc[0]["stats"]["timeout_count"] > 0 and doc[1]["stats"]["backend_request_count"] > 0
    refused = CliRunner().invoke(cli, ["viz", "stat-outbound", "svc/emoji", "-n", NS], env=env)
    assert refused.exit_code == 1 and "stat-outbound shows what sends traffic" in refused.output


def test_routes_of_a_service_without_a_profile_are_its_client_policy_routes(lab, tmp_path: Path) -> None:
    prom, objs = lab
    plain = [o for o in objs if o["kind"] != "ServiceProfile"]
    (row,) = api.top_routes(prom.client, Objects(plain), Target(DEPLOYMENT, NS, "web"), "30s",
                            to=Target(SERVICE, NS, "emoji"))
    assert (row.name, row.extra) == ("emoji-split", {"authority": "emoji", "route_type": "HTTPRoute"})
    assert row.stats is not None and row.stats.success_rate() == pytest.approx(4 / 5, rel=0.02)
    assert row.stats.attempts / row.stats.requests == pytest.approx(7 / 5, rel=0.05)  # tries: answers + retries
    env = {"TETHER_HOME": str(_home(tmp_path, plain)), "TETHER_PROMETHEUS_URL": prom.url}
    wide = CliRunner().invoke(cli, ["viz", "routes", "deploy/web", "-n", NS, "--to", "svc/emoji", "-t", "30s", "-o",
                                    "wide"], env=env, catch_exceptions=False)
    assert wide.exit_code == 0, wide.output
    header, line = wide.output.splitlines()
    assert header.split()[:6] == ["ROUTE", "SERVICE", "EFFECTIVE_SUCCESS", "EFFECTIVE_RPS", "ACTUAL_SUCCESS",
                                  "ACTUAL_RPS"]
    cells = line.split()
    assert cells[:2] == ["emoji-split", "emoji"]
    # ACTUAL_SUCCESS: the tries' answers (53 of 70), before retries hid failures; EFFECTIVE: the requests' (4 of 5).
    assert float(cells[4].removesuffix("%")) == pytest.approx(100 * 53 / 70, abs=2)
    assert float(cells[2].removesuffix("%")) == pytest.approx(80, abs=2)
    effective, actual = float(cells[3].removesuffix("rps")), float(cells[5].removesuffix("rps"))
    assert actual / effective == pytest.approx(7 / 5, rel=0.1)
    # Without --to, the routes web serves under its inbound policy (the series' default server and route).
    (served,) = api.top_routes(prom.client, Objects(plain), Target(DEPLOYMENT, NS, "web"), "30s")
    assert (served.name, served.extra) == ("[default]", {"authority": "[default]", "route_type": ""})
    assert served.stats is not None and served.stats.success_rate() == pytest.approx(10 / 12, rel=0.02)
    inbound = CliRunner().invoke(cli, ["viz", "routes", "deploy/web", "-n", NS, "-t", "30s"], env=env)
    assert inbound.exit_code == 0 and inbound.output.splitlines()[1].split()[:2] == ["[default]", "[default]"]
    # Neither a profile nor policy-route traffic: the error says both.
    none = CliRunner().invoke(cli, ["viz", "routes", "deploy/emoji", "-n", NS, "--to", "deploy/web"], env=env)
    assert none.exit_code == 1 and "nor an HTTPRoute or GRPCRoute of it, nor traffic on one" in none.output


def _route(kind: str, name: str, namespace: str, parent: dict[str, Any]) -> dict[str, Any]:
    group = "policy.linkerd.io/v1beta3" if kind == "HTTPRoute" else "gateway.networking.k8s.io/v1"
    return {"apiVersion": group, "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": [parent], "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]}}


def test_policy_routes_without_traffic_are_listed_without_figures(lab, tmp_path: Path) -> None:
    """As ``linkerd viz routes`` lists a profile's routes with "-": an HTTPRoute or GRPCRoute of the Service (or of a
    Server selecting the pods) that carried nothing in the window still has its row; another parent's does not."""
    prom, objs = lab
    emoji = {"group": "core", "kind": "Service", "name": "emoji", "port": 8080}
    web_server = {"group": "policy.linkerd.io", "kind": "Server", "name": "web-http"}
    declared = [
        _route("HTTPRoute", "emoji-split", NS, emoji),  # carried traffic: its row has figures, once
        _route("HTTPRoute", "emoji-canary", NS, emoji),
        _route("GRPCRoute", "emoji-grpc", NS, emoji),
        _route("HTTPRoute", "voting-route", NS, {**emoji, "name": "voting"}),  # another Service
        {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "web-http", "namespace": NS},
         "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080, "proxyProtocol": "HTTP/1"}},
        {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server", "metadata": {"name": "emoji-http", "namespace": NS},
         "spec": {"podSelector": {"matchLabels": {"app": "emoji"}}, "port": 8080}},
        _route("HTTPRoute", "web-api", NS, web_server),
        _route("HTTPRoute", "emoji-only", NS, {**web_server, "name": "emoji-http"}),  # a Server not of web's pods
    ]
    plain = [o for o in objs if o["kind"] != "ServiceProfile"] + declared
    rows = api.top_routes(prom.client, Objects(plain), Target(DEPLOYMENT, NS, "web"), "30s",
                          to=Target(SERVICE, NS, "emoji"))
    assert [(r.name, r.extra["route_type"], r.stats is not None) for r in rows] == [
        ("emoji-split", "HTTPRoute", True), ("emoji-canary", "HTTPRoute", False), ("emoji-grpc", "GRPCRoute", False)]
    served = api.top_routes(prom.client, Objects(plain), Target(DEPLOYMENT, NS, "web"), "30s")
    assert [(r.name, r.extra["authority"], r.stats is not None) for r in served] == [
        ("[default]", "[default]", True), ("web-api", "web-http", False)]
    # The CLI over the local store: the route without traffic prints "-" in every figure.
    env = {"TETHER_HOME": str(_home(tmp_path, plain)), "TETHER_PROMETHEUS_URL": prom.url}
    out = CliRunner().invoke(cli, ["viz", "routes", "deploy/web", "-n", NS, "--to", "svc/emoji", "-t", "30s"],
                             env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    canary = next(line.split() for line in out.output.splitlines() if line.startswith("emoji-canary"))
    assert canary[1] == "emoji" and set(canary[2:]) == {"-"}
    # Routes but no traffic at all (emoji's clients): rows without figures, not an error.
    idle = api.top_routes(prom.client, Objects(plain), Target(DEPLOYMENT, NS, "emoji"), "30s",
                          to=Target(SERVICE, NS, "emoji"))
    assert [(r.name, r.stats) for r in idle] == [("emoji-canary", None), ("emoji-grpc", None), ("emoji-split", None)]
