"""Run inside a fresh network namespace (``unshare --net``, as root) by test_admin_policy.py.

A meshed scraper reaches another pod's admin port as on a cluster: its app
connects to the pod's IP on 4191, a nat OUTPUT rule (proxy-init's part)
sends that to its own proxy's outbound port, and its proxy -- the destination
naming the pod's identity and hinting HTTP/2 -- opens mesh TLS to the pod's
admin port (proxy-init never redirects 4191 inbound) and carries the request
upgraded to HTTP/2. The pod's proxy authorizes it under the admin port's
policy: a stand-in policy controller (``FakeController``) streams an
allow-scrapes Server admitting the scraper's identity only.

Exits 0 on success, 77 when the namespace cannot be set up, anything else on failure.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from netns_scenario import SKIP, PodAddresses, sh  # noqa: E402
from proxy_harness import Mesh, connection, parse_metrics, read_all, run  # noqa: E402
from test_admin_policy import ADMIN, admin_policy, allow_scrapes, counts, get  # noqa: E402
from test_policy_client import FakeController  # noqa: E402


async def scenario(tmp: Path) -> None:
    controller = FakeController()
    grpc_server, port = await controller.serve()
    try:
        async with Mesh(tmp, addresses=PodAddresses(), transport_header=False) as mesh:
            server = mesh.pod("web-0", app="web")
            scraper = mesh.pod("prometheus-0", app="prometheus", sa="prometheus")
            intruder = mesh.pod("web-1", app="web")
            scraper_app, intruder_app = mesh.addresses.ip(), mesh.addresses.ip()
            for app, pod in ((scraper_app, scraper), (intruder_app, intruder)):
                sh("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-s", app, "-d", server.ip, "--dport",
                   str(ADMIN), "-j", "DNAT", "--to-destination", f"{pod.ip}:4140")
            env = {"LINKERD2_PROXY_POLICY_SVC_ADDR": f"127.0.0.1:{port}",
                   "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY": "deny"}
            proxy = await mesh.start_proxy(server, **env)
            controller.queue(ADMIN).put_nowait(allow_scrapes(scraper.identity))
            await admin_policy(proxy, "proxy-admin")
            for pod in (scraper, intruder):
                await mesh.start_proxy(pod, LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS="10.0.0.0/8")

            async def scrape(app: str) -> tuple[int, bytes]:
                async with connection(server.ip, ADMIN, local_addr=(app, 0)) as (reader, writer):
                    writer.write(b"GET /metrics HTTP/1.1\r\nhost: web-0:4191\r\nconnection: close\r\n\r\n")
                    raw = await read_all(reader)
                head, _, body = raw.partition(b"\r\n\r\n")
                return int(head.split()[1]), body

            status, body = await scrape(scraper_app)
            assert status == 200 and b"inbound_http_authz_allow_total" in body, (status, body[:300])
            assert (await scrape(intruder_app))[0] == 403
            metrics = parse_metrics((await get(proxy, "/metrics", source="127.0.0.1"))[2].decode())
            # (this read, from localhost, is admitted by default:localhost: a series of its own)
            [(labels, count)] = counts(metrics["inbound_http_authz_allow_total"], srv_name="proxy-admin", tls="true")
            assert (labels["client_id"], labels["tls"], count) == (scraper.identity, "true", 1.0), labels
            [(labels, count)] = counts(metrics["inbound_http_authz_deny_total"], srv_name="proxy-admin")
            assert (labels["client_id"], count) == (intruder.identity, 1.0), labels
    finally:
        await grpc_server.stop(None)


def main() -> int:
    try:
        sh("ip", "link", "set", "lo", "up")
        sh("iptables", "-t", "nat", "-L", "-n")
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot set up the namespace: {exc}", file=sys.stderr)
        return SKIP
    run(scenario(Path(sys.argv[1])))
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as exc:
        if exc.errno == errno.EPERM:
            sys.exit(SKIP)
        raise
