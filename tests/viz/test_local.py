"""Viz on the local platform: `tether viz install` starts a real Prometheus that scrapes real meshed pods.

Needs root (the platform's pods are network namespaces); skipped otherwise by
the ``tests/up`` fixtures, which also tear everything down and check the host.
"""

from __future__ import annotations

import json

from up import uplab
from up.uplab import client, ready, wait_for, web_server
from viz.promlab import free_port

from tether.viz.prometheus import Prometheus, PrometheusError

NS = "vizns"
NAMESPACE = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}
"""
IDENTITY = f"default.{NS}.serviceaccount.identity.linkerd.cluster.local"
WEB_PROFILE = f"""
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {{name: web.{NS}.svc.cluster.local, namespace: {NS}}}
spec:
  routes:
  - name: GET /
    condition: {{method: GET, pathRegex: /}}
"""


def _json(p: uplab.Platform, *args: str) -> object:
    return json.loads(p.tether(*args, "-o", "json").stdout)


def test_viz_install_scrapes_the_mesh_and_stat_routes_edges_show_the_traffic(new_platform) -> None:
    p = new_platform()
    p.tether("up", *p.up_args, "--restart-backoff", "0.5")
    port = free_port()
    p.tether("viz", "install", "--prometheus-port", str(port), "--discovery-port", str(free_port()),
             "--tap-port", str(free_port()), "--tap-admin-port", str(free_port()), "--scrape-interval", "1s")
    prom = Prometheus(f"http://127.0.0.1:{port}")
    p.apply(NAMESPACE)
    p.apply(web_server("web", NS, 1))
    p.apply(client("client", NS, f"http://web.{NS}.svc.cluster.local/"))
    p.apply(web_server("quiet", NS, 1, annotations='viz.linkerd.io/disable-tap: "true"'))

    def pods_ready() -> list[dict] | None:
        pods = p.pods(NS)
        return pods if len(pods) == 3 and all(ready(x) for x in pods) else None

    pods = wait_for("web and client ready", pods_ready, timeout=90)
    caller = next(x["metadata"]["name"] for x in pods if x["metadata"]["name"].startswith("client-"))
    wait_for("answers through both proxies",
             lambda: p.logs(NS, caller).count("ok 200") >= 5, timeout=60)

    # Prometheus holds Linkerd's series, labelled by the relabelling (deployment, namespace, pod).
    series = wait_for("client's outbound responses in Prometheus", lambda: prom.query(
        f'response_total{{namespace="{NS}",deployment="client",direction="outbound",dst_deployment="web"}}'),
        timeout=60)
    assert series[0].labels["job"] == "linkerd-proxy" and series[0].labels["pod"] == caller
    # Each controller is up once its first scrape lands: wait for both rather than read one moment.
    wait_for("identity and destination scraped as up", lambda: {"identity", "destination"} <= {
        s.labels.get("component") for s in prom.query('up{job="linkerd-controller"} == 1')}, timeout=30)

    # stat --to: what client sent web, all successful, all over mTLS; no more than it logged.
    def to_web() -> dict | None:
        rows = _json(p, "viz", "stat", "deploy/client", "-n", NS, "--to", "deploy/web", "-t", "30s")
        return rows[0] if rows and rows[0]["stats"] and rows[0]["stats"]["success_count"] >= 3 else None

    row = wait_for("stat --to with traffic", to_web, timeout=60)
    logged = p.tether("logs", "-n", NS, caller).stdout.count("ok 200")
    stats = row["stats"]
    assert stats["failure_count"] == 0 and stats["mtls_share"] == 1.0
    assert stats["success_count"] <= logged * 1.2 + 5  # increase() extrapolates a little past the samples

    # Inbound stat: web served requests, and both deployments are meshed.
    rows = {r["name"]: r for r in _json(p, "viz", "stat", "deploy", "-n", NS, "-t", "30s")}
    assert rows["web"]["meshed"] == "1/1" and rows["client"]["meshed"] == "1/1"
    assert rows["web"]["stats"]["success_count"] > 0

    # Edges: client -> web over mTLS, with both identities.
    edges = wait_for("the client -> web edge", lambda: _json(p, "viz", "edges", "deploy", "-n", NS), timeout=30)
    (edge,) = [e for e in edges if (e["src"], e["dst"]) == ("client", "web")]
    assert edge["secured"] and edge["client_id"] == IDENTITY and edge["server_id"] == IDENTITY

    # viz check: Linkerd's linkerd-viz category as the local platform answers it; --proxy adds the data plane's.
    checked = p.tether("viz", "check", "--proxy", "-n", NS, "--wait", "60s").stdout
    for line in ("linkerd-viz", "√ viz is installed", "√ tap server has valid cert",
                 "√ viz extension components are running", "√ viz extension components are ready",
                 "√ viz extension self-check", "√ prometheus is installed and configured correctly",
                 "linkerd-viz-data-plane", "√ data plane proxy metrics are present in Prometheus"):
        assert line in checked, checked
    wrong = p.tether("viz", "check", "--proxy", "-n", "nowhere", "--wait", "0", ok=False).stdout
    assert '× data plane namespace exists' in wrong and 'the "nowhere" namespace does not exist' in wrong, wrong

    # Tap: pods created while viz is installed got the tap injector's env (not the one that disables it), so
    # their proxies serve Observe to the tap server, which streams each request's three events.
    by_app = {x["metadata"]["labels"]["app"]: x for x in pods}
    assert by_app["web"]["metadata"]["annotations"]["viz.linkerd.io/tap-enabled"] == "true"
    assert "viz.linkerd.io/tap-enabled" not in by_app["quiet"]["metadata"].get("annotations", {})
    lines = uplab.tap_lines(p, "deploy/web", "-n", NS, "--path", "/", want=6)
    req = next(line for line in lines if line.startswith("req "))
    assert "proxy=in" in req and "tls=true" in req and ":method=GET" in req and ":path=/" in req, lines
    assert f":authority=web.{NS}.svc.cluster.local" in req, lines
    # The source is the client's address as the server's proxy accepted it: the client pod's.
    client_ip = by_app["client"]["status"]["podIP"]
    assert f" src={client_ip}:" in req, lines
    assert any(line.startswith("rsp ") and ":status=200" in line for line in lines), lines
    end = next(line for line in lines if line.startswith("end "))
    assert "response-length=0B" not in end, lines  # the body's bytes the proxy relayed
    # -o wide: both sides named from the pods at their addresses, with their namespace.
    wide = next(line for line in uplab.tap_lines(p, "deploy/web", "-n", NS, "-o", "wide", want=3)
                if line.startswith("req "))
    assert wide.endswith(f"src_res=deploy/client src_ns={NS} dst_res=deploy/web dst_ns={NS}"), wide
    out = uplab.tap_lines(p, "deploy/client", "-n", NS, "--to", "deploy/web", want=3)
    assert out[0].startswith("req ") and "proxy=out" in out[0] and "tls=true" in out[0], out
    assert f" src={client_ip}:" in out[0], out  # the app's own socket, in its pod
    # top: the busiest paths from the same taps, printed as plain tables when piped (client -> web, GET /).
    # (A table is printed at most once a second, after an event: the first may have no finished request yet.)
    top = uplab.tap_lines(p, "deploy/web", "-n", NS, want=8, command="top")
    assert top[0].split()[:4] == ["SOURCE", "DESTINATION", "METHOD", "PATH"], top
    assert any(line.split()[2:4] == ["GET", "/"] for line in top), top

    # routes: web has no ServiceProfile, so the client's policy route to web's Service, with its traffic
    # (all successful, tries included); authz: web's inbound authorization allowed them, denied none.
    def routed() -> list | None:
        rows = _json(p, "viz", "routes", "deploy/client", "-n", NS, "--to", "svc/web", "-t", "30s")
        return rows if rows and rows[0]["stats"] and rows[0]["stats"]["success_count"] > 0 else None

    (route,) = wait_for("the client's route to web with traffic", routed, timeout=60)
    assert route["authority"] == "web" and route["stats"]["failure_count"] == 0, route
    assert route["stats"]["actual_success_count"] >= route["stats"]["success_count"] > 0, route
    # The kubelet's probes of web's proxy (its admin port is under inbound policy) come under the policy
    # controller's probe route: a row of their own, as in Linkerd's viz authz.
    rows = [r for r in _json(p, "viz", "authz", "deploy/web", "-n", NS, "-t", "30s") if r["stats"]]
    assert {r["route_name"] for r in rows} <= {"default", "probe"}, rows
    (allowed,) = [r for r in rows if r["route_name"] == "default"]
    assert allowed["stats"]["allowed_count"] > 0 and not allowed["stats"]["denied_count"], allowed
    # stat-outbound: the client's requests per Service port and route (web:80, the default route) and the
    # backend they went to; stat-inbound: web's, per server and route of its inbound policy.
    outbound = _json(p, "viz", "stat-outbound", "deploy/client", "-n", NS, "-t", "30s")
    route_row = next(r for r in outbound if not r["backend"])
    assert (route_row["service"], route_row["port"]) == ("web", "80") and route_row["stats"]["success_count"] > 0
    assert any(r["backend"] == "web" for r in outbound), outbound
    inbound = _json(p, "viz", "stat-inbound", "deploy/web", "-n", NS, "-t", "30s")
    assert inbound and all(r["stats"]["failure_count"] == 0 for r in inbound), inbound
    assert sum(r["stats"]["success_count"] for r in inbound) > 0, inbound

    # routes without --to, once web has a ServiceProfile: the route as web's own proxy served it (the client's
    # proxy names the profile in l5d-dst-canonical; web's looks it up and counts route_*{direction="inbound"}).
    p.apply(WEB_PROFILE)

    def served() -> dict | None:
        rows = _json(p, "viz", "routes", "deploy/web", "-n", NS, "-t", "30s")
        row = next((r for r in rows if r["name"] == "GET /"), None)
        return row if row and row["stats"] and row["stats"]["success_count"] > 0 else None

    served_row = wait_for("web's profile route with inbound traffic", served, timeout=60)
    assert served_row["stats"]["failure_count"] == 0, served_row

    quiet = by_app["quiet"]["metadata"]["name"]
    refused = p.tether("viz", "tap", "deploy/quiet", "-n", NS, ok=False)
    assert f"{quiet}: tap disabled (viz.linkerd.io/disable-tap)" in refused.stderr

    # `tether down` stops viz with the mesh; `tether up` starts it again, installed, with its saved settings.
    p.tether("down")
    try:
        prom.query("up")
        raise AssertionError("Prometheus still answers after `tether down`")
    except PrometheusError:
        pass
    restarted = p.tether("up", *p.up_args, "--restart-backoff", "0.5", "--viz").stdout
    assert "prometheus" in restarted and "Prometheus is up at " + prom.url in restarted, restarted
    wait_for("Prometheus answering again", lambda: prom.query("up"), timeout=30)

    # Uninstalled, Prometheus is gone: a clear error naming its URL.
    p.tether("viz", "uninstall", "--purge")
    gone = p.tether("viz", "stat", "deploy", "-n", NS, "--prometheus-url", prom.url, ok=False)
    assert f"cannot reach Prometheus at {prom.url}" in gone.stderr
    uninstalled = p.tether("viz", "check", "--wait", "0", ok=False).stdout
    assert "× viz is installed" in uninstalled and "viz is not installed in" in uninstalled, uninstalled
    assert "linkerd-viz\n" not in uninstalled  # the fatal category stopped the rest
