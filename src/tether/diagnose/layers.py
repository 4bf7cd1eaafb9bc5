"""``tether diagnose``: walk a call's layers in order and stop at the first that fails, with evidence.

Layers (DEVELOPERS.md, "Every failure has a layer"): injection -> redirection ->
identity -> discovery -> policy -> proxy -> application.  Each layer reads real
state of the local platform: the store (pods, namespaces, services), iptables
rules inside the pods' namespaces, the proxies' admin ports (``/ready``,
``/metrics``) and served certificates, the destination's ``Get``/``GetProfile``
answers, the components' readiness, and the proxies' logs.  With ``--to`` the
last two layers also make one real call: from inside the source pod's network
namespace (so it goes through the source's proxy, as the app's calls do) to the
service, and one look at the target app itself from inside its pod (through
``lo``, which the proxy leaves alone) to see whether it speaks first.

The result is a ``Diagnosis`` whose JSON form is the contract documented in
``docs/diagnose.md``.  Caller: ``tether.cli.diagnose``.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tether.diagnose import facts, proxies
from tether.diagnose.walk import (
    PROBE_TIMEOUT_S,
    Authority,
    DiagnoseError,
    Diagnosis,
    Failure,
    Walk,
    ask_destination,
    ask_policy,
    parse_authority,
    proxy_error_meaning,
    service_port,
)
from tether.identity import pem, pki
from tether.injector.annotations import trust_root_sha256
from tether.naming import control_plane_identity
from tether.injector import annotations as inject_keys
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.launcher import Launcher, tail
from tether.platform.local.netns import LocalNetError
from tether.platform.local.probes import socket_in
from tether.ports import DEFAULT_OPAQUE_PORTS, parse_port_set
from tether.proxy.codec.http2 import ACK, FRAME_HEADER, SETTINGS, H2Endpoint
from tether.proxy.codec.http2_events import GoAway, ResponseReceived, StreamReset, error_name
from tether.store import Store, StoreError
from tether.viz.exposition import Exposition, parse

BANNER_WAIT_S = 0.3
# How long the call waits for its answer: past the proxies' 3 s HTTP fail-fast timeout, so their answer (a 504
# with l5d-proxy-error, or a reset), not ours, ends a call that cannot be routed.
CALL_TIMEOUT_S = 5.0
_OUTBOUND_ERRORS = ("outbound_http_errors_total", "outbound_tcp_errors_total")
_DISCOVERY_LOG = re.compile(r"(?i)discovery|destination|fail-?fast")
_TLS_LOG = re.compile(r"(?i)tls|handshake|certificate verify|unknown ca")
LOG_LINES = 400
_DENY = "deny"


def http2_server_preface(banner: bytes) -> bool:
    """Whether ``banner`` opens with an HTTP/2 server's preface: a SETTINGS frame on stream 0 (RFC 9113 §3.4).

    A gRPC or other HTTP/2 server sends it as soon as it accepts, but its client sends its own preface at
    once too, so the proxy's protocol detection is not held up: that app does not "speak first"."""
    if len(banner) < FRAME_HEADER:
        return False
    length = int.from_bytes(banner[0:3], "big")
    stream = int.from_bytes(banner[5:9], "big") & 0x7FFF_FFFF
    return banner[3] == SETTINGS and not banner[4] & ACK and stream == 0 and length % 6 == 0


@dataclass(frozen=True)
class Probe:
    """What one real call from the source pod to the service got."""

    connected: bool
    status: int | None = None
    proxy_error: str | None = None
    error: str | None = None
    head: str = ""


def _h2_call(sock: socket.socket, authority: Authority) -> Probe:
    """A gRPC request with prior-knowledge HTTP/2 on the connected ``sock``, as a gRPC client makes one (the
    health check's path; any answer, UNIMPLEMENTED included, is the app's or the proxies')."""
    h2 = H2Endpoint(client=True)
    h2.initiate()
    stream = h2.next_stream_id()
    h2.send_headers(stream, [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", authority.fqdn.encode()),
                             (b":path", b"/grpc.health.v1.Health/Check"), (b"content-type", b"application/grpc"),
                             (b"te", b"trailers"), (b"user-agent", b"tether-diagnose")], end_stream=True)
    try:
        sock.sendall(h2.data_to_send())
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return Probe(True, error="closed without an answer")
            events = h2.receive_data(chunk)
            if out := h2.data_to_send():
                sock.sendall(out)
            for event in events:
                if isinstance(event, ResponseReceived) and event.stream_id == stream:
                    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
                    status = int(headers.get(":status", "0"))
                    grpc = headers.get("grpc-status")
                    return Probe(True, status, headers.get("l5d-proxy-error"),
                                 head=f"HTTP/2 {status}" + (f" grpc-status: {grpc}" if grpc else ""))
                if isinstance(event, StreamReset) and event.stream_id == stream:
                    return Probe(True, error=f"stream reset ({error_name(event.error_code)})")
                if isinstance(event, GoAway):
                    return Probe(True, error=f"GOAWAY ({error_name(event.error_code)})")
            if h2.failed:
                return Probe(True, error="the answer broke HTTP/2")
    except OSError as exc:
        return Probe(True, error=exc.strerror or str(exc))


class LocalDiagnosis(Walk):
    """One diagnosis on the local platform of ``config``."""

    def __init__(self, config: LocalPlatformConfig, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.config = config
        self.now = now
        self._metrics: dict[str, Exposition] = {}

    # -- evidence helpers --------------------------------------------------------------------

    def _list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with Store(self.config.layout.store) as store:
            return store.list(kind, namespace).items

    def _get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        with Store(self.config.layout.store) as store:
            return store.get(kind, namespace, name)

    def _scrape(self, pod: Mapping[str, Any], fresh: bool = False) -> Exposition | None:
        key = str(facts.ref(pod))
        if key in self._metrics and not fresh:
            return self._metrics[key]
        ip = proxies.pod_ip(pod)
        if not ip:
            return None
        try:
            answer = proxies.admin_get(ip, "/metrics", netns=facts.netns_of(self.config, pod))
        except proxies.ProxyUnreachable as exc:
            self._note(f"proxy admin {key}", str(exc))
            return None
        self._metrics[key] = parse(answer.body)
        return self._metrics[key]

    def _samples(self, pod: Mapping[str, Any], name: str, fresh: bool = False, **match: str) -> list[tuple[dict, float]]:
        exp = self._scrape(pod, fresh)
        if exp is None:
            return []
        return [(s.labels, s.value) for s in exp.named(name)
                if all(s.labels.get(k) == v for k, v in match.items())]

    def _metric_note(self, pod: Mapping[str, Any], name: str, labels: Mapping[str, str], value: float) -> None:
        self._sample_note(str(facts.ref(pod)), name, labels, value)

    def _log_lines(self, pod: Mapping[str, Any], pattern: re.Pattern[str], limit: int = 3) -> list[str]:
        meta = pod["metadata"]
        path = self.config.layout.container_log(meta["namespace"], meta["name"], proxies.PROXY_CONTAINER)
        if not path.exists():
            return []
        return [line for line in tail(path, LOG_LINES).splitlines() if pattern.search(line)][-limit:]

    def _error_counts(self, pod: Mapping[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The pod proxy's outbound error counters now, by name and labels."""
        return {(name, tuple(labels.items())): value for name in _OUTBOUND_ERRORS
                for labels, value in self._samples(pod, name, fresh=True)}

    def _note_proxy_errors(self, source: Mapping[str, Any], since: Mapping[Any, float] | None = None,
                           when: str = "since the proxy started") -> list[tuple[str, dict[str, str]]]:
        """Note the source proxy's outbound errors (those counted after ``since``, when given) and its log lines
        about discovery; returns the errors as (metric name, labels)."""
        found = []
        for (name, labels), value in self._error_counts(source).items():
            count = value - (since or {}).get((name, labels), 0.0)
            if count > 0:
                self._sample_note(str(facts.ref(source)), name, dict(labels), count, when)
                found.append((name, dict(labels)))
        if found:
            for line in self._log_lines(source, _DISCOVERY_LOG):
                self._note(f"log {facts.ref(source)} linkerd-proxy", line)
        return found

    # -- targets -------------------------------------------------------------------------------

    def _pods_of(self, target: str, namespace: str) -> list[dict[str, Any]]:
        try:
            with Store(self.config.layout.store) as store:
                return facts.workload_pods(store, target, namespace)
        except facts.TargetError as exc:
            raise DiagnoseError(str(exc)) from None

    def _service(self, authority: Authority) -> dict[str, Any] | None:
        return self._get("Service", authority.namespace, authority.service)

    def _endpoint_pods(self, service: Mapping[str, Any]) -> list[dict[str, Any]]:
        selector = (service.get("spec") or {}).get("selector") or {}
        pods = self._list("Pod", service["metadata"]["namespace"])
        return [p for p in pods if facts.selects(selector, p["metadata"].get("labels") or {}) and facts.running(p)]

    # -- layers ----------------------------------------------------------------------------------

    def _injection(self, pod: Mapping[str, Any], side: str) -> None:
        ref = facts.ref(pod)
        ns = self._get("Namespace", None, pod["metadata"]["namespace"]) or {"metadata": {}}
        ns_annotations = ns["metadata"].get("annotations") or {}
        self._inject_notes(pod, str(ref), ns_annotations, "store")
        if not facts.meshed(pod):
            raise self._unmeshed(pod, str(ref), side, ns_annotations)
        self._note(f"store: pod {ref}", "has the linkerd-proxy container")

    def _redirection(self, pod: Mapping[str, Any], side: str, port: int | None, inbound: bool) -> None:
        ref = facts.ref(pod)
        netns = facts.netns_of(self.config, pod)
        try:
            rules = facts.nat_rules(netns)
        except LocalNetError as exc:
            raise Failure(f"cannot read the {side} pod's rules: {exc}", "is the pod still running? `tether get pods`")
        self._note(f"iptables nat {netns}", f"{sum(1 for r in rules if 'PROXY_INIT' in r)} proxy-init rules")
        problem = facts.redirect_problem(rules)
        if problem:
            raise Failure(f"the {side} pod {ref}'s traffic does not go through its proxy: {problem}",
                          f"restart the pod so its init step installs the rules again (`tether delete pod "
                          f"{ref.name} -n {ref.namespace}`)")
        self._skip_ports(pod, str(ref), side, port, inbound, "store",
                         f"then `tether delete pod {ref.name} -n {ref.namespace}`")

    def _identity(self, pod: Mapping[str, Any], side: str, peer: Mapping[str, Any] | None) -> None:
        ref = facts.ref(pod)
        launcher = Launcher(self.config.layout.components, self.config.layout.logs)
        status = launcher.status("identity")
        self._note("component identity", f"{status.state}, ready={'yes' if status.ready else 'no'}")
        files = self.config.layout.pki
        try:
            anchors_pem = (files / "ca.crt").read_text()
            pem.parse_certificates(anchors_pem.encode(), str(files / "ca.crt"))  # readable certificates, or say so
            issuer = pem.read_certificates(files / "issuer.crt")[0]
        except (OSError, pem.PemError) as exc:
            raise Failure(f"the mesh PKI cannot be read: {exc}", "run `tether check`")
        now = self.now()
        if not issuer.not_valid_before_utc <= now < issuer.not_valid_after_utc:
            self._note(f"file {files / 'issuer.crt'}", f"valid {issuer.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                       f"{issuer.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
            raise Failure("the identity issuer certificate is outside its validity period: no proxy can be "
                          "certified", "make a new issuer (`tether check` shows how)")
        expiry = self._samples(pod, "control_identity_cert_expiration_timestamp_seconds")
        refreshes = self._samples(pod, "control_identity_cert_refreshes_total")
        for labels, value in refreshes:
            self._metric_note(pod, "control_identity_cert_refreshes_total", labels, value)
        given = proxies.proxy_env(pod, "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS")
        foreign_trust = given is not None and trust_root_sha256(given) != trust_root_sha256(anchors_pem)
        if foreign_trust:
            assert given is not None
            self._note(f"store: pod {ref}", f"trust root sha256 {trust_root_sha256(given)[:16]}..., current "
                       f"{trust_root_sha256(anchors_pem)[:16]}...")
        restart = f"restart it (`tether delete pod {ref.name} -n {ref.namespace}`)"
        certified = bool(expiry) and now.timestamp() < expiry[0][1]
        if not certified and not foreign_trust:
            lines = self._log_lines(pod, re.compile(r"(?i)certif|identity"))
            for line in lines:
                self._note(f"log {ref} linkerd-proxy", line)
            if expiry:
                self._metric_note(pod, "control_identity_cert_expiration_timestamp_seconds", {}, expiry[0][1])
            component = "" if status.ready else " (the identity component is not ready)"
            raise Failure(f"the {side} pod {ref}'s proxy holds no valid certificate{component}",
                          "start identity (`tether up`) and see `tether logs identity`" if not status.ready
                          else f"see `tether logs {ref.name} -n {ref.namespace} -c proxy`")
        problem = None
        ip, name = proxies.pod_ip(pod), proxies.identity_of(pod)
        if certified and ip and name:
            expires = datetime.fromtimestamp(expiry[0][1], UTC)
            self._note(f"proxy metrics {ref}", f"control_identity_cert_expiration_timestamp_seconds "
                       f"{expiry[0][1]:.0f} ({expires:%Y-%m-%dT%H:%M:%SZ})")
            try:
                leaf = proxies.served_certificate(ip, name)
            except proxies.ProxyUnreachable as exc:
                raise Failure(f"the {side} pod {ref}'s proxy does not complete a TLS handshake: {exc}",
                              f"see `tether logs {ref.name} -n {ref.namespace} -c proxy`")
            self._note(f"tls {ip}:{proxies.INBOUND_PORT}", f"serves {pki.subject_cn(leaf)} issued by "
                       f"{leaf.issuer.rfc4514_string()}, valid until {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
            problem = pki.link_problem(leaf, issuer)
        if foreign_trust or problem is not None:
            refused = self._note_tls_failures(pod, peer)
            raise self._trust_failure(side, str(ref), foreign_trust, problem, refused, restart)

    def _note_tls_failures(self, pod: Mapping[str, Any], peer: Mapping[str, Any] | None) -> float:
        """Note the TLS failures both proxies met (the pod's refused handshakes, the peer's failed calls, their log
        lines about TLS); returns how many handshakes the pod's proxy refused."""
        refused = 0.0
        for labels, value in self._samples(pod, "inbound_tcp_errors_total", fresh=True):
            if "tls" in labels.get("error", "") and value > 0:
                self._metric_note(pod, "inbound_tcp_errors_total", labels, value)
                refused += value
        if peer is not None:
            self._note_proxy_errors(peer)
        for side in (pod, *([peer] if peer is not None else [])):
            for line in self._log_lines(side, _TLS_LOG):
                self._note(f"log {facts.ref(side)} linkerd-proxy", line)
        return refused

    def _destination_tls(self) -> Any:
        # Imported here, as the other controller clients below: each pulls in its whole package, and a
        # diagnosis without --to needs none of them (the command starts faster).
        from tether.serving.channel import ClientTls

        name = control_plane_identity("destination", self.config.control_plane_ns, self.config.trust_domain).dns_name
        layout = self.config.layout  # with the platform's client certificate: the destination requires one
        return ClientTls(roots=layout.trust_anchors, server_name=name, cert=layout.cli_cert, key=layout.cli_key)

    def _discovery(self, authority: Authority, source: Mapping[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, Any], dict | None]:
        service = self._service(authority)
        svc_port = self._judge_service(authority, service, "store", "tether get svc -A")
        assert service is not None
        try:
            endpoints, profile, error = asyncio.run(ask_destination(
                self.config.address(self.config.ports.destination), self._destination_tls(), authority,
                source["metadata"]["namespace"]))
        except OSError as exc:  # the platform's client certificate (pki/cli.crt) is missing or unreadable
            raise Failure(f"cannot ask the destination: {exc.filename}: {exc.strerror}",
                          "run `tether up`: it issues the platform's client certificate") from None
        launcher = Launcher(self.config.layout.components, self.config.layout.logs)
        if error:
            status = launcher.status("destination")
            self._note("component destination", f"{status.state}, ready={'yes' if status.ready else 'no'}")
            self._note_proxy_errors(source)
            raise Failure(f"the destination does not resolve {authority.fqdn}: {error}",
                          "`tether status`; `tether logs destination`")
        pods = self._endpoint_pods(service)
        try:
            self._judge_endpoints(authority, service, endpoints, profile, pods, sum(1 for p in pods if facts.ready(p)),
                                  "store", f"tether get pods -n {authority.namespace}")
        except Failure:
            # What the workload's own calls met: its proxy fails them fast (504, l5d-proxy-error) while no
            # endpoint is ready.
            self._note_proxy_errors(source)
            raise
        return service, svc_port, profile

    def _controller_policy(self, target: Mapping[str, Any], port: int, source: Mapping[str, Any]) -> None:
        """The policy controller's answer for the target's port, judged for the source's identity and address."""
        ref = facts.ref(target)
        from tether.policy.client import PolicyError

        client_id, client_ip = proxies.identity_of(source) or "", proxies.pod_ip(source) or "0.0.0.0"
        try:
            meta = target["metadata"]
            server = asyncio.run(ask_policy(self.config.address(self.config.ports.policy), self._destination_tls(),
                                            meta["namespace"], meta["name"], port))
        except (PolicyError, TimeoutError) as exc:
            raise Failure(f"the policy controller has no answer for {ref}:{port}: {exc or 'timed out'}",
                          "`tether status`; `tether logs policy`") from None
        except OSError as exc:
            raise Failure(f"cannot ask the policy controller: {exc.filename}: {exc.strerror}",
                          "run `tether up`: it issues the platform's client certificate") from None
        self._judge_server(server, str(ref), port, client_id, client_ip)

    def _policy(self, target: Mapping[str, Any], port: int, source: Mapping[str, Any]) -> None:
        ref = facts.ref(target)
        client_id = proxies.identity_of(source) or ""
        launcher = Launcher(self.config.layout.components, self.config.layout.logs)
        controller = launcher.running("policy") is not None
        default = proxies.proxy_env(target, "LINKERD2_PROXY_INBOUND_DEFAULT_POLICY") or "all-unauthenticated"
        self._note(f"store: pod {ref}", f"default inbound policy {default}")
        denied = [(labels, value) for name in ("inbound_http_authz_deny_total", "inbound_tcp_authz_deny_total")
                  for labels, value in self._samples(target, name, fresh=True, target_port=str(port))
                  if labels.get("client_id", client_id) == client_id and value > 0]
        for labels, value in denied:
            self._metric_note(target, "inbound_authz_deny_total", labels, value)
        if controller:
            # The controller's answer decides; the counters above may date from an older policy.
            self._controller_policy(target, port, source)
            return
        if default == _DENY:
            raise Failure(f"the target pod {ref} refuses {client_id or 'the client'} on port {port} "
                          f"(default policy {default})",
                          "authorize the client: a Server for the port with an AuthorizationPolicy naming its "
                          "identity, or another config.linkerd.io/default-inbound-policy")
        if denied:
            raise Failure(f"the target pod {ref}'s proxy has denied {client_id or 'the client'} on port {port}",
                          "authorize the client: a Server for the port with an AuthorizationPolicy naming its "
                          "identity")

    def _speaks_first(self, target: Mapping[str, Any], port: int) -> bytes | None:
        """What the app at ``port`` sends before it is sent anything (asked from inside its own pod)."""
        try:
            sock = socket_in(facts.netns_of(self.config, target))
        except OSError:
            return None
        with sock:
            sock.settimeout(PROBE_TIMEOUT_S)
            try:
                sock.connect(("127.0.0.1", port))
                sock.settimeout(BANNER_WAIT_S)
                return sock.recv(256) or None
            except OSError:
                return None

    def _app_listens(self, target: Mapping[str, Any], port: int) -> str | None:
        try:
            sock = socket_in(facts.netns_of(self.config, target))
        except OSError as exc:
            return str(exc)
        with sock:
            sock.settimeout(PROBE_TIMEOUT_S)
            try:
                sock.connect(("127.0.0.1", port))
            except OSError as exc:
                return exc.strerror or str(exc)
        return None

    def _probe(self, source: Mapping[str, Any], service: Mapping[str, Any], authority: Authority,
               protocol: str) -> Probe:
        """One call from inside the source pod to the service's cluster IP, as its app makes it: ``opaque`` (a
        connection), ``http2`` (a gRPC request) or ``http1`` (a GET)."""
        ip = (service.get("spec") or {}).get("clusterIP")
        try:
            sock = socket_in(facts.netns_of(self.config, source))
        except OSError as exc:
            return Probe(False, error=str(exc))
        with sock:
            sock.settimeout(PROBE_TIMEOUT_S)
            try:
                sock.connect((ip, authority.port))
            except OSError as exc:
                return Probe(False, error=exc.strerror or str(exc))
            if protocol == "opaque":
                return Probe(True)
            sock.settimeout(CALL_TIMEOUT_S)
            if protocol == "http2":
                return _h2_call(sock, authority)
            try:
                sock.sendall(f"GET / HTTP/1.1\r\nHost: {authority.fqdn}\r\nUser-Agent: tether-diagnose\r\n"
                             "Connection: close\r\n\r\n".encode())
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 16384:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    head += chunk
            except OSError as exc:
                return Probe(True, error=exc.strerror or str(exc))
        text = head.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        lines = text.split("\r\n")
        parts = lines[0].split()
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            return Probe(True, error=f"no HTTP answer ({lines[0][:60]!r})" if text else "closed without an answer")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return Probe(True, int(parts[1]), headers.get("l5d-proxy-error"), head=lines[0])

    def _opaque(self, target: Mapping[str, Any], svc: Mapping[str, Any], port: int, target_port: int,
                profile: dict | None) -> bool:
        if profile is not None and profile.get("opaque_protocol"):
            return True
        svc_ports, _ = parse_port_set((svc["metadata"].get("annotations") or {}).get(inject_keys.OPAQUE_PORTS, ""))
        text = proxies.proxy_env(target, "LINKERD2_PROXY_INBOUND_PORTS_DISABLE_PROTOCOL_DETECTION")
        pod_ports = parse_port_set(text)[0] if text is not None else DEFAULT_OPAQUE_PORTS
        return port in svc_ports or target_port in pod_ports

    def _proxy_and_application(self, source: Mapping[str, Any], target: Mapping[str, Any], service: dict,
                               svc_port: dict, authority: Authority, profile: dict | None) -> None:
        ref = facts.ref(target)
        target_port = facts.target_port(svc_port, target) or authority.port
        opaque = self._opaque(target, service, authority.port, target_port, profile)
        banner = self._speaks_first(target, target_port)
        http2 = banner is not None and http2_server_preface(banner)
        if http2:
            self._note(f"app {ref}:{target_port}", "opens with an HTTP/2 SETTINGS frame (an HTTP/2 server, as gRPC's): "
                       "called with HTTP/2")
        elif banner is not None and not opaque:
            self._note(f"app {ref}:{target_port}", f"sends {banner[:40]!r} before the client says anything")
            raise Failure(
                f"the app on {ref}:{target_port} speaks first, but the port is not opaque: the client's proxy "
                "waits for the client's first bytes to detect the protocol (10 s detect timeout) before it "
                "connects",
                f"mark the port opaque: {inject_keys.OPAQUE_PORTS}: \"{target_port}\" on the pods and "
                f"\"{authority.port}\" on the Service")
        before = self._error_counts(source)
        probe = self._probe(source, service, authority, "opaque" if opaque else "http2" if http2 else "http1")
        self._note(f"call from {facts.ref(source)} to {authority.fqdn}",
                   probe.head or ("connected" if probe.connected and not probe.error else probe.error or "connected"))
        source_id = proxies.identity_of(source) or ""
        errors = self._note_proxy_errors(source, before, "during diagnose's call")
        tls_opens = [(labels, v) for labels, v in self._samples(target, "tcp_open_total", fresh=True,
                                                                direction="inbound", peer="src",
                                                                target_port=str(target_port))
                     if labels.get("client_id") == source_id]
        for labels, value in tls_opens:
            self._metric_note(target, "tcp_open_total", labels, value)
        refused = self._app_listens(target, target_port)
        if refused is not None:
            self._note(f"app {ref}:{target_port}", f"connect from inside the pod: {refused}")
        if probe.proxy_error is not None:
            if refused is not None:
                self._layer("application")
                raise Failure(f"the app in {ref} refuses connections on port {target_port} ({refused}); the "
                              f"target's proxy answered {probe.status} ({probe.proxy_error})",
                              f"is the app listening on {target_port}? `tether logs {ref.name} -n {ref.namespace}`")
            raise Failure(f"the proxies failed the call: {probe.status} l5d-proxy-error: {probe.proxy_error}"
                          + proxy_error_meaning(probe.proxy_error) + self._discovery_hint(errors),
                          f"see `tether logs {facts.ref(source).name} -n {facts.ref(source).namespace} -c proxy`")
        if not probe.connected or probe.error:
            if refused is not None:
                self._layer("application")
                raise Failure(f"the app in {ref} refuses connections on port {target_port} ({refused})",
                              f"is the app listening on {target_port}? `tether logs {ref.name} -n {ref.namespace}`")
            if errors:
                name, labels = errors[0]
                error = labels.get("error", "")
                raise Failure(f"the client's proxy failed the call ({probe.error or 'not connected'}): "
                              f"{name}{{error=\"{error}\"}}{proxy_error_meaning(error)}" + self._discovery_hint(errors),
                              f"see `tether logs {facts.ref(source).name} -n {facts.ref(source).namespace} -c proxy`")
            raise Failure(f"the call failed: {probe.error or 'not connected'}",
                          f"see `tether logs {facts.ref(source).name} -n {facts.ref(source).namespace} -c proxy`")
        if not any(labels.get("tls") == "true" for labels, _ in tls_opens):
            raise Failure(f"the connection from {source_id} to {ref} is not mTLS", "run `tether check --proxy`")
        if refused is not None or (probe.status is not None and probe.status >= 500):
            self._layer("application")
            raise Failure(f"the app in {ref} answered {probe.status}" if refused is None else
                          f"the app in {ref} refuses connections on port {target_port} ({refused})",
                          f"see the app's log: `tether logs {ref.name} -n {ref.namespace}`")

    @staticmethod
    def _discovery_hint(errors: list[tuple[str, dict[str, str]]]) -> str:
        if any("discovery" in labels.get("error", "") for _, labels in errors):
            return ("; the destination answers diagnose (discovery passed), so the client's proxy's own path to "
                    "it is broken")
        return ""

    # -- the walk ------------------------------------------------------------------------------

    def run(self, target: str, namespace: str, to: str | None) -> Diagnosis:
        self._start(target, to)
        try:
            sources = self._pods_of(target, namespace)
            authority = parse_authority(to, self.config.cluster_domain) if to else None
        except StoreError as exc:
            raise DiagnoseError(str(exc)) from None
        source = sources[0]
        if not facts.running(source):
            raise DiagnoseError(f"pod {facts.ref(source)} is not running "
                                f"({(source.get('status') or {}).get('phase', 'no status')})")
        try:
            self._walk(source, authority)
        except Failure as failure:
            return self._failed(failure)
        return self._ok(authority)

    def _walk(self, source: dict[str, Any], authority: Authority | None) -> None:
        service = svc_port = profile = None
        targets: list[dict[str, Any]] = []
        if authority is not None:
            service = self._service(authority)
            targets = self._endpoint_pods(service) if service else []
        target = next((t for t in targets if facts.ready(t)), targets[0] if targets else None)

        self._layer("injection")
        self._injection(source, "source")
        if target is not None:
            self._injection(target, "target")
        self._pass()

        self._layer("redirection")
        target_port = None
        if service is not None and target is not None:
            sp = service_port(service, authority.port) if authority else None
            target_port = facts.target_port(sp, target) if sp else None
        self._redirection(source, "source", authority.port if authority else None, inbound=False)
        if target is not None:
            self._redirection(target, "target", target_port, inbound=True)
        self._pass()

        self._layer("identity")
        self._identity(source, "source", target)
        if target is not None:
            self._identity(target, "target", source)
        self._pass()

        if authority is None:
            self._layer("proxy")
            ip = proxies.pod_ip(source)
            try:
                ready = proxies.admin_get(ip, "/ready", netns=facts.netns_of(self.config, source)) if ip else None
            except proxies.ProxyUnreachable as exc:
                raise Failure(f"the proxy of {facts.ref(source)} does not answer: {exc}",
                              "see `tether logs POD -c proxy`") from None
            self._note(f"proxy admin {facts.ref(source)}", f"/ready {ready.status if ready else 'no pod IP'}")
            if ready is None or ready.status != 200:
                raise Failure(f"the proxy of {facts.ref(source)} is not ready", "see `tether logs POD -c proxy`")
            self._pass()
            return

        self._layer("discovery")
        service, svc_port, profile = self._discovery(authority, source)
        # Endpoints exist now: pick the one the destination knows (ready) for the remaining layers.
        targets = self._endpoint_pods(service)
        target = next((t for t in targets if facts.ready(t)), None)
        if target is None:
            raise Failure(f"{authority.fqdn} has no ready pods", f"tether get pods -n {authority.namespace}")
        self._pass()

        self._layer("policy")
        port = facts.target_port(svc_port, target) or authority.port
        self._policy(target, port, source)
        self._pass()

        self._layer("proxy")
        self._proxy_and_application(source, target, service, svc_port, authority, profile)
        self._pass()
        self._layer("application")
        self._pass()
