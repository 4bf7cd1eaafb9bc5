"""Linkerd's authorization tutorial on the local platform: emojivoto's voting service locked down to web.

The manifests are the tutorial's ("Restricting access to services"): a Server
``voting-grpc`` on voting's gRPC port, a MeshTLSAuthentication naming web's
identity and an AuthorizationPolicy ``voting-policy`` tying them. The demo's
emojivoto (``demo/``) runs meshed; vote-bot votes through web. Another meshed
workload, ``intruder``, calls voting directly with a real gRPC client: it gets
``PERMISSION_DENIED`` and voting's proxy counts it in
``inbound_http_authz_deny_total`` while web's calls go on, counted allowed
under ``voting-policy``. Then per-route authorization: GRPCRoutes for
``Vote`` and ``Results`` and an AuthorizationPolicy on the ``Results`` route
for the intruder's identity: its ``Results`` calls succeed, its votes are
still denied, and web still votes (the Server's policy covers every route).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from demo.conftest import DEMO_DIR, load_demo
from up import uplab
from up.uplab import ready, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "emojivoto"
WEB_ID = f"web.{NS}.serviceaccount.identity.linkerd.cluster.local"
INTRUDER_ID = f"intruder.{NS}.serviceaccount.identity.linkerd.cluster.local"

# The tutorial's manifests, as Linkerd's docs give them.
LOCKDOWN = f"""
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata:
  namespace: {NS}
  name: voting-grpc
  labels:
    app: voting-svc
spec:
  podSelector:
    matchLabels:
      app: voting-svc
  port: grpc
  proxyProtocol: gRPC
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata:
  name: voting-policy
  namespace: {NS}
spec:
  targetRef:
    group: policy.linkerd.io
    kind: Server
    name: voting-grpc
  requiredAuthenticationRefs:
    - name: voting-grpc
      kind: MeshTLSAuthentication
      group: policy.linkerd.io
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata:
  name: voting-grpc
  namespace: {NS}
spec:
  identities:
    - "{WEB_ID}"
"""

PER_ROUTE = f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: voting-vote, namespace: {NS}}}
spec:
  parentRefs: [{{group: policy.linkerd.io, kind: Server, name: voting-grpc}}]
  rules: [{{matches: [{{method: {{service: emojivoto.v1.VotingService, method: Vote}}}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: voting-results, namespace: {NS}}}
spec:
  parentRefs: [{{group: policy.linkerd.io, kind: Server, name: voting-grpc}}]
  rules: [{{matches: [{{method: {{service: emojivoto.v1.VotingService, method: Results}}}}]}}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: intruder, namespace: {NS}}}
spec:
  identities: ["{INTRUDER_ID}"]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: results-for-intruder, namespace: {NS}}}
spec:
  targetRef: {{group: gateway.networking.k8s.io, kind: GRPCRoute, name: voting-results}}
  requiredAuthenticationRefs:
  - {{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: intruder}}
"""

# Calls voting directly, once a second: each call's outcome (ok, or the gRPC status code's name).
INTRUDER_SCRIPT = """
import time
from emojivoto import rpc
client = rpc.VotingClient("voting-svc.emojivoto:8080")
while True:
    for name, call in (("vote", lambda: client.vote(":rocket:")), ("results", client.results)):
        try:
            call()
            print(name, "ok", flush=True)
        except rpc.RpcError as e:
            print(name, e.code().name, flush=True)
    time.sleep(1)
"""


def intruder() -> str:
    code = INTRUDER_SCRIPT.replace("\n", "\\n").replace('"', '\\"')
    return f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: intruder, namespace: {NS}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: intruder, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: intruder}}}}
  template:
    metadata:
      labels: {{app: intruder}}
    spec:
      serviceAccountName: intruder
      containers:
      - name: main
        image: python
        workingDir: {DEMO_DIR}
        env: [{{name: GRPC_DNS_RESOLVER, value: native}}]
        command: [{uplab.PYTHON}, -u, -c, "{code}"]
"""


def _series(text: str, name: str, *parts: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(p in line for p in parts))


def test_voting_locked_down_to_web_then_one_route_opened(running: uplab.Platform) -> None:
    p = running
    p.apply(load_demo("render").render(sys.executable, str(DEMO_DIR), vote_rate=4))
    p.apply(LOCKDOWN)

    def pod(prefix: str) -> dict | None:
        found = [x for x in p.pods(NS, prefix) if ready(x)]
        return found[0] if found else None

    voting = wait_for("voting ready", lambda: pod("voting-"), timeout=90)
    # The lockdown in force at voting's proxy (web's calls admitted under voting-policy) before the intruder
    # exists: a proxy that got voting's policy before the Server was indexed would let its first calls through.
    wait_for("web's votes allowed at voting's proxy", lambda: _series(
        p.proxy_metrics(voting), "inbound_http_authz_allow_total", f'client_id="{WEB_ID}"', 'srv_name="voting-grpc"',
        'authz_name="voting-policy"') > 0, timeout=60)
    p.apply(intruder())
    intruder_pod = wait_for("intruder ready", lambda: pod("intruder-"), timeout=90)

    def log() -> list[str]:
        return p.logs(NS, intruder_pod["metadata"]["name"]).splitlines()

    wait_for("the intruder's vote denied", lambda: "vote PERMISSION_DENIED" in log(), timeout=60)
    assert "vote ok" not in log() and "results ok" not in log()
    assert _series(p.proxy_metrics(voting), "inbound_http_authz_deny_total", f'client_id="{INTRUDER_ID}"',
                   'srv_name="voting-grpc"') > 0

    # Per-route authorization: the intruder may read the results, and only that.
    p.apply(PER_ROUTE)
    wait_for("the intruder's results allowed", lambda: "results ok" in log(), timeout=60)
    seen = log()
    after = seen[next(i for i, line in enumerate(seen) if line == "results ok"):]
    assert "vote ok" not in after and "vote PERMISSION_DENIED" in seen
    wait_for("the intruder's vote still denied after the routes",
             lambda: "vote PERMISSION_DENIED" in log()[len(seen):], timeout=30)
    before = _series(p.proxy_metrics(voting), "inbound_http_authz_allow_total", f'client_id="{WEB_ID}"',
                     'route_name="voting-vote"')
    wait_for("web's votes allowed on the Vote route", lambda: _series(
        p.proxy_metrics(voting), "inbound_http_authz_allow_total", f'client_id="{WEB_ID}"',
        'route_name="voting-vote"', 'authz_name="voting-policy"') > before, timeout=60)
