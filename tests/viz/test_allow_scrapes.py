"""allow-scrapes on the local platform: a ``deny`` namespace's proxies refuse viz's Prometheus until
``tether viz allow-scrapes`` authorizes it, while the kubelet's probes pass all along.

Real platform (network namespaces, the real policy controller and proxies), real
Prometheus started by ``tether viz install``. Needs root; skipped otherwise by
the ``tests/up`` fixtures, which also tear everything down and check the host.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from up.uplab import wait_for, web_server
from viz.promlab import free_port

from tether.viz.prometheus import Prometheus

NS = "locked"
NAMESPACE = f"""
apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
  annotations: {{linkerd.io/inject: enabled, config.linkerd.io/default-inbound-policy: deny}}
"""


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_deny_namespace_is_scraped_only_once_allow_scrapes_authorizes_prometheus(new_platform) -> None:
    p = new_platform()
    p.tether("up", *p.up_args, "--restart-backoff", "0.5")
    port = free_port()
    p.tether("viz", "install", "--prometheus-port", str(port), "--discovery-port", str(free_port()),
             "--tap-port", str(free_port()), "--tap-admin-port", str(free_port()), "--scrape-interval", "1s")
    prom = Prometheus(f"http://127.0.0.1:{port}")
    p.apply(NAMESPACE)
    p.apply(web_server("web", NS, 1))
    # Ready means the platform's probes of the proxy's /ready (and the app's) passed under `deny`: the policy
    # controller's probe route for the admin port.
    [pod] = p.ready_pods(NS, 1, "web-")
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]

    def target() -> dict | None:
        return next((t for t in prom.targets() if t["labels"].get("pod") == name), None)

    down = wait_for("Prometheus refused by the deny pod's proxy",
                    lambda: (t := target()) and t["health"] == "down" and "403" in t.get("lastError", "") and t,
                    timeout=60)
    assert "403" in down["lastError"]
    # From the host, as Prometheus: /metrics refused, the probe paths answered (the probe route: any network).
    assert _status(f"http://{ip}:4191/metrics") == 403
    assert _status(f"http://{ip}:4191/ready") == 200
    # The refusals are counted by the proxy, under the deny default server (read from localhost: allowed).
    assert 'srv_name="deny"' in "".join(line for line in p.proxy_metrics(pod).splitlines()
                                        if line.startswith("inbound_http_authz_deny_total{"))

    # viz check names the pod (a warning), as Linkerd's; its proxy's metrics are missing from Prometheus.
    checked = p.tether("viz", "check", "--proxy", "-n", NS, "--wait", "0", ok=False).stdout
    assert "prometheus may not be authorized to scrape the following pods" in checked, checked
    assert f"* {name}" in checked and "tether viz allow-scrapes" in checked, checked

    p.apply(p.tether("viz", "allow-scrapes", "--namespace", NS).stdout)
    wait_for("Prometheus scraping the deny pod's proxy", lambda: (t := target()) and t["health"] == "up", timeout=60)
    assert _status(f"http://{ip}:4191/metrics") == 200
    assert _status(f"http://{ip}:4191/env.json") == 404  # the Server has routes for the metrics and probes only
    assert _status(f"http://{ip}:4191/ready") == 200  # the proxy-probes route
    samples = prom.query(f'process_start_time_seconds{{namespace="{NS}",pod="{name}"}}')
    assert len(samples) == 1
    assert p.pods(NS, "web-")[0]["metadata"]["name"] == name  # never restarted for failed probes
    checked = p.tether("viz", "check", "--proxy", "-n", NS, "--wait", "30s").stdout
    assert "√ prometheus is authorized to scrape data plane pods" in checked, checked
    assert "√ data plane proxy metrics are present in Prometheus" in checked, checked
