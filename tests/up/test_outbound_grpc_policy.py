"""A GRPCRoute end to end on the local platform: the real policy controller, real proxies, real gRPC (grpcio) in the
pods, HTTP/2 through both proxies.

The ``echo`` server fails every other call with UNAVAILABLE; a GRPCRoute on
its Service matches the ``Say`` method and its ``retry.linkerd.io/grpc:
unavailable`` annotation makes the client's proxy retry, so the client sees
only OKs. The client's proxy counts them in Linkerd 2.20's gRPC route
families under the GRPCRoute's name (``outbound_grpc_route_request_statuses_total``
with ``grpc_status="OK"``, ``outbound_grpc_route_retry_requests_total``).
"""

from __future__ import annotations

import importlib.util

import pytest

from up import uplab
from up.uplab import ready, wait_for


pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "grpc-policy"

SERVER = """
from concurrent import futures
import grpc
calls = [0]
def say(request, context):
    calls[0] += 1
    if calls[0] % 2 == 1:
        print("served UNAVAILABLE", flush=True)
        context.abort(grpc.StatusCode.UNAVAILABLE, "flaky")
    print("served OK", flush=True)
    return request
handler = grpc.method_handlers_generic_handler("demo.Echo", {
    "Say": grpc.unary_unary_rpc_method_handler(say, request_deserializer=None, response_serializer=None)})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("0.0.0.0:8080")
server.start()
server.wait_for_termination()
"""

CLIENT = """
import sys, time, grpc
channel = grpc.insecure_channel(sys.argv[1])
say = channel.unary_unary("/demo.Echo/Say")
while True:
    try:
        say(b"hi", timeout=5)
        print("ok OK", flush=True)
    except grpc.RpcError as e:
        print("error", e.code().name, flush=True)
    time.sleep(0.2)
"""


def _script(text: str) -> str:
    return text.replace("\n", "\\n").replace('"', '\\"')


MANIFESTS = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata:
      labels: {{app: echo}}
    spec:
      containers:
      - name: grpc
        image: python
        command: [{uplab.PYTHON}, -u, -c, "{_script(SERVER)}"]
        ports: [{{name: grpc, containerPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {NS}}}
spec:
  selector: {{app: echo}}
  ports: [{{name: grpc, port: 80, targetPort: grpc, appProtocol: kubernetes.io/h2c}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: echo-route
  namespace: {NS}
  annotations: {{retry.linkerd.io/grpc: unavailable, retry.linkerd.io/limit: "2"}}
spec:
  parentRefs: [{{name: echo, kind: Service, group: core, port: 80}}]
  rules:
  - matches: [{{method: {{service: demo.Echo, method: Say}}}}]
"""


def client() -> str:
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: caller, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: caller}}}}
  template:
    metadata:
      labels: {{app: caller}}
    spec:
      containers:
      - name: client
        image: python
        command: [{uplab.PYTHON}, -u, -c, "{_script(CLIENT)}", "echo.{NS}.svc.cluster.local:80"]
"""


def test_a_grpcroute_retries_unavailable_and_counts_under_its_name(running: uplab.Platform) -> None:
    p = running
    p.apply(MANIFESTS)
    wait_for("the echo pod ready", lambda: [x for x in p.pods(NS) if x["metadata"]["name"].startswith("echo-")
                                            and ready(x)], timeout=90)
    p.apply(client())
    (caller,) = wait_for("the caller ready", lambda: [x for x in p.pods(NS)
                                                      if x["metadata"]["name"].startswith("caller-") and ready(x)],
                         timeout=90)
    (echo,) = p.pods(NS, "echo-")

    def log(pod: dict) -> str:
        return p.logs(NS, pod["metadata"]["name"])

    wait_for("the caller's OKs", lambda: log(caller).count("ok OK") >= 5, timeout=90)
    assert "served UNAVAILABLE" in log(echo)
    assert "error UNAVAILABLE" not in log(caller), log(caller)

    metrics = wait_for("the gRPC route counters", lambda: (m := p.proxy_metrics(caller))
                       and "outbound_grpc_route_retry_requests_total{" in m and m, timeout=30)
    lines = metrics.splitlines()
    statuses = [line for line in lines if line.startswith("outbound_grpc_route_request_statuses_total{")
                and 'route_kind="GRPCRoute"' in line and 'route_name="echo-route"' in line]
    assert any('grpc_status="OK"' in line for line in statuses), statuses
    retries = [line for line in lines if line.startswith("outbound_grpc_route_retry_requests_total{")]
    assert any('route_name="echo-route"' in line and 'parent_name="echo"' in line for line in retries), retries
