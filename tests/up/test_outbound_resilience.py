"""Retries, timeouts and failure accrual from client policy, end to end on the local platform (Linkerd's
"retries and timeouts" and "circuit breaking" how-tos, shrunk): the real policy controller and real proxies.

- ``flaky`` answers every other request with 500; an HTTPRoute on it with
  ``retry.linkerd.io/http: 5xx`` makes the client's proxy retry, so the client
  sees only 200s while the server logs its 500s, and the client's proxy counts
  the retries in ``outbound_http_route_retry_requests_total``.
- the same route's ``/slow`` rule has ``timeouts.request: 500ms``: the server
  takes 3 s, the client gets the proxy's 504 (its own patience is 2 s).
- ``shop`` has a good and a broken pod behind one Service annotated
  ``balancer.linkerd.io/failure-accrual: consecutive`` (3 failures, 30 s
  out): the broken pod gets exactly three requests, then none while the good
  one keeps serving; then the broken pod is mended and, once its penalty
  (30 s, plus jitter) has passed, the breaker's probe succeeds and it serves
  again. (The state machine's every step is tested with a fake clock in
  ``tests/proxy/test_breaker.py``.)
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from up import uplab
from up.uplab import ready, wait_for


pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "resilience"

SERVER = """
import http.server, os, sys, time
flaky = [0]
broken_while = os.environ.get("MODE")  # a path: the server fails every request while that file exists
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(3)
        if self.path.startswith("/flaky"):
            flaky[0] += 1
        failing = (bool(broken_while) and os.path.exists(broken_while)
                   or self.path.startswith("/flaky") and flaky[0] % 2 == 1)
        code = 500 if failing else 200
        self.send_response(code)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
        print("served", self.path, code, flush=True)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""


def server(name: str, app: str, mode: str = "") -> str:
    script = SERVER.replace("\n", "\\n").replace('"', '\\"')
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: {app}, deploy: {name}}}}}
  template:
    metadata:
      labels: {{app: {app}, deploy: {name}}}
    spec:
      containers:
      - name: http
        image: python
        env: [{{name: MODE, value: "{mode}"}}]
        command: [{uplab.PYTHON}, -u, -c, "{script}"]
        ports: [{{name: http, containerPort: 8080}}]
"""


def service(name: str, annotations: str = "") -> str:
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NS}, annotations: {{{annotations}}}}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"""


ROUTE = f"""
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata:
  name: flaky-route
  namespace: {NS}
  annotations: {{retry.linkerd.io/http: 5xx, retry.linkerd.io/limit: "2"}}
spec:
  parentRefs: [{{name: flaky, kind: Service, group: core, port: 80}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /slow}}}}]
    timeouts: {{request: 500ms}}
  - matches: [{{path: {{type: PathPrefix, value: /}}}}]
"""

ACCRUAL = ('balancer.linkerd.io/failure-accrual: consecutive, '
           'balancer.linkerd.io/failure-accrual-consecutive-max-failures: "3", '
           'balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 30s, '
           'balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 30s')


def test_retries_hide_a_flaky_backend_timeouts_answer_504_and_the_breaker_takes_a_failing_pod_out_and_back(
        running: uplab.Platform, broken_flag: Path) -> None:
    p = running
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    p.apply(service("flaky") + "---" + server("flaky", "flaky") + "---" + ROUTE)
    p.apply(service("shop", ACCRUAL) + "---" + server("shop-good", "shop")
            + "---" + server("shop-bad", "shop", str(broken_flag)))
    for prefix in ("flaky-", "shop-good-", "shop-bad-"):
        wait_for(f"the {prefix} pod ready", lambda n=prefix: [x for x in p.pods(NS, n) if ready(x)], timeout=90)
    p.apply(uplab.client("retrier", NS, f"http://flaky.{NS}.svc.cluster.local/flaky"))
    p.apply(uplab.client("waiter", NS, f"http://flaky.{NS}.svc.cluster.local/slow"))
    p.apply(uplab.client("buyer", NS, f"http://shop.{NS}.svc.cluster.local/"))

    def log(prefix: str) -> str:
        pods = p.pods(NS, prefix)
        return "".join(p.logs(NS, pod["metadata"]["name"]) for pod in pods)

    # Retries: the client sees only 200s; the server did answer 500s.
    wait_for("the retrier answered", lambda: log("retrier-").count("ok 200") >= 5, timeout=90)
    assert "served /flaky 500" in log("flaky-")
    assert "500" not in log("retrier-"), log("retrier-")
    (retrier,) = p.pods(NS, "retrier-")
    metrics = wait_for("the retry counter", lambda: (m := p.proxy_metrics(retrier))
                       and "outbound_http_route_retry_requests_total{" in m and m, timeout=30)
    retries = [line for line in metrics.splitlines() if line.startswith("outbound_http_route_retry_requests_total{")]
    assert any('route_name="flaky-route"' in line and 'parent_name="flaky"' in line for line in retries), retries

    # Timeout: the proxy answers 504 before the client's own 2 s patience runs out.
    wait_for("the waiter's 504", lambda: "504" in log("waiter-"), timeout=60)

    # Failure accrual: three failures in a row at the broken pod, then it is out for its 30 s penalty, after
    # which one probe is let through (failing here, so out again for 30 s). The good pod serves the rest. The
    # probes are judged by the time the requests took, not by their number: a loaded machine may take longer
    # than a penalty for them (and the penalty is exactly 30 s: jitter never takes a backoff past its maximum).
    wait_for("the broken pod out", lambda: log("shop-bad-").count("served / 500") >= 3, timeout=90)
    out_since = time.monotonic()
    good_before = log("shop-good-").count("served / 200")
    wait_for("twenty more requests at the good pod", lambda: log("shop-good-").count("served / 200")
             >= good_before + 20, timeout=60)
    probes = log("shop-bad-").count("served / 500") - 3
    assert probes <= 1 + (time.monotonic() - out_since) // 30, probes

    # Mended, it is taken back: the breaker's probe after the penalty succeeds and the pod serves again.
    broken_flag.unlink()
    failed = log("shop-bad-").count("served / 500")
    wait_for("the mended pod back in the balancer", lambda: "served / 200" in log("shop-bad-"), timeout=120)
    assert log("shop-bad-").count("served / 500") == failed


@pytest.fixture
def broken_flag() -> Iterator[Path]:
    """A file the ``shop-bad`` pod fails while it exists, in a directory its uid may read."""
    home = Path(tempfile.mkdtemp(prefix="tether-breaker-"))
    home.chmod(0o755)
    flag = home / "broken"
    flag.write_text("")
    flag.chmod(0o644)
    yield flag
    shutil.rmtree(home)
