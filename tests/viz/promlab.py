"""Helpers for viz's tests: a real Prometheus on loopback, fake proxies that serve ``/metrics``, waiting.

``PrometheusProcess`` runs Debian's ``prometheus`` binary with the
configuration ``tether.viz.scrape_config`` writes (scraping every second),
on a free loopback port, data in a temporary directory; ``stop()`` ends it.
``FakeProxy`` serves a proxy's ``/metrics`` whose counters grow by a fixed
step on every scrape, so the increase over any window is a known ratio.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from up.uplab import wait_for

from tether.viz import scrape_config
from tether.viz.prometheus import Prometheus, PrometheusError

PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusProcess:
    def __init__(self, root: Path, pods: list[Mapping[str, Any]], *, control_plane_ns: str = "linkerd") -> None:
        assert PROMETHEUS, "prometheus is not installed (dev/setup.sh installs Debian's package)"
        self.root = root
        self.sd = root / "sd"
        self.sd.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        doc = scrape_config.prometheus_config(str(self.sd), f"127.0.0.1:{self.port}", control_plane_ns=control_plane_ns,
                                              scrape_interval="1s")
        (root / "prometheus.yml").write_text(yaml.safe_dump(doc))
        self.write_pods(pods)
        (self.sd / scrape_config.CONTROLLERS_FILE).write_text("[]")
        self.log = open(root / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.client = Prometheus(self.url)
        wait_for("Prometheus to be ready", self._ready, timeout=60)

    def write_pods(self, pods: list[Mapping[str, Any]]) -> None:
        (self.sd / scrape_config.PROXIES_FILE).write_text(json.dumps(scrape_config.pod_target_groups(pods)))

    def _ready(self) -> bool:
        assert self.proc.poll() is None, (self.root / "prometheus.log").read_text()
        try:
            self.client.ready()
        except PrometheusError:
            return False
        return True

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class FakeProxy:
    """``/metrics`` of a proxy; ``render(n)`` gives the text of the ``n``-th scrape."""

    def __init__(self, render: Callable[[int], str]) -> None:
        self.scrapes = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = render(fake.scrapes).encode()
                fake.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def meshed_pod(name: str, namespace: str, deployment: str, admin_port: int, *, ip: str = "127.0.0.1",
               service_account: str = "default", app: str | None = None) -> dict[str, Any]:
    """A Pod as the local platform stores a meshed one: labels, the proxy as a native sidecar, IP."""
    template_hash = "5d8f7c9b4"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"app": app or deployment, "pod-template-hash": template_hash,
                       "linkerd.io/control-plane-ns": "linkerd", "linkerd.io/workload-ns": namespace,
                       "linkerd.io/proxy-deployment": deployment},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deployment}-{template_hash}",
                                 "uid": f"rs-{deployment}", "controller": True}],
        },
        "spec": {"serviceAccountName": service_account,
                 "initContainers": [{"name": "linkerd-init", "image": "x"},
                                    {"name": "linkerd-proxy", "image": "x", "restartPolicy": "Always",
                                     "ports": [{"name": "linkerd-proxy", "containerPort": 4143},
                                               {"name": "linkerd-admin", "containerPort": admin_port}]}],
                 "containers": [{"name": "app", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip},
    }


def deployment(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": "x"}]}}}}


NS = "emojivoto"
WEB_ID = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
EMOJI_ID = "emoji.emojivoto.serviceaccount.identity.linkerd.cluster.local"
BUCKETS = (1, 2, 3, 4, 5, 10, 20, 30, 40, 50, 100, 200, 300, 400, 500, 1000)


def _histogram(name: str, labels: str, n: int, at_ms: int) -> list[str]:
    lines = [f'{name}_bucket{{{labels},le="{b}"}} {n if b >= at_ms else 0}' for b in BUCKETS]
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {n}')
    lines.append(f"{name}_count{{{labels}}} {n}")
    return lines


def web_metrics(n: int) -> str:
    """web: serves 10 ok + 2 failed per scrape (inbound, from emoji over mTLS); calls emoji 5 times per scrape."""
    inbound = (f'direction="inbound",target_addr="127.0.0.1:8080",target_ip="127.0.0.1",target_port="8080",'
               f'tls="true",client_id="{EMOJI_ID}",srv_group="",srv_kind="default",srv_name="all-unauthenticated",'
               'srv_port="8080",route_group="",route_kind="default",route_name="default",authz_group="",'
               'authz_kind="default",authz_name="all-unauthenticated"')
    outbound = (f'direction="outbound",authority="emoji.emojivoto.svc.cluster.local:8080",tls="true",'
                f'server_id="{EMOJI_ID}",dst_deployment="emoji",dst_namespace="emojivoto",dst_pod="emoji-1",'
                'dst_service="emoji",dst_serviceaccount="emoji"')
    route = 'direction="outbound",dst="emoji.emojivoto.svc.cluster.local:8080",rt_route="GET /list"'
    lines = [
        "# TYPE response_total counter",
        f'response_total{{{inbound},status_code="200",classification="success"}} {10 * n}',
        f'response_total{{{inbound},status_code="500",classification="failure"}} {2 * n}',
        f'response_total{{{outbound},status_code="200",classification="success"}} {5 * n}',
        f'route_response_total{{{route},classification="success"}} {4 * n}',
        f'route_response_total{{{route},classification="failure"}} {1 * n}',
        f'route_actual_response_total{{{route},classification="success"}} {4 * n}',
        f'route_actual_response_total{{{route},classification="failure"}} {3 * n}',
        f'tcp_open_connections{{direction="inbound",peer="src",target_port="8080",tls="true",'
        f'client_id="{EMOJI_ID}"}} 3',
        f'tcp_open_connections{{{outbound},peer="dst"}} 1',
        f'tcp_read_bytes_total{{direction="inbound",peer="src",tls="true"}} {100 * n}',
        f'inbound_http_authz_allow_total{{srv_kind="default",srv_name="all-unauthenticated",route_kind="default",'
        f'route_name="default",authz_kind="default",authz_name="all-unauthenticated",target_port="8080"}} {12 * n}',
        "process_start_time_seconds 1700000000",
    ]
    lines += _histogram("response_latency_ms", inbound, 12 * n, 3)
    lines += _histogram("route_response_latency_ms", route, 5 * n, 20)
    # Client policy (Linkerd 2.20's route families, as the proxy renders them): the HTTPRoute emoji-split on
    # emoji:8080 -- 40 answered and 10 timed out per scrape, 20 retries, tries drawn 4:3 by emoji-v1 and emoji-v2
    # (counts large enough that rounding increase() to whole requests stays small).
    parent = ('parent_group="core",parent_kind="Service",parent_namespace="emojivoto",parent_name="emoji",'
              'parent_port="8080",parent_section_name="",route_group="policy.linkerd.io",route_kind="HTTPRoute",'
              'route_namespace="emojivoto",route_name="emoji-split"')
    lines += [
        f'outbound_http_route_request_statuses_total{{{parent},hostname="",http_status="200",error=""}} {40 * n}',
        f'outbound_http_route_request_statuses_total{{{parent},hostname="",http_status="",error="REQUEST_TIMEOUT"}} {10 * n}',
        f'outbound_http_route_retry_requests_total{{{parent},hostname=""}} {20 * n}',
    ]
    # Each try's response under its backend: emoji-v1 answers 38 of its 40 with 200 (2 with 500), within 25 ms;
    # emoji-v2 answers 15 of its 30, the other 15 time out, within 500 ms.
    for backend, tries, ok, failed, error, le_first in (("emoji-v1", 40, 38, 2, "", "0.025"),
                                                        ("emoji-v2", 30, 15, 15, "REQUEST_TIMEOUT", "0.5")):
        labels = (f'{parent},backend_group="core",backend_kind="Service",backend_namespace="emojivoto",'
                  f'backend_name="{backend}",backend_port="8080",backend_section_name=""')
        lines.append(f'outbound_http_route_backend_requests_total{{{labels}}} {tries * n}')
        lines.append(f'outbound_http_route_backend_response_statuses_total{{{labels},http_status="200",error=""}} '
                     f'{ok * n}')
        failure = 'http_status="",error="REQUEST_TIMEOUT"' if error else 'http_status="500",error=""'
        lines.append(f'outbound_http_route_backend_response_statuses_total{{{labels},{failure}}} {failed * n}')
        buckets = ("0.025", "0.05", "0.1", "0.25", "0.5", "1", "10", "+Inf")
        for le in buckets:
            within = tries if buckets.index(le) >= buckets.index(le_first) else 0
            lines.append(f'outbound_http_route_backend_response_duration_seconds_bucket{{{labels},le="{le}"}} '
                         f'{within * n}')
    for le in ("0.05", "0.5", "1", "10", "+Inf"):
        lines.append(f'outbound_http_route_request_duration_seconds_bucket{{{parent},hostname="",le="{le}"}} {50 * n}')
    return "\n".join(lines) + "\n"


class Objects:
    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = objs

    def list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return [o for o in self.objs if o["kind"] == kind
                and (namespace is None or o["metadata"].get("namespace") in (namespace, None))]
