"""tether-http and tether-tcp: load -> Tether proxy -> mTLS -> Tether proxy -> nginx, with a real control plane.

Each variant starts, in its own temp dir:

- ``tether identity serve`` with the run's issuer (``bench/dataplane/pki.py``,
  the same anchor every other variant uses) and a local-platform token key;
- ``tether destination serve`` over a temp store holding a Namespace, a
  Service (``bench/bench-server``, on a loopback "cluster IP") and two Pods:
  ``bench-server-0`` at 127.0.0.1 -- nginx's address, its container port the
  backend's port, with a ``linkerd-proxy`` container whose inbound port is the
  server-side proxy's -- and ``bench-client-0`` on a loopback IP of its own;
- the server-side proxy (``python -m tether.proxy``, pod IP 127.0.0.1) and the
  client-side proxy (pod IP 127.a.b.c). Each makes its key, and gets its
  certificate from identity via Certify with a token minted by
  ``tether.platform.local.tokens``.

There is no iptables: the proxies run in Tether's direct-addressing mode
(``TETHER_PROXY_ORIG_DST_FALLBACK=local-addr``). The client proxy listens on
the Service's cluster IP and port (``TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS``)
and the load goes there, so the original destination is the Service: the proxy
asks the destination for its profile and endpoints (GetProfile, Get), gets the
server pod with its identity, and connects over mTLS (TLS 1.3, P-256) to the
server proxy's inbound port. Since nothing redirects the inbound side, the
destination runs with ``--outbound-transport-mode transport-header`` (Linkerd
has that mode too): every meshed endpoint gets opaque transport, and the
client proxy sends the transport header (ALPN ``transport.l5d.io/v1``) naming
the backend port; the server proxy then connects to nginx at 127.0.0.1 and
that port.

- **tether-http**: the port is not opaque. The client proxy detects HTTP/1.1
  from the first bytes and puts the session protocol in the transport header.
  With proxy part 1 alone, detected HTTP is carried per connection: one mTLS
  connection per client connection, bytes forwarded. Once the request-level
  proxy (``tether.proxy.http``, part 2) is in the tree, the same variant
  measures it; ``version()`` says which one ran.
- **tether-http-policy**: tether-http with ``tether policy serve`` (the
  destination's identity, as in Linkerd) over the same store, which holds a
  Server on the backend port, a MeshTLSAuthentication naming the client's
  identity, an AuthorizationPolicy targeting the Server and an HTTPRoute on it
  (``policy_objects``): the server proxy authorizes every request on its route
  (``inbound_http_authz_allow_total`` is checked after the run), and the client
  proxy follows the Service's outbound policy too. What the policy costs.
- **tether-tcp**: the port is opaque (``config.linkerd.io/opaque-ports`` on
  the Service, for the service port, and on the Pod, for the container port --
  the profile says ``opaque_protocol`` and the endpoint is hinted opaque): no
  detection, no session protocol, the transport header alone.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from bench.dataplane import callcount
from bench.dataplane.pki import CLIENT_IDENTITY, SERVER_IDENTITY
from bench.dataplane.procs import Pinning, StartError, Supervisor
from bench.dataplane.variants.base import LOOPBACK, Check, Context, Plan, ProxySpec, Variant, tls13_probe

NS = SERVER_IDENTITY.namespace
REPO = Path(__file__).resolve().parents[3]
OPAQUE_PORTS = "config.linkerd.io/opaque-ports"


def tether_argv() -> list[str]:
    """The ``tether`` command of this interpreter's environment."""
    script = Path(sys.executable).with_name("tether")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from tether.cli.main import main; main()"]


def loopback_ips(n: int) -> list[str]:
    """``n`` loopback addresses from a random /24 (not 127.0.0.0/24), for pods and cluster IPs."""
    rng = random.SystemRandom()
    base = f"127.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}."
    return [f"{base}{i + 1}" for i in range(n)]


POLICY_GROUP = "policy.linkerd.io"


def policy_objects() -> list[dict[str, Any]]:
    """The policy of tether-http-policy: only the client's identity may call the server, on one HTTPRoute (pure)."""
    server_sa = SERVER_IDENTITY.service_account
    server = {"group": POLICY_GROUP, "kind": "Server", "name": server_sa}
    return [
        {"apiVersion": f"{POLICY_GROUP}/v1beta3", "kind": "Server", "metadata": {"name": server_sa, "namespace": NS},
         "spec": {"podSelector": {"matchLabels": {"app": server_sa}}, "port": "http", "proxyProtocol": "HTTP/1"}},
        {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "MeshTLSAuthentication",
         "metadata": {"name": "bench-client", "namespace": NS},
         "spec": {"identities": [CLIENT_IDENTITY.dns_name]}},
        {"apiVersion": f"{POLICY_GROUP}/v1alpha1", "kind": "AuthorizationPolicy",
         "metadata": {"name": "bench-client-only", "namespace": NS},
         "spec": {"targetRef": server, "requiredAuthenticationRefs": [
             {"group": POLICY_GROUP, "kind": "MeshTLSAuthentication", "name": "bench-client"}]}},
        {"apiVersion": f"{POLICY_GROUP}/v1beta3", "kind": "HTTPRoute", "metadata": {"name": "bench", "namespace": NS},
         "spec": {"parentRefs": [server], "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]}},
    ]


def store_objects(*, server_ip: str, client_ip: str, service_ip: str, service_port: int, backend_port: int,
                  inbound_port: int, opaque: bool) -> list[dict[str, Any]]:
    """What the destination reads (pure: tested without processes)."""

    def pod(name: str, sa: str, ip: str, app_port: int, proxy_inbound: int,
            annotations: dict[str, str]) -> dict[str, Any]:
        proxy = {"name": "linkerd-proxy", "image": "tether/proxy",
                 "ports": [{"name": "linkerd-proxy", "containerPort": proxy_inbound}],
                 "env": [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": f"0.0.0.0:{proxy_inbound}"}]}
        app = {"name": sa, "image": "bench", "ports": [{"name": "http", "containerPort": app_port}]}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations,
                         "labels": {"app": sa, "linkerd.io/control-plane-ns": "linkerd"}},
            "spec": {"serviceAccountName": sa, "containers": [proxy, app]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }

    server_sa, client_sa = SERVER_IDENTITY.service_account, CLIENT_IDENTITY.service_account
    svc_annotations = {OPAQUE_PORTS: str(service_port)} if opaque else {}
    pod_annotations = {OPAQUE_PORTS: str(backend_port)} if opaque else {}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": server_sa, "namespace": NS, "annotations": svc_annotations},
         "spec": {"selector": {"app": server_sa}, "clusterIP": service_ip,
                  "ports": [{"name": "http", "port": service_port, "targetPort": backend_port}]}},
        # As the EndpointSlice controller would write it: the destination reads endpoints from slices only.
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{server_sa}-bench", "namespace": NS,
                      "labels": {"kubernetes.io/service-name": server_sa}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [server_ip], "conditions": {"ready": True, "serving": True, "terminating": False},
                        "targetRef": {"kind": "Pod", "name": f"{server_sa}-0", "namespace": NS}}],
         "ports": [{"name": "http", "port": backend_port, "protocol": "TCP"}]},
        pod(f"{server_sa}-0", server_sa, server_ip, backend_port, inbound_port, pod_annotations),
        pod(f"{client_sa}-0", client_sa, client_ip, 8080, 4143, {}),
    ]


class _Tether(Variant):
    opaque: ClassVar[bool]
    tap: ClassVar[bool] = False  # both proxies with LINKERD2_PROXY_TAP_SVC_NAME (tap server up, no tap open)
    # A tap open on both proxies during the run (bench/dataplane/tap_watch.py), at most this many requests
    # per one-second window and proxy; None: no tap open.
    tap_open: ClassVar[int | None] = None
    policy: ClassVar[bool] = False  # a policy controller, and policy_objects() in the store
    # The destination hints the server's endpoint h2 (its default, as Linkerd's): HTTP/1 load then goes between
    # the proxies over one HTTP/2 connection (the l5d-orig-proto upgrade). False: --disable-h2-upgrade.
    h2_upgrade: ClassVar[bool] = True

    @classmethod
    def available(cls) -> str | None:
        try:
            import tether.proxy  # noqa: F401
        except ImportError as e:  # pragma: no cover - the harness runs in the project's venv
            return f"tether not importable: {e}"
        return None

    @classmethod
    def version(cls) -> str:
        import platform

        from tether import __version__

        try:
            import uvloop

            loop = f"uvloop {uvloop.__version__}"
        except ImportError:  # pragma: no cover
            loop = "asyncio"
        from tether.proxy import native

        # Which proxy was measured: the commit of the tree it ran from (and whether that tree had changes), and
        # whether its hot modules ran compiled (the proxies inherit this process's environment and venv).
        return (f"tether {__version__} ({_commit()}; Python {platform.python_version()}, {loop}; "
                f"{native.status})")

    def plan(self, ctx: Context) -> Plan:
        from tether.naming import WorkloadIdentity, control_plane_identity
        from tether.platform.local.tokens import LocalTokenSigner, TokenKey
        from tether.store import Store
        from tether.viz.tap_injector import tap_identity

        certs = ctx.certs
        if certs.issuer_cert is None or certs.issuer_key is None or certs.destination is None:
            raise StartError(f"{self.name}: the run's PKI has no issuer (bench/dataplane/pki.py)")
        work = ctx.workdir
        backend_host, backend_port = ctx.backend
        # The server pod is at nginx's address: the server proxy connects to the app at the pod IP.
        server_ip = backend_host
        client_ip, service_ip = loopback_ips(2)
        service_port = ctx.port()
        identity_port, identity_admin = ctx.port(), ctx.port()
        destination_port, destination_admin = ctx.port(), ctx.port()
        inbound_port, server_outbound, server_admin = ctx.port(), ctx.port(), ctx.port()
        client_inbound, client_outbound, client_admin = ctx.port(), ctx.port(), ctx.port()
        tap_ports = {"server": ctx.port(), "client": ctx.port()} if self.tap else {}
        policy_port, policy_admin = ctx.port(), ctx.port()

        store = Store(work / "store.db")
        try:
            store.apply_many(store_objects(server_ip=server_ip, client_ip=client_ip, service_ip=service_ip,
                                           service_port=service_port, backend_port=backend_port,
                                           inbound_port=inbound_port, opaque=self.opaque))
            if self.policy:
                store.apply_many(policy_objects())
        finally:
            store.close()
        state = work / "state"
        signer = LocalTokenSigner(TokenKey.load_or_create(state))
        anchors = certs.anchor.read_text()
        tether = tether_argv()

        identity = ProxySpec("identity", tether + [
            "identity", "serve", "--trust-anchors", str(certs.anchor), "--issuer-cert", str(certs.issuer_cert),
            "--issuer-key", str(certs.issuer_key), "--addr", f"{LOOPBACK}:{identity_port}",
            "--admin-addr", f"{LOOPBACK}:{identity_admin}", "--state-dir", str(state), "--log-level", "warning",
        ], (LOOPBACK, identity_port))
        destination = ProxySpec("destination", tether + [
            "destination", "serve", "--store", str(work / "store.db"), "--addr", f"{LOOPBACK}:{destination_port}",
            "--admin-addr", f"{LOOPBACK}:{destination_admin}", "--tls-cert", str(certs.destination.chain),
            "--tls-key", str(certs.destination.key), "--outbound-transport-mode", "transport-header",
            "--log-level", "warning", *(() if self.h2_upgrade else ("--disable-h2-upgrade",)),
        ], (LOOPBACK, destination_port))

        def proxy_env(sa: str, ip: str, inbound: int, outbound: int, admin: int,
                      extra_listen: list[str]) -> dict[str, str]:
            pod = f"{sa}-0"
            token = work / f"token-{sa}"
            token.write_bytes(signer.mint(namespace=NS, service_account=sa, pod=pod))
            (work / f"identity-{sa}").mkdir(exist_ok=True)
            return {
                "LINKERD2_PROXY_LOG": "warn",
                # The checks after the run read counters of the whole run; a variant measured only early in a run
                # of 17 minutes (HTTP/2 and gRPC have no latency runs) would otherwise have its idle series dropped
                # after linkerd2-proxy's default 10 minutes, and the checks would read zeros.
                "LINKERD2_PROXY_METRICS_RETAIN_IDLE": "4h",
                "LINKERD2_PROXY_INBOUND_LISTEN_ADDR": f"{ip}:{inbound}",
                "LINKERD2_PROXY_OUTBOUND_LISTEN_ADDR": f"{ip}:{outbound}",
                "LINKERD2_PROXY_ADMIN_LISTEN_ADDR": f"{ip}:{admin}",
                "LINKERD2_PROXY_INBOUND_IPS": ip,
                "TETHER_PROXY_ORIG_DST_FALLBACK": "local-addr",
                "TETHER_PROXY_OUTBOUND_EXTRA_LISTEN_ADDRS": ",".join(extra_listen),
                "TETHER_PROXY_CONTROL_LOOPBACK_TLS": "true",
                "LINKERD2_PROXY_DESTINATION_SVC_ADDR": f"{LOOPBACK}:{destination_port}",
                "LINKERD2_PROXY_DESTINATION_SVC_NAME": control_plane_identity("destination").dns_name,
                "LINKERD2_PROXY_DESTINATION_PROFILE_NETWORKS": "127.0.0.0/8",
                "LINKERD2_PROXY_DESTINATION_CONTEXT": json.dumps({"ns": NS, "nodeName": "bench", "pod": pod}),
                "LINKERD2_PROXY_POLICY_SVC_ADDR": f"{LOOPBACK}:{policy_port}",
                # The policy controller serves as the destination's identity (it shares its pod in Linkerd).
                "LINKERD2_PROXY_POLICY_SVC_NAME": control_plane_identity("destination").dns_name,
                "LINKERD2_PROXY_POLICY_WORKLOAD": json.dumps({"ns": NS, "pod": pod}),
                "LINKERD2_PROXY_IDENTITY_DIR": str(work / f"identity-{sa}"),
                "LINKERD2_PROXY_IDENTITY_TOKEN_FILE": str(token),
                "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS": anchors,
                "LINKERD2_PROXY_IDENTITY_LOCAL_NAME": WorkloadIdentity(sa, NS).dns_name,
                "LINKERD2_PROXY_IDENTITY_SVC_ADDR": f"{LOOPBACK}:{identity_port}",
                "LINKERD2_PROXY_IDENTITY_SVC_NAME": control_plane_identity("identity").dns_name,
            }

        # tether.proxy, run by the call counter (idle until the harness signals it: bench/dataplane/callcount.py).
        proxy = [sys.executable, "-m", "bench.dataplane.callcount"]
        server_env = proxy_env(SERVER_IDENTITY.service_account, server_ip, inbound_port, server_outbound,
                               server_admin, [])
        client_env = proxy_env(CLIENT_IDENTITY.service_account, client_ip, client_inbound, client_outbound,
                               client_admin, [f"{service_ip}:{service_port}"])
        if self.policy:  # the server's policy watched from the start, as the injector lists the pod's ports
            server_env["LINKERD2_PROXY_INBOUND_PORTS"] = str(backend_port)
        else:  # bench/dataplane/no_policy.py: plaintext, answering UNIMPLEMENTED
            for env in (server_env, client_env):
                del env["LINKERD2_PROXY_POLICY_SVC_NAME"]
        for role, env, ip in (("server", server_env, server_ip), ("client", client_env, client_ip)):
            if role in tap_ports:
                env["LINKERD2_PROXY_TAP_SVC_NAME"] = tap_identity()
                env["LINKERD2_PROXY_CONTROL_LISTEN_ADDR"] = f"{ip}:{tap_ports[role]}"
            env[callcount.ENV] = str(work / f"calls-{role}")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        assert server_env["LINKERD2_PROXY_IDENTITY_LOCAL_NAME"] == SERVER_IDENTITY.dns_name
        controllers = [identity, destination]
        if not self.policy:
            controllers.append(ProxySpec("policy", [sys.executable, "-m", "bench.dataplane.no_policy",
                                                    f"{LOOPBACK}:{policy_port}"], (LOOPBACK, policy_port),
                                         env={"PYTHONPATH": str(REPO)}))
        if self.policy:
            controllers.append(ProxySpec("policy", tether + [
                "policy", "serve", "--store", str(work / "store.db"), "--addr", f"{LOOPBACK}:{policy_port}",
                "--admin-addr", f"{LOOPBACK}:{policy_admin}", "--tls-cert", str(certs.destination.chain),
                "--tls-key", str(certs.destination.key), "--trust-anchors", str(certs.anchor),
                "--cluster-networks", "127.0.0.0/8", "--admission-controller-disabled", "--log-level", "warning",
            ], (LOOPBACK, policy_port)))
        return Plan(
            proxies=[*controllers,
                     ProxySpec("server", proxy, (server_ip, inbound_port), env=server_env),
                     ProxySpec("client", proxy, (service_ip, service_port), env=client_env)],
            entry=(service_ip, service_port),
            meta={"admin": {"client": (client_ip, client_admin), "server": (server_ip, server_admin)},
                  "calls": {role: str(work / f"calls-{role}") for role in ("client", "server")},
                  "inbound": (server_ip, inbound_port), "identity_admin": identity_admin,
                  "tap": {role: (ip, tap_ports[role]) for role, ip in (("server", server_ip), ("client", client_ip))
                          if role in tap_ports}},
        )

    def start(self, ctx: Context, sup: Supervisor, pinning: Pinning, nice: int) -> None:
        """As every variant (all processes on the proxy CPU), then wait until both proxies hold a certificate.

        A Tether proxy binds its listeners at once but accepts only once identity has issued its
        certificate, so the listening port alone does not say it is ready: ``/ready`` does.
        """
        super().start(ctx, sup, pinning, nice)
        assert self.plan_ is not None
        deadline = time.monotonic() + 30
        for role in ("server", "client"):
            host, port = self.plan_.meta["admin"][role]
            while True:
                if self.procs[role].popen.poll() is not None:
                    raise StartError(f"{self.name}/{role} exited\n{self.procs[role].log_tail()}")
                try:
                    status, _ = _get(host, port, "/ready")
                    if status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise StartError(f"{self.name}/{role}: not ready after 30 s (no certificate from identity?)\n"
                                     f"{self.procs[role].log_tail()}")
                time.sleep(0.1)
        if self.tap_open is not None:
            self._open_tap(ctx, sup, pinning, nice)

    def _open_tap(self, ctx: Context, sup: Supervisor, pinning: Pinning, nice: int) -> None:
        """The watcher, on the load generator's CPU (a tap controller does not run beside the proxies)."""
        assert self.plan_ is not None and self.tap_open is not None
        tap = ctx.certs.tap
        if tap is None:
            raise StartError(f"{self.name}: the run's PKI has no tap identity (bench/dataplane/pki.py)")
        identities = {"server": SERVER_IDENTITY.dns_name, "client": CLIENT_IDENTITY.dns_name}
        targets = [f"{identities[role]}@{host}:{port}" for role, (host, port) in self.plan_.meta["tap"].items()]
        count_file = ctx.workdir / "tap-events"
        argv = [sys.executable, "-m", "bench.dataplane.tap_watch", "--anchors", str(ctx.certs.anchor),
                "--cert", str(tap.chain), "--key", str(tap.key), "--limit", str(self.tap_open),
                "--count-file", str(count_file), *targets]
        self.procs["tap-watch"] = sup.start(f"{self.name}/tap-watch", argv, cpus=pinning.load, nice=nice,
                                            log=ctx.workdir / "tap-watch.log", cwd=ctx.workdir,
                                            env={**os.environ, "PYTHONPATH": str(REPO)})
        self.plan_.meta["tap_events"] = str(count_file)

    def verify(self, ctx: Context) -> list[Check]:
        assert self.plan_ is not None
        meta = self.plan_.meta
        try:
            client = parse_metrics(_get(*meta["admin"]["client"], "/metrics")[1])
            server = parse_metrics(_get(*meta["admin"]["server"], "/metrics")[1])
        except OSError as e:
            return [Check("Tether proxy metrics readable", False, str(e))]
        accepted = total(client, "tcp_open_total", direction="outbound", peer="src")
        mtls = total(client, "tcp_open_total", direction="outbound", peer="dst", tls="true",
                     server_id=SERVER_IDENTITY.dns_name)
        plain_out = total(client, "tcp_open_total", direction="outbound", peer="dst") - mtls
        inbound_tls = total(server, "tcp_open_total", direction="inbound", peer="src", tls="true",
                            client_id=CLIENT_IDENTITY.dns_name)
        headers = total(server, "inbound_tcp_transport_header_connections_total")
        # The session protocol each proxy-to-proxy connection announced: HTTP/1 load goes over HTTP/2 when the
        # destination hints the endpoint h2 (the l5d-orig-proto upgrade), as between linkerd2-proxies.
        by_protocol = ", ".join(
            f"{p}: {total(server, 'inbound_tcp_transport_header_connections_total', session_protocol=p):.0f}"
            for p in ("http1", "http2"))
        out_errors = errors_by_reason(client, "outbound_tcp_errors_total")
        in_errors = errors_by_reason(server, "inbound_tcp_errors_total")
        # Expected: connections closed before sending a byte (the harness's readiness probe of each
        # listener, idle load-generator connections); the probe of the inbound port shows as one
        # "direct connections must be mutually authenticated". Anything else is a real error.
        unexpected = {k: v for k, v in out_errors.items() if k != "closed before detection"}
        unexpected.update({k: v for k, v in in_errors.items()
                           if k != "closed before detection"
                           and not (k == "direct connections must be mutually authenticated" and v <= 1)})
        errors = "; ".join(f"{side}{{error={k}}}={v:.0f}" for side, d in
                           (("outbound_tcp_errors_total", out_errors), ("inbound_tcp_errors_total", in_errors))
                           for k, v in d.items()) or "none"
        issued = identity_issued(LOOPBACK, int(meta["identity_admin"]))
        checks = [
            Check("Tether proxies got their certificates from the identity component",
                  issued >= 2, f"identity_certificates_issued_total={issued:.0f}"),
            Check("client proxy connected over mTLS to the server identity (from discovery)",
                  mtls > 0 and plain_out == 0,
                  f"tcp_open_total{{peer=dst,tls=true,server_id={SERVER_IDENTITY.dns_name}}}={mtls:.0f}, "
                  f"plaintext={plain_out:.0f}"),
            Check("server proxy saw the client identity and transport headers",
                  inbound_tls > 0 and headers > 0,
                  f"tcp_open_total{{inbound,peer=src,tls=true,client_id=bench-client…}}={inbound_tls:.0f}, "
                  f"inbound_tcp_transport_header_connections_total={headers:.0f} (session_protocol {by_protocol})"),
            Check("one mTLS connection per client connection (no handshake per request)",
                  0 < mtls <= accepted + 8,
                  f"{mtls:.0f} mTLS connections for {accepted:.0f} accepted client connections"),
            Check("no connection errors in the proxies (apart from probes closed before a byte)",
                  not unexpected, errors),
        ]
        if self.policy:
            allowed = total(server, "inbound_http_authz_allow_total", srv_name=SERVER_IDENTITY.service_account,
                            route_name="bench", authz_name="bench-client-only", client_id=CLIENT_IDENTITY.dns_name)
            denied = total(server, "inbound_http_authz_deny_total") + total(server, "inbound_http_route_not_found_total")
            checks.append(Check("server proxy authorized each request by the AuthorizationPolicy on the HTTPRoute",
                                allowed > 0 and denied == 0,
                                f"inbound_http_authz_allow_total{{route_name=bench,authz_name=bench-client-only}}="
                                f"{allowed:.0f}, denied or without a route={denied:.0f}"))
        if "tap_events" in meta:
            events = _tap_events(Path(meta["tap_events"]))
            watcher = self.procs["tap-watch"]
            alive = watcher.popen.poll() is None
            checks.append(Check("the tap stayed open on both proxies and received their events",
                                alive and events > 0,
                                f"{events} events" + ("" if alive else f"; the watcher exited: {watcher.log_tail(5)}")))
        return checks + tls13_probe(*meta["inbound"], ctx.certs)


def _tap_events(count_file: Path) -> int:
    try:
        return int(count_file.read_text().strip().partition("=")[2] or 0)
    except (OSError, ValueError):
        return 0


def _get(host: str, port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text as ``(name, labels, value)`` samples."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m:
            name, labels, value = m.groups()
            try:
                out.append((name, dict(_LABEL.findall(labels or "")), float(value)))
            except ValueError:
                continue
    return out


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **want: str) -> float:
    """The sum of ``name``'s samples whose labels include ``want``."""
    return sum(v for n, labels, v in samples if n == name and all(labels.get(k) == w for k, w in want.items()))


def errors_by_reason(samples: list[tuple[str, dict[str, str], float]], name: str) -> dict[str, float]:
    """``name``'s non-zero counts by their ``error`` label (what the proxy refused, and why)."""
    out: dict[str, float] = {}
    for n, labels, v in samples:
        if n == name and v:
            reason = labels.get("error", "?")
            out[reason] = out.get(reason, 0.0) + v
    return out


def identity_issued(host: str, admin_port: int) -> float:
    try:
        return total(parse_metrics(_get(host, admin_port, "/metrics")[1]), "identity_certificates_issued_total")
    except OSError:
        return 0.0


class TetherHTTP(_Tether):
    name = "tether-http"
    description = ("load -> Tether proxy -> mTLS (TLS 1.3, P-256) -> Tether proxy -> nginx; HTTP/1 detected, "
                   "routed per request by the request-level proxy when present, else carried per connection "
                   "(the version says which); identity and destination from a real control plane")
    compare_to = ("envoy", "haproxy")
    opaque = False


class TetherHTTPNoUpgrade(TetherHTTP):
    name = "tether-http-h1"
    description = ("tether-http with the destination's h2 upgrade off (--disable-h2-upgrade): HTTP/1 stays HTTP/1 "
                   "between the proxies, one pooled connection per request in flight: what the l5d-orig-proto "
                   "upgrade costs or saves")
    compare_to = ("tether-http",)
    h2_upgrade = False


class TetherHTTPTap(TetherHTTP):
    name = "tether-http-tap"
    description = ("tether-http with tap enabled in both proxies (LINKERD2_PROXY_TAP_SVC_NAME: the tap server "
                   "listens and the HTTP layers report to it) and no tap open: what tap costs when nobody watches")
    compare_to = ("tether-http",)
    tap = True


class TetherHTTPTapped(TetherHTTPTap):
    name = "tether-http-tapped"
    description = ("tether-http-tap with a tap open on both proxies, as `tether viz tap` of one pod opens it: "
                   "every request matched, at most 100 per one-second window and proxy (--max-rps 100) get "
                   "their three events, streamed over mTLS to a watcher on the load generator's CPU")
    compare_to = ("tether-http", "tether-http-tap")
    tap_open = 100


class TetherHTTPTappedAll(TetherHTTPTap):
    name = "tether-http-tapped-all"
    description = ("tether-http-tapped with no practical limit: every request of the run gets its three tap "
                   "events (the most a tap can cost)")
    compare_to = ("tether-http", "tether-http-tap")
    tap_open = 1_000_000


class TetherHTTPPolicy(TetherHTTP):
    name = "tether-http-policy"
    description = ("tether-http with a policy controller: a Server, an AuthorizationPolicy with a "
                   "MeshTLSAuthentication for the client's identity and an HTTPRoute on the path; every request "
                   "routed and authorized by the server proxy: what inbound policy costs")
    compare_to = ("tether-http",)
    policy = True


class TetherH2(_Tether):
    name = "tether-h2"
    description = ("h2load -> Tether proxy -> mTLS (TLS 1.3, P-256) -> Tether proxy -> nginx; HTTP/2 (prior "
                   "knowledge) detected, routed per stream, HTTP/2 on every hop")
    compare_to = ("envoy-h2", "haproxy-h2")
    opaque = False
    load = "h2"


class TetherGrpc(_Tether):
    name = "tether-grpc"
    description = ("h2load (gRPC unary) -> Tether proxy -> mTLS (TLS 1.3, P-256) -> Tether proxy -> nginx; "
                   "HTTP/2 routed per stream, HTTP/2 on every hop")
    compare_to = ("envoy-grpc", "haproxy-grpc")
    opaque = False
    load = "grpc"


class TetherTCP(_Tether):
    name = "tether-tcp"
    description = ("load -> Tether proxy -> mTLS (TLS 1.3, P-256) -> Tether proxy -> nginx; opaque port "
                   "(config.linkerd.io/opaque-ports): transport header, no detection")
    compare_to = ("haproxy-tcp",)
    opaque = True


def _commit() -> str:
    """``git <short hash>`` of the tree the proxy runs from, ``+changes`` when it differs; ``git unknown``."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "git unknown"
    return f"git {head}{'+changes' if dirty else ''}"
