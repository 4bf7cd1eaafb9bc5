"""Inbound policy enforced end to end on the local platform: the real policy controller, real proxies, real mTLS.

A Server selects the web pods' HTTP port; an AuthorizationPolicy admits only
the identity of the ``allowed`` service account (a MeshTLSAuthentication).
Two meshed clients call the web Service: the allowed one gets 200s, the other
403s, and the web pod's proxy counts them in ``inbound_http_authz_allow_total``
and ``inbound_http_authz_deny_total`` under the Server's and the
AuthorizationPolicy's names. Then the MeshTLSAuthentication admits both and the
other client's requests go through too, without a restart. The policy controller is ``tether up``'s own
component, which the proxies reach over mTLS as the destination's identity.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
import yaml

from tether.resources.loading import load_text
from up import uplab
from up.uplab import ready, wait_for, web_server


pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NS = "authz"
ALLOWED_ID = f"allowed.{NS}.serviceaccount.identity.linkerd.cluster.local"
OTHER_ID = f"other.{NS}.serviceaccount.identity.linkerd.cluster.local"

POLICY = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {{name: web-http, namespace: {NS}}}
spec:
  podSelector: {{matchLabels: {{app: web}}}}
  port: http
  proxyProtocol: HTTP/1
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: allowed-only, namespace: {NS}}}
spec:
  identities: ["{ALLOWED_ID}"]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: web-allowed, namespace: {NS}}}
spec:
  targetRef: {{group: policy.linkerd.io, kind: Server, name: web-http}}
  requiredAuthenticationRefs:
  - {{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: allowed-only}}
"""


def caller(name: str, service_account: str) -> str:
    """A client Deployment (as ``uplab.client``) running as ``service_account``."""
    manifest = uplab.client(name, NS, f"http://web.{NS}.svc.cluster.local/")
    return manifest.replace("    spec:\n      containers:",
                            f"    spec:\n      serviceAccountName: {service_account}\n      containers:")


def test_only_the_authorized_identity_gets_through(running: uplab.Platform) -> None:
    p = running
    p.apply(POLICY)
    p.apply(web_server("web", NS, 1))
    wait_for("the web pod ready", lambda: [x for x in p.pods(NS, "web-") if ready(x)], timeout=60)
    p.apply(caller("allowed", "allowed"))
    p.apply(caller("other", "other"))
    (allowed,) = wait_for("the allowed client", lambda: [x for x in p.pods(NS, "allowed-") if ready(x)], timeout=60)
    (other,) = wait_for("the other client", lambda: [x for x in p.pods(NS, "other-") if ready(x)], timeout=60)

    def log(pod: dict) -> str:
        return p.logs(NS, pod["metadata"]["name"])

    wait_for("the other client refused with 403", lambda: "403" in log(other), timeout=60)
    wait_for("the allowed client answered", lambda: log(allowed).count("ok 200") >= 3, timeout=60)
    assert "ok 200" not in log(other)

    (web,) = p.pods(NS, "web-")
    metrics = wait_for("the web proxy's authorization counters",
                       lambda: (m := p.proxy_metrics(web)) and "inbound_http_authz_deny_total" in m and m, timeout=30)
    deny = [line for line in metrics.splitlines() if line.startswith("inbound_http_authz_deny_total{")]
    allow = [line for line in metrics.splitlines() if line.startswith("inbound_http_authz_allow_total{")]
    assert any(f'client_id="{OTHER_ID}"' in line and 'srv_name="web-http"' in line for line in deny), deny
    assert any(f'client_id="{ALLOWED_ID}"' in line and 'authz_name="web-allowed"' in line
               and 'authz_kind="authorizationpolicy"' in line for line in allow), allow
    assert not any(f'client_id="{ALLOWED_ID}"' in line for line in deny), deny

    # The policy changes: the other identity is admitted too, on the connections already open (per request).
    p.apply(POLICY.replace(f'identities: ["{ALLOWED_ID}"]', f'identities: ["{ALLOWED_ID}", "{OTHER_ID}"]'))
    wait_for("the other client admitted after the change", lambda: "ok 200" in log(other), timeout=60)


# -- an open TCP connection follows the policy (proxy.md §8.3) -----------------------------------------------

TCP_NS = "tcpauthz"
HOLDER_ID = f"holder.{TCP_NS}.serviceaccount.identity.linkerd.cluster.local"
NOBODY_ID = f"nobody.{TCP_NS}.serviceaccount.identity.linkerd.cluster.local"

ECHO_SCRIPT = """
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen()
def serve(c):
    while (d := c.recv(4096)): c.sendall(d)
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# One connection held open, a line echoed five times a second; when it ends, a new one (which may be refused).
HOLDER_SCRIPT = """
import socket, sys, time
for conn in range(1, 1000):
    replies = 0
    try:
        c = socket.create_connection((sys.argv[1], 80), timeout=5)
        while True:
            c.sendall(b"ping\\n")
            if not c.recv(100):
                break
            replies += 1
            print("conn", conn, "reply", replies, flush=True)
            time.sleep(0.2)
    except Exception as e:
        print("conn", conn, "error", type(e).__name__, flush=True)
    print("conn", conn, "closed after", replies, flush=True)
    time.sleep(0.5)
"""


def locked_server(namespace: str, app: str, protocol: str, *identities: str) -> str:
    """An injected namespace, a Server on ``app``'s ``tcp`` port and an AuthorizationPolicy admitting
    ``identities`` (a MeshTLSAuthentication)."""
    ids = ", ".join(f'"{i}"' for i in identities)
    return f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}, annotations: {{linkerd.io/inject: enabled}}}}
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {{name: {app}-server, namespace: {namespace}}}
spec:
  podSelector: {{matchLabels: {{app: {app}}}}}
  port: tcp
  proxyProtocol: {protocol}
---
apiVersion: policy.linkerd.io/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: {app}-clients, namespace: {namespace}}}
spec:
  identities: [{ids}]
---
apiVersion: policy.linkerd.io/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: {app}-clients, namespace: {namespace}}}
spec:
  targetRef: {{group: policy.linkerd.io, kind: Server, name: {app}-server}}
  requiredAuthenticationRefs:
  - {{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: {app}-clients}}
"""


def service(namespace: str, app: str) -> str:
    return f"""
---
apiVersion: v1
kind: Service
metadata: {{name: {app}, namespace: {namespace}}}
spec:
  selector: {{app: {app}}}
  ports: [{{name: tcp, port: 80, targetPort: tcp}}]
"""


TCP_POLICY = locked_server(TCP_NS, "echo", "opaque", HOLDER_ID) + service(TCP_NS, "echo")


def test_an_open_tcp_connection_that_loses_its_authorization_is_closed(running: uplab.Platform) -> None:
    p = running
    p.apply(TCP_POLICY)
    p.apply(uplab.script_deployment("echo", TCP_NS, ECHO_SCRIPT, port=7000, port_name="tcp"))
    wait_for("the echo pod ready", lambda: [x for x in p.pods(TCP_NS) if x["metadata"]["name"].startswith("echo-")
                                            and ready(x)], timeout=60)
    p.apply(uplab.script_deployment("holder", TCP_NS, HOLDER_SCRIPT, f"echo.{TCP_NS}.svc.cluster.local",
                               service_account="holder"))
    (holder,) = wait_for("the holder pod", lambda: [x for x in p.pods(TCP_NS)
                                                     if x["metadata"]["name"].startswith("holder-") and ready(x)],
                         timeout=60)

    def log() -> str:
        return p.logs(TCP_NS, holder["metadata"]["name"])

    # Authorized: one connection carries reply after reply.
    wait_for("replies on the first connection", lambda: "conn 1 reply 5\n" in log(), timeout=60)
    assert "closed" not in log()

    # The MeshTLSAuthentication now names another identity: the open connection is torn down by the echo pod's
    # proxy, and the next one is refused.
    p.apply(TCP_POLICY.replace(f'identities: ["{HOLDER_ID}"]', f'identities: ["{NOBODY_ID}"]'))
    wait_for("the first connection closed", lambda: "conn 1 closed after" in log(), timeout=60)
    text = log()
    assert "conn 1 reply 5\n" in text and "conn 2 reply" not in text, text
    (echo,) = p.pods(TCP_NS, "echo-")
    terminated = [line for line in p.proxy_metrics(echo).splitlines()
                  if line.startswith("inbound_tcp_authz_terminate_total{")]
    assert any('srv_name="echo-server"' in line and f'client_id="{HOLDER_ID}"' in line and line.endswith(" 1")
               for line in terminated), terminated


# -- route filters on the server side (proxy.md §8.3) ---------------------------------------------------------

FILTER_NS = "filters"
ECHO_HEADERS_SCRIPT = """
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = "".join(f"{k.lower()}: {v}\\n" for k, v in self.headers.items()).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

# Each path once a second, without following redirects: the status, the Location and the echoed headers.
FILTER_CLIENT_SCRIPT = """
import http.client, sys, time
while True:
    for path in ("/old/page?q=1", "/hdr"):
        try:
            c = http.client.HTTPConnection(sys.argv[1], 80, timeout=5)
            c.request("GET", path, headers={"x-debug": "1", "x-env": "dev"})
            r = c.getresponse()
            body = r.read().decode().replace("\\n", "|")
            print(path, r.status, r.getheader("location"), body, flush=True)
            c.close()
        except Exception as e:
            print(path, "error", e, flush=True)
    time.sleep(1)
"""

FILTER_POLICY = locked_server(FILTER_NS, "echo", "HTTP/1", "*") + service(FILTER_NS, "echo") + f"""
---
apiVersion: policy.linkerd.io/v1beta3
kind: HTTPRoute
metadata: {{name: echo-routes, namespace: {FILTER_NS}}}
spec:
  parentRefs: [{{group: policy.linkerd.io, kind: Server, name: echo-server}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect:
        hostname: moved.example.com
        path: {{type: ReplacePrefixMatch, replacePrefixMatch: /new}}
        statusCode: 302
  - matches: [{{path: {{type: PathPrefix, value: /hdr}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{{name: x-env, value: prod}}, {{name: l5d-client-id, value: admin.forged}}]
        add: [{{name: x-route, value: hdr}}]
        remove: [x-debug]
"""


def test_route_filters_redirect_and_edit_headers_but_never_l5d_ones(running: uplab.Platform) -> None:
    p = running
    forged = "{name: l5d-client-id, value: admin.forged}"
    p.apply(FILTER_POLICY)  # a modifier naming l5d-client-id: the proxy refuses the whole policy
    p.apply(uplab.script_deployment("echo", FILTER_NS, ECHO_HEADERS_SCRIPT, port=8080, port_name="tcp"))
    wait_for("the echo pod ready", lambda: [x for x in p.pods(FILTER_NS)
                                            if x["metadata"]["name"].startswith("echo-") and ready(x)], timeout=60)
    p.apply(uplab.script_deployment("caller", FILTER_NS, FILTER_CLIENT_SCRIPT, f"echo.{FILTER_NS}.svc.cluster.local",
                               service_account="caller"))
    (caller_pod,) = wait_for("the caller pod", lambda: [x for x in p.pods(FILTER_NS)
                                                        if x["metadata"]["name"].startswith("caller-") and ready(x)],
                             timeout=60)

    def lines(path: str) -> list[str]:
        out = p.logs(FILTER_NS, caller_pod["metadata"]["name"])
        return [line for line in out.splitlines() if line.startswith(path + " ")]

    # Linkerd's invalid policy: every request 403, so the forged identity never reaches the app.
    wait_for("the invalid policy's 403", lambda: [x for x in lines("/hdr") if " 403 " in x], timeout=60)
    assert not [x for x in lines("/hdr") if " 200 " in x or "admin.forged" in x]

    assert forged in FILTER_POLICY
    p.apply(FILTER_POLICY.replace(f", {forged}", ""))
    redirected = wait_for("a redirect", lambda: [x for x in lines("/old/page?q=1") if " 302 " in x], timeout=60)
    assert "http://moved.example.com/new/page?q=1" in redirected[0], redirected
    edited = wait_for("an edited request", lambda: [x for x in lines("/hdr") if " 200 " in x], timeout=60)
    echoed = edited[0]
    assert "x-env: prod" in echoed and "x-route: hdr" in echoed and "x-debug" not in echoed, echoed
    caller_id = f"caller.{FILTER_NS}.serviceaccount.identity.linkerd.cluster.local"
    assert f"l5d-client-id: {caller_id}" in echoed, echoed


# -- a denied request leaves the connection open (proxy.md §7.9, §8.4) ---------------------------------------

KEEP_NS = "keepalive"


def _response_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {head!r}")
        head += chunk
    return head


def test_a_denied_client_keeps_its_connection_for_the_next_request(running: uplab.Platform) -> None:
    """A client without identity (plaintext from the host's bridge address) gets 403s, as Linkerd answers them:
    without closing, so one connection carries request after request -- a POST's body read and dropped too."""
    p = running
    p.apply(locked_server(KEEP_NS, "echo", "HTTP/1", HOLDER_ID) + service(KEEP_NS, "echo"))
    p.apply(uplab.script_deployment("echo", KEEP_NS, ECHO_HEADERS_SCRIPT, port=8080, port_name="tcp"))
    (echo,) = wait_for("the echo pod ready", lambda: [x for x in p.pods(KEEP_NS)
                                                      if x["metadata"]["name"].startswith("echo-") and ready(x)],
                       timeout=60)
    ip = echo["status"]["podIP"]

    def denied() -> bool:  # the proxy applies the default policy until the controller's Server arrives
        with socket.create_connection((ip, 8080), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
            return _response_head(sock).startswith(b"HTTP/1.1 403 ")

    wait_for("the Server's policy applied", denied, timeout=60)
    requests = [b"GET /a HTTP/1.1\r\nHost: echo\r\n\r\n",
                b"POST /b HTTP/1.1\r\nHost: echo\r\nContent-Length: 3000\r\n\r\n" + b"x" * 3000,
                b"GET /c HTTP/1.1\r\nHost: echo\r\n\r\n"]
    with socket.create_connection((ip, 8080), timeout=10) as sock:
        for request in requests:
            sock.sendall(request)
            head = _response_head(sock)
            assert head.startswith(b"HTTP/1.1 403 ") and b"connection: close" not in head.lower(), head
            assert b"l5d-proxy-error" not in head.lower(), head  # not meshed: no informational headers (§8.4)
        sock.sendall(b"GET /d HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
        assert _response_head(sock).startswith(b"HTTP/1.1 403 ")
        assert sock.recv(1) == b""  # the client said it was done: now the proxy closes
    deny = [line for line in p.proxy_metrics(echo).splitlines() if line.startswith("inbound_http_authz_deny_total{")
            and 'srv_name="echo-server"' in line and 'tls="no_identity"' in line]
    assert deny and sum(float(line.rsplit(" ", 1)[1]) for line in deny) >= 5, deny


# -- Linkerd's rate-limiting tutorial (proxy.md §8.3) ---------------------------------------------------------

RATE_NS = "emojivoto"  # the tutorial's manifests name it
RATE_TUTORIAL = Path(__file__).resolve().parents[1] / "policy" / "outbound" / "tutorials" / "rate-limiting.yaml"
OVERRIDDEN_ID = f"default.{RATE_NS}.serviceaccount.identity.linkerd.cluster.local"  # the tutorial's override
PLAIN_ID = f"plain.{RATE_NS}.serviceaccount.identity.linkerd.cluster.local"

# Every 1.5 s (the client's bucket is full again by then), a burst of 12 requests back to back on one connection:
# one line of their statuses in order.
BURST_SCRIPT = """
import http.client, sys, time
while True:
    time.sleep(1.5)
    statuses = []
    try:
        c = http.client.HTTPConnection(sys.argv[1], 80, timeout=5)
        for _ in range(12):
            c.request("GET", "/")
            r = c.getresponse(); r.read()
            statuses.append(str(r.status))
        c.close()
    except Exception as e:
        statuses.append("error-" + type(e).__name__)
    print("burst", " ".join(statuses), flush=True)
"""


def _bursts(text: str) -> list[list[str]]:
    return [line.split()[1:] for line in text.splitlines() if line.startswith("burst ")]


def _leading_ok(burst: list[str]) -> int:
    return next((i for i, status in enumerate(burst) if status != "200"), len(burst))


def test_linkerds_rate_limiting_tutorial(running: uplab.Platform) -> None:
    """The tutorial's Server (all-unauthenticated) and HTTPLocalRateLimitPolicy on emojivoto's web port, applied
    in its order: 4 requests per second per client identity, then an override of 6 for the ``default`` service
    account. Two meshed clients (``default`` and ``plain``) send bursts: requests over a client's limit get the
    web proxy's 429 on the same connection and are counted in ``inbound_http_local_ratelimit_total`` under the
    policy's name; once the override is in force, a ``default`` burst starting with a full bucket gets at least
    its 6 requests through, more than the 4 of the per-identity limit."""
    p = running
    server, limit, override = load_text(RATE_TUTORIAL.read_text(), RATE_TUTORIAL.name)
    p.apply(f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {RATE_NS}, annotations: {{linkerd.io/inject: enabled}}}}
""")
    p.apply(web_server("web-svc", RATE_NS, 1))  # the tutorial's Server selects app=web-svc, port http
    wait_for("the web pod ready", lambda: [x for x in p.pods(RATE_NS)
                                           if x["metadata"]["name"].startswith("web-svc-") and ready(x)], timeout=60)
    p.apply(yaml.safe_dump(server) + "---\n" + yaml.safe_dump(limit))
    url = f"web-svc.{RATE_NS}.svc.cluster.local"
    p.apply(uplab.script_deployment("overridden", RATE_NS, BURST_SCRIPT, url))  # service account: default
    p.apply(uplab.script_deployment("plain", RATE_NS, BURST_SCRIPT, url, service_account="plain"))

    def bursts(prefix: str) -> list[list[str]]:
        pods = p.pods(RATE_NS, prefix)
        return _bursts(p.logs(RATE_NS, pods[0]["metadata"]["name"])) if pods else []

    def limited(prefix: str) -> bool:
        """A burst cut short by the per-identity limit of 4: its first 429 comes before a 6th request."""
        return any(b and b[0] == "200" and "429" in b and _leading_ok(b) < 6 and set(b) <= {"200", "429"}
                   for b in bursts(prefix))

    wait_for("the default client limited to about 4 requests per second", lambda: limited("overridden-"), timeout=90)
    wait_for("the plain client limited to about 4 requests per second", lambda: limited("plain-"), timeout=60)
    (web,) = p.pods(RATE_NS, "web-svc-")
    counted = [line for line in p.proxy_metrics(web).splitlines()
               if line.startswith("inbound_http_local_ratelimit_total{")]
    assert any('ratelimit_name="web-http"' in line and 'ratelimit_scope="identity"' in line
               and 'srv_name="web-http"' in line for line in counted), counted

    # The tutorial's second step: the same policy with an override of 6 for the default service account.
    seen = len(bursts("overridden-"))
    p.apply(yaml.safe_dump(override))
    wait_for("a default burst with 6 requests through",
             lambda: any(_leading_ok(b) >= 6 for b in bursts("overridden-")[seen:]), timeout=60)
    plain = bursts("plain-")
    assert plain and "429" in plain[-1], plain[-3:]  # the others keep the per-identity limit
