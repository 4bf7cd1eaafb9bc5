"""Outbound client policy end to end on the local platform: the real policy controller, real proxies, real mTLS.

Linkerd's traffic-shifting tutorial, shrunk: a client calls the ``web``
Service; an HTTPRoute on ``web`` (its parent) splits the requests between
``web-v1`` and ``web-v2`` by weight, and the client's proxy draws the backend
per request, so both backends' servers log requests that no client sent them by
name. Then the weights move everything to ``web-v2`` (applied to the open
connections, per request), and a rule with a ``RequestRedirect`` is answered
by the client's proxy itself (the client follows it to ``web-v1``'s ``/redirected``). The policy controller is ``tether up``'s own
component.

Then Linkerd's traffic-shifting tutorial with its own Services and HTTPRoutes
(``tests/policy/outbound/tutorials/traffic-shifting.yaml``; its ``bb``
workloads stood in for by Python servers): the 90/10 canary, then all to v2.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tether.resources.loading import load_text
from up import uplab
from up.uplab import ready, wait_for, web_server


pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "canary"


def split(v1: int, v2: int) -> str:
    return f"""
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {{name: web-split, namespace: {NS}}}
spec:
  parentRefs: [{{name: web, kind: Service, group: core, port: 80}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /moved}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect:
        hostname: web-v1.{NS}.svc.cluster.local
        statusCode: 301
        path: {{type: ReplaceFullPath, replaceFullPath: /redirected}}
  - backendRefs:
    - {{name: web-v1, port: 80, weight: {v1}}}
    - {{name: web-v2, port: 80, weight: {v2}}}
"""


def test_an_httproute_splits_shifts_and_redirects(running: uplab.Platform) -> None:
    p = running
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    for name in ("web", "web-v1", "web-v2"):
        p.apply(web_server(name, NS, 1))
    for name in ("web-v1-", "web-v2-"):
        wait_for(f"the {name} pod ready", lambda n=name: [x for x in p.pods(NS, n) if ready(x)], timeout=60)
    wait_for("the web pod ready", lambda: [x for x in p.pods(NS, "web-") if ready(x)
                                           and not x["metadata"]["name"].startswith(("web-v1", "web-v2"))],
             timeout=60)
    p.apply(split(1, 1))
    p.apply(uplab.client("client", NS, f"http://web.{NS}.svc.cluster.local/"))
    p.apply(uplab.client("mover", NS, f"http://web.{NS}.svc.cluster.local/moved/x"))
    wait_for("the clients ready", lambda: len([x for x in p.pods(NS, "client-") + p.pods(NS, "mover-") if ready(x)]) == 2,
             timeout=60)

    def log(prefix: str) -> str:
        (pod,) = [x for x in p.pods(NS, prefix) if not (prefix == "web-" and x["metadata"]["name"].startswith(
            ("web-v1", "web-v2")))]
        return p.logs(NS, pod["metadata"]["name"])

    wait_for("the client answered", lambda: log("client-").count("ok 200") >= 3, timeout=60)
    wait_for("both backends take a share", lambda: "GET / " in log("web-v1-") and "GET / " in log("web-v2-"),
             timeout=60)
    assert "GET / " not in log("web-"), "the parent Service's own pod got requests the route sends elsewhere"

    # The redirect is the client proxy's own answer: urllib follows it to web-v1's /redirected.
    wait_for("the redirect followed", lambda: "GET /redirected" in log("web-v1-"), timeout=60)
    assert "GET /moved" not in log("web-v1-") + log("web-v2-") + log("web-")

    # Everything shifts to v2, on the client's open connections (per request).
    p.apply(split(0, 1))
    wait_for("v2 takes every request", _shifted(lambda: log("web-v1-").count("GET / "),
                                                lambda: log("web-v2-").count("GET / ")), timeout=60)


def _shifted(v1: Callable[[], int], v2: Callable[[], int]) -> Callable[[], bool]:
    """True once v2 took ten requests in a row while v1 took none (v1's requests restart the count)."""
    base = {"v1": v1(), "v2": v2()}

    def check() -> bool:
        now1, now2 = v1(), v2()
        if now1 != base["v1"]:
            base.update(v1=now1, v2=now2)
            return False
        return now2 >= base["v2"] + 10

    return check


TUTORIAL = Path(__file__).parents[1] / "policy" / "outbound" / "tutorials" / "traffic-shifting.yaml"
SHIFT_NS = "traffic-shift-demo"


def _terminus(version: str) -> str:
    """A stand-in for the tutorial's ``bb terminus`` Deployment (labels app: bb, version): a Python server."""
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {version}, namespace: {SHIFT_NS}}}
spec:
  selector: {{matchLabels: {{app: bb, version: {version}}}}}
  template:
    metadata:
      labels: {{app: bb, version: {version}}}
    spec:
      containers:
      - name: terminus
        image: python
        command: [{uplab.PYTHON}, -u, -m, http.server, "8080", --bind, 0.0.0.0]
        ports: [{{containerPort: 8080}}]
"""


def test_linkerds_traffic_shifting_tutorial(running: uplab.Platform) -> None:
    """The tutorial's own Services and HTTPRoutes (tests/policy/outbound/tutorials), its workloads stood in for:
    the 90/10 canary sends requests to both versions, then the second HTTPRoute moves them all to v2."""
    p = running
    docs = load_text(TUTORIAL.read_text(), TUTORIAL.name)
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    namespace["metadata"]["annotations"] = {"linkerd.io/inject": "enabled"}  # the tutorial runs `linkerd inject`
    services = [d for d in docs if d["kind"] == "Service"]
    canary, everything_to_v2 = [d for d in docs if d["kind"] == "HTTPRoute"]
    p.apply(yaml.safe_dump_all([namespace, *services]) + "---" + _terminus("v1") + "---" + _terminus("v2"))
    for version in ("v1-", "v2-"):
        wait_for(f"the {version} pod ready", lambda v=version: [x for x in p.pods(SHIFT_NS)
                                                                if x["metadata"]["name"].startswith(v) and ready(x)],
                 timeout=60)
    p.apply(yaml.safe_dump(canary))
    p.apply(uplab.client("slow-cooker", SHIFT_NS, f"http://bb.{SHIFT_NS}.svc.cluster.local:8080/"))

    def served(version: str) -> int:
        (pod,) = p.pods(SHIFT_NS, version)
        return p.logs(SHIFT_NS, pod["metadata"]["name"]).count("GET / ")

    wait_for("the 90/10 canary reaching both versions", lambda: served("v1-") >= 9 and served("v2-") >= 1, timeout=90)
    p.apply(yaml.safe_dump(everything_to_v2))
    wait_for("every request at v2", _shifted(lambda: served("v1-"), lambda: served("v2-")), timeout=60)
