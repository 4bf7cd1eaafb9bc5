"""``tether diagnose --platform kubernetes``: the same layers, with evidence from the API server and the proxies.

Nothing but the kubeconfig is needed.  What each layer reads:

- injection: the pods (``po/NAME``, or the Deployment's pods by its selector)
  and their namespace's annotations; the pod spec's ``linkerd-proxy`` container;
- redirection: the pod's ``linkerd-init`` container (proxy-init) or, in CNI
  mode, the ``linkerd-network-validator`` — their exit status as the kubelet
  reports it — and the skip-ports annotations;
- identity: the control plane's ``linkerd-identity-trust-roots`` ConfigMap and
  ``linkerd-identity-issuer`` Secret, the identity pods' readiness, the pod's
  ``linkerd.io/trust-root-sha256``, the proxy's identity metrics and the
  certificate it serves (admin and inbound ports reached through the API
  server's port-forward), the proxy's log lines about certificates;
- discovery and policy: the destination's ``Get``/``GetProfile`` and the policy
  controller's ``GetPort``, asked through a port-forward to a ready pod of each,
  their certificates verified against the published trust anchors;
- proxy and application: no call is made into a cluster (a pod's network is
  out of reach); the verdict is read off the traffic both proxies already
  carried — the source proxy's ``outbound_*_errors_total`` and
  ``response_total`` for the authority, the target proxy's inbound
  ``tcp_open_total`` for the client's identity (mTLS or not).

The cluster and trust domains come from the ``linkerd-config`` ConfigMap.
``tunnel(namespace, pod, port)`` makes the dialer of one pod's port (the API
server's port-forward in production; tests give a loopback stand-in, kmock
speaking no port-forward protocol).  Caller: ``tether.cli.diagnose``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import yaml

from tether.diagnose import facts, kube_reach, proxies
from tether.diagnose.kube import mesh_domains
from tether.diagnose.kube_metrics import TargetNotFound, workload_pods
from tether.diagnose.walk import (
    Authority,
    DiagnoseError,
    Diagnosis,
    Failure,
    Walk,
    ask_destination,
    ask_policy,
    parse_authority,
    proxy_error_meaning,
)
from tether.identity import pem, pki
from tether.injector.annotations import TRUST_ROOT_SHA256, trust_root_sha256
from tether.injector.decision import INIT_CONTAINER, PROXY_CONTAINER, VALIDATOR_CONTAINER
from tether.naming import control_plane_identity
from tether.platform.kubernetes.client import ApiError, KubeClient, KubeError
from tether.platform.kubernetes.portforward import Dial
from tether.viz.exposition import Exposition, parse

ISSUER_SECRET = "linkerd-identity-issuer"
CONFIG_MAP = "linkerd-config"
LOG_LINES = 400
_CERT_LOG = re.compile(r"(?i)certif|identity|tls")
_DESTINATION_PORT = 8086
_POLICY_PORT = 8090

Tunnel = Callable[[str, str, int], Dial]


def _init_verdict(pod: Mapping[str, Any], name: str) -> tuple[bool, str]:
    """Whether init container ``name`` completed (exit 0), and what the kubelet says about it."""
    status = next((s for s in (pod.get("status") or {}).get("initContainerStatuses") or () if s.get("name") == name),
                  None)
    if status is None:
        return facts.running(pod), "no status reported" + (" (the pod runs, so it completed)" if facts.running(pod)
                                                           else "")
    state = status.get("state") or {}
    if "terminated" in state:
        done = state["terminated"]
        text = f"terminated, exit code {done.get('exitCode')}" + (f" ({done['reason']})" if done.get("reason") else "")
        if done.get("message"):
            text += f": {done['message'].strip()}"
        return done.get("exitCode") == 0, text
    waiting = state.get("waiting") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    text = f"waiting ({waiting.get('reason', 'not started')})" if waiting or not state else "running"
    if last:
        text += f"; last run exit code {last.get('exitCode')}" + (f": {last['message'].strip()}"
                                                                 if last.get("message") else "")
    return False, text


class KubeDiagnosis(Walk):
    """One diagnosis against the API server of ``client``."""

    def __init__(self, client: KubeClient, tunnel: Tunnel, control_plane_ns: str, *,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.client = client
        self.tunnel = tunnel
        self.cp = control_plane_ns
        self.now = now
        self._metrics: dict[str, Exposition | None] = {}
        self._anchors: str | None = None

    # -- the API -----------------------------------------------------------------------------------

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise DiagnoseError(str(exc)) from None
        except KubeError as exc:
            raise DiagnoseError(str(exc)) from None

    async def _list(self, path: str, **params: str) -> list[dict[str, Any]]:
        try:
            return list((await self.client.get(path, params or None)).get("items") or ())
        except KubeError as exc:
            raise DiagnoseError(str(exc)) from None

    async def _settings(self) -> tuple[str, str]:
        """The cluster domain and trust domain of the installed control plane (``linkerd-config``)."""
        found = await self._get(f"/api/v1/namespaces/{self.cp}/configmaps/{CONFIG_MAP}")
        if found is None:
            raise DiagnoseError(f"ConfigMap {self.cp}/{CONFIG_MAP} not found: is the control plane installed in "
                                f"{self.cp}? (-L names its namespace)")
        try:
            values = yaml.safe_load((found.get("data") or {}).get("values") or "") or {}
        except yaml.YAMLError as exc:
            raise DiagnoseError(f"ConfigMap {self.cp}/{CONFIG_MAP}: values is not YAML: {exc}") from None
        if not isinstance(values, dict):
            raise DiagnoseError(f"ConfigMap {self.cp}/{CONFIG_MAP}: values is not a mapping")
        return mesh_domains(values)

    async def _namespace_annotations(self, namespace: str) -> dict[str, str]:
        found = next((n for n in await self._list("/api/v1/namespaces") if n["metadata"]["name"] == namespace), None)
        return dict(((found or {}).get("metadata") or {}).get("annotations") or {})

    async def _pods_of(self, target: str, namespace: str) -> list[dict[str, Any]]:
        try:
            pods = await workload_pods(self.client, [target], namespace)
        except TargetNotFound as exc:
            raise DiagnoseError(str(exc)) from None
        except KubeError as exc:
            raise DiagnoseError(str(exc)) from None
        if not pods:
            raise DiagnoseError(f"{target} has no pods in namespace {namespace}")
        return sorted(pods, key=lambda p: (not facts.running(p), not facts.ready(p), p["metadata"]["name"]))

    async def _selected(self, service: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The running pods the Service's selector picks."""
        selector = (service.get("spec") or {}).get("selector") or {}
        if not selector:
            return []
        listed = await self._list(f"/api/v1/namespaces/{service['metadata']['namespace']}/pods",
                                  labelSelector=",".join(f"{k}={v}" for k, v in sorted(selector.items())))
        return sorted((p for p in listed if facts.selects(selector, p["metadata"].get("labels") or {})
                       and facts.running(p)), key=lambda p: (not facts.ready(p), p["metadata"]["name"]))

    # -- the proxies, through port-forwards -------------------------------------------------------

    async def _admin(self, pod: Mapping[str, Any], path: str) -> proxies.AdminAnswer:
        return await kube_reach.pod_admin(self.tunnel, pod, path)

    async def _scrape(self, pod: Mapping[str, Any]) -> Exposition | None:
        key = str(facts.ref(pod))
        if key not in self._metrics:
            try:
                self._metrics[key] = parse((await self._admin(pod, "/metrics")).body)
            except proxies.ProxyUnreachable as exc:
                self._note(f"proxy admin {key}", str(exc))
                self._metrics[key] = None
        return self._metrics[key]

    async def _samples(self, pod: Mapping[str, Any], name: str, **match: str) -> list[tuple[dict, float]]:
        exp = await self._scrape(pod)
        if exp is None:
            return []
        return [(s.labels, s.value) for s in exp.named(name) if all(s.labels.get(k) == v for k, v in match.items())]

    async def _note_proxy_errors(self, source: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
        """Note the source proxy's outbound error counters (since it started); returns them as (name, labels)."""
        found = []
        for name in ("outbound_http_errors_total", "outbound_tcp_errors_total"):
            for labels, value in await self._samples(source, name):
                if value > 0:
                    self._sample_note(str(facts.ref(source)), name, labels, value, "since the proxy started")
                    found.append((name, labels))
        return found

    async def _log_lines(self, pod: Mapping[str, Any], limit: int = 3) -> list[str]:
        meta = pod["metadata"]
        try:
            text = await self.client.get_text(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log",
                                              {"container": PROXY_CONTAINER, "tailLines": str(LOG_LINES)})
        except KubeError:
            return []
        return [line for line in text.splitlines() if _CERT_LOG.search(line)][-limit:]

    # -- layers ------------------------------------------------------------------------------------

    async def _injection(self, pod: Mapping[str, Any], side: str) -> None:
        ref = str(facts.ref(pod))
        ns_annotations = await self._namespace_annotations(pod["metadata"]["namespace"])
        self._inject_notes(pod, ref, ns_annotations, "api")
        if not facts.meshed(pod):
            raise self._unmeshed(pod, ref, side, ns_annotations)
        self._note(f"api: pod {ref}", "has the linkerd-proxy container")

    def _redirection(self, pod: Mapping[str, Any], side: str, port: int | None, inbound: bool) -> None:
        ref = facts.ref(pod)
        names = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or ()]
        restart = f"`kubectl -n {ref.namespace} delete pod {ref.name}`"
        if INIT_CONTAINER in names:
            done, text = _init_verdict(pod, INIT_CONTAINER)
            self._note(f"api: pod {ref}", f"init container {INIT_CONTAINER} (proxy-init): {text}")
            if not done:
                raise Failure(f"the {side} pod {ref}'s {INIT_CONTAINER} did not install the redirection rules ({text})",
                              f"`kubectl -n {ref.namespace} logs {ref.name} -c {INIT_CONTAINER}`")
        elif VALIDATOR_CONTAINER in names:
            done, text = _init_verdict(pod, VALIDATOR_CONTAINER)
            self._note(f"api: pod {ref}", f"init container {VALIDATOR_CONTAINER} (CNI mode): {text}")
            if not done:
                raise Failure(f"the CNI plugin did not set up the {side} pod {ref}'s redirection: the network "
                              f"validator failed ({text})",
                              "is linkerd-cni running on the pod's node? (`kubectl -n linkerd-cni get pods -o wide`; "
                              f"`kubectl -n {ref.namespace} logs {ref.name} -c {VALIDATOR_CONTAINER}`)")
        else:
            raise Failure(f"the {side} pod {ref} has neither {INIT_CONTAINER} nor {VALIDATOR_CONTAINER}: nothing set "
                          "up its traffic's redirection to the proxy",
                          f"re-inject the workload (`kubectl get deploy -n {ref.namespace} -o yaml | tether inject - "
                          "| kubectl apply -f -`)")
        self._skip_ports(pod, str(ref), side, port, inbound, "api", f"then {restart}")

    async def _trust_anchors(self) -> str:
        if self._anchors is None:
            try:
                self._anchors = await kube_reach.trust_anchors(self.client, self.cp)
            except kube_reach.NotReachable as exc:
                raise Failure(f"the mesh's trust anchors cannot be read: {exc}", "run `tether check`") from None
            except KubeError as exc:
                raise DiagnoseError(str(exc)) from None
        return self._anchors

    async def _issuer(self) -> Any:
        """The issuer certificate of the ``linkerd-identity-issuer`` Secret, or None when there is none."""
        secret = await self._get(f"/api/v1/namespaces/{self.cp}/secrets/{ISSUER_SECRET}")
        data = (secret or {}).get("data") or {}
        text = next((data[k] for k in ("crt.pem", "tls.crt") if k in data), None)
        if text is None:
            return None
        try:
            return pem.parse_certificates(base64.b64decode(text), f"Secret {self.cp}/{ISSUER_SECRET}")[0]
        except (pem.PemError, ValueError) as exc:
            raise Failure(f"the issuer certificate cannot be read: {exc}", "run `tether check`") from None

    async def _identity_component(self) -> bool:
        try:
            pod = await kube_reach.ready_pod(self.client, self.cp, "identity")
        except kube_reach.NotReachable as exc:
            self._note("component identity", str(exc))
            return False
        except KubeError as exc:
            raise DiagnoseError(str(exc)) from None
        self._note("component identity", f"pod {self.cp}/{pod} ready")
        return True

    async def _identity(self, pod: Mapping[str, Any], side: str) -> None:
        ref = facts.ref(pod)
        where = str(ref)
        component_ready = await self._identity_component()
        anchors_pem = await self._trust_anchors()
        issuer = await self._issuer()
        now = self.now()
        if issuer is None:
            self._note(f"api: secret {self.cp}/{ISSUER_SECRET}", "absent (an external issuer?): not judged")
        elif not issuer.not_valid_before_utc <= now < issuer.not_valid_after_utc:
            self._note(f"api: secret {self.cp}/{ISSUER_SECRET}",
                       f"valid {issuer.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                       f"{issuer.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
            raise Failure("the identity issuer certificate is outside its validity period: no proxy can be "
                          "certified", "rotate the issuer (`tether check` shows how)")
        current = trust_root_sha256(anchors_pem)
        annotations = pod["metadata"].get("annotations") or {}
        given = annotations.get(TRUST_ROOT_SHA256)
        if given is None:
            env = proxies.proxy_env(pod, "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS")
            given = trust_root_sha256(env) if env is not None else None
        restart = f"restart it (`kubectl -n {ref.namespace} delete pod {ref.name}`, or roll its workload out)"
        if given is not None and given != current:
            self._note(f"api: pod {ref}", f"trust root sha256 {given[:16]}..., current {current[:16]}...")
            raise self._trust_failure(side, where, True, None, await self._tls_refused(pod), restart)
        for labels, value in await self._samples(pod, "control_identity_cert_refreshes_total"):
            self._sample_note(where, "control_identity_cert_refreshes_total", labels, value)
        expiry = await self._samples(pod, "control_identity_cert_expiration_timestamp_seconds")
        if not expiry or expiry[0][1] <= now.timestamp():
            for line in await self._log_lines(pod):
                self._note(f"log {ref} linkerd-proxy", line)
            if expiry:
                self._sample_note(where, "control_identity_cert_expiration_timestamp_seconds", {}, expiry[0][1])
            component = "" if component_ready else " (no identity pod is ready)"
            raise Failure(f"the {side} pod {ref}'s proxy holds no valid certificate{component}",
                          f"`kubectl -n {self.cp} get pods`; `kubectl -n {self.cp} logs deploy/linkerd-identity`"
                          if not component_ready else
                          f"`kubectl -n {ref.namespace} logs {ref.name} -c {PROXY_CONTAINER}`")
        expires = datetime.fromtimestamp(expiry[0][1], UTC)
        self._note(f"proxy metrics {ref}", f"control_identity_cert_expiration_timestamp_seconds {expiry[0][1]:.0f} "
                   f"({expires:%Y-%m-%dT%H:%M:%SZ})")
        name = proxies.identity_of(pod)
        if not name:
            return
        try:
            leaf = await kube_reach.served_certificate(self.tunnel, pod, name)
        except proxies.ProxyUnreachable as exc:
            raise Failure(f"the {side} pod {ref}'s proxy does not complete a TLS handshake: {exc}",
                          f"`kubectl -n {ref.namespace} logs {ref.name} -c {PROXY_CONTAINER}`") from None
        self._note(f"tls {ref}:{kube_reach.proxy_port(pod, 'linkerd-proxy', proxies.INBOUND_PORT)} (port-forward)",
                   f"serves {pki.subject_cn(leaf)} issued by {leaf.issuer.rfc4514_string()}, valid until "
                   f"{leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
        problem = pki.link_problem(leaf, issuer) if issuer is not None else None
        if problem is not None:
            raise self._trust_failure(side, where, False, problem, await self._tls_refused(pod), restart)

    async def _tls_refused(self, pod: Mapping[str, Any]) -> float:
        """Note and count the TLS handshakes the pod's proxy refused (``inbound_tcp_errors_total``)."""
        refused = 0.0
        for labels, value in await self._samples(pod, "inbound_tcp_errors_total"):
            if "tls" in labels.get("error", "") and value > 0:
                self._sample_note(str(facts.ref(pod)), "inbound_tcp_errors_total", labels, value)
                refused += value
        return refused

    def _tls(self, anchors_pem: str, trust_domain: str) -> Any:
        from tether.serving.channel import ClientTls

        name = control_plane_identity("destination", self.cp, trust_domain).dns_name
        return ClientTls(roots=anchors_pem.encode(), server_name=name)

    async def _discovery(self, authority: Authority, source: Mapping[str, Any], trust_domain: str
                         ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        service = await self._get(f"/api/v1/namespaces/{authority.namespace}/services/{authority.service}")
        svc_port = self._judge_service(authority, service, "api", "kubectl get svc -A")
        assert service is not None
        tls = self._tls(await self._trust_anchors(), trust_domain)
        try:
            async with kube_reach.component(self.client, self.cp, "destination", _DESTINATION_PORT, self.tunnel,
                                            anchors=False) as reached:
                self._note("component destination", f"pod {self.cp}/{reached.pod} ready (port-forward)")
                endpoints, profile, error = await ask_destination(reached.forward.addr, tls, authority,
                                                                  source["metadata"]["namespace"])
                if error and reached.forward.failures:
                    error = f"{error} ({reached.forward.failures[0]})"
        except kube_reach.NotReachable as exc:
            raise Failure(f"the destination cannot be asked: {exc}",
                          f"`kubectl -n {self.cp} get pods`; `kubectl -n {self.cp} logs deploy/linkerd-destination`"
                          ) from None
        if error:
            raise Failure(f"the destination does not resolve {authority.fqdn}: {error}",
                          f"`kubectl -n {self.cp} logs deploy/linkerd-destination`")
        pods = await self._selected(service)
        try:
            self._judge_endpoints(authority, service, endpoints, profile, pods,
                                  sum(1 for p in pods if facts.ready(p)), "api",
                                  f"kubectl get pods -n {authority.namespace}")
        except Failure:
            await self._note_proxy_errors(source)  # what the workload's own calls met (fail-fast while none is ready)
            raise
        return service, svc_port, [p for p in pods if facts.ready(p)]

    async def _policy(self, target: Mapping[str, Any], port: int, source: Mapping[str, Any],
                      trust_domain: str) -> None:
        ref = facts.ref(target)
        client_id, client_ip = proxies.identity_of(source) or "", proxies.pod_ip(source) or "0.0.0.0"
        for name in ("inbound_http_authz_deny_total", "inbound_tcp_authz_deny_total"):
            for labels, value in await self._samples(target, name, target_port=str(port)):
                if value > 0 and labels.get("client_id", client_id) == client_id:
                    self._sample_note(str(ref), name, labels, value)
        from tether.policy.client import PolicyError

        tls = self._tls(await self._trust_anchors(), trust_domain)
        try:
            async with kube_reach.component(self.client, self.cp, "policy", _POLICY_PORT, self.tunnel,
                                            anchors=False) as reached:
                self._note("component policy", f"pod {self.cp}/{reached.pod} ready (port-forward)")
                try:
                    server = await ask_policy(reached.forward.addr, tls, ref.namespace, ref.name, port)
                except (PolicyError, TimeoutError) as exc:
                    broke = f" ({reached.forward.failures[0]})" if reached.forward.failures else ""
                    raise Failure(f"the policy controller has no answer for {ref}:{port}: {exc or 'timed out'}{broke}",
                                  f"`kubectl -n {self.cp} logs deploy/linkerd-policy`") from None
        except kube_reach.NotReachable as exc:
            raise Failure(f"the policy controller cannot be asked: {exc}", f"`kubectl -n {self.cp} get pods`") from None
        self._judge_server(server, str(ref), port, client_id, client_ip)

    async def _proxy_and_application(self, source: Mapping[str, Any], target: Mapping[str, Any],
                                     authority: Authority, target_port: int) -> None:
        """Judge the traffic the two proxies already carried between them (no call is made in a cluster)."""
        src, dst = str(facts.ref(source)), str(facts.ref(target))
        source_id = proxies.identity_of(source) or ""
        errors = await self._note_proxy_errors(source)
        host = authority.fqdn
        responses = [(labels, value) for labels, value in await self._samples(source, "response_total",
                                                                              direction="outbound")
                     if labels.get("authority") in (host, host.rsplit(":", 1)[0]) and value > 0]
        for labels, value in responses:
            self._sample_note(src, "response_total", labels, value)
        opens = [(labels, value) for labels, value in await self._samples(target, "tcp_open_total",
                                                                           direction="inbound", peer="src",
                                                                           target_port=str(target_port))
                 if value > 0]
        from_source = [(labels, v) for labels, v in opens if labels.get("client_id") == source_id]
        plain = [(labels, v) for labels, v in opens if labels.get("tls") != "true"]
        for labels, value in from_source + plain:
            self._sample_note(dst, "tcp_open_total", labels, value)
        succeeded = any(labels.get("classification") == "success" for labels, _ in responses)
        mtls = any(labels.get("tls") == "true" for labels, _ in from_source)
        if errors and not (responses or mtls):
            # The counters hold every error since the proxy started, to any service (they have no authority
            # label): they decide only when no call of the source reached the target or got an answer.
            name, labels = errors[0]
            error = labels.get("error", "")
            raise Failure(f"the source proxy failed calls: {name}{{error=\"{error}\"}}{proxy_error_meaning(error)}",
                          f"`kubectl -n {facts.ref(source).namespace} logs {facts.ref(source).name} -c "
                          f"{PROXY_CONTAINER}`; `tether diagnostics proxy-metrics po/{facts.ref(source).name} -n "
                          f"{facts.ref(source).namespace} --platform kubernetes`")
        if not mtls:
            if plain:
                raise Failure(f"connections reach {dst}:{target_port} without mTLS",
                              "is the client meshed and its traffic redirected? `tether check --proxy`")
            raise Failure(f"no connection from {source_id or src} is counted by {dst}'s proxy on port {target_port} "
                          "(tcp_open_total): on Kubernetes diagnose makes no call itself, it reads the traffic the "
                          "proxies carried",
                          f"make a call from {src} to {authority.fqdn} and diagnose again")
        self._pass()
        self._layer("application")
        failed = [(labels, v) for labels, v in responses
                  if labels.get("classification") == "failure" and labels.get("status_code", "").startswith("5")]
        if failed and not succeeded:
            labels, _ = failed[0]
            raise Failure(f"the app in {dst} answered {labels.get('status_code')} to every call the source made",
                          f"see the app's log: `kubectl -n {facts.ref(target).namespace} logs {facts.ref(target).name}`")

    # -- the walk ------------------------------------------------------------------------------------

    async def run(self, target: str, namespace: str, to: str | None) -> Diagnosis:
        self._start(target, to)
        cluster_domain, trust_domain = await self._settings()
        authority = parse_authority(to, cluster_domain) if to else None
        source = (await self._pods_of(target, namespace))[0]
        try:
            await self._walk(source, authority, trust_domain)
        except Failure as failure:
            return self._failed(failure)
        return self._ok(authority)

    async def _walk(self, source: dict[str, Any], authority: Authority | None, trust_domain: str) -> None:
        service = await self._get(f"/api/v1/namespaces/{authority.namespace}/services/{authority.service}"
                                  ) if authority else None
        targets = await self._selected(service) if service else []
        target = targets[0] if targets else None
        svc_port = None
        if service is not None and authority is not None:
            svc_port = next((p for p in (service.get("spec") or {}).get("ports") or ()
                             if p.get("port") == authority.port), None)

        self._layer("injection")
        await self._injection(source, "source")
        if target is not None:
            await self._injection(target, "target")
        self._pass()

        self._layer("redirection")
        self._redirection(source, "source", authority.port if authority else None, inbound=False)
        if target is not None:
            self._redirection(target, "target", facts.target_port(svc_port, target) if svc_port else None,
                              inbound=True)
        self._pass()
        if not facts.running(source):  # its init steps passed: something else than the mesh holds it
            raise DiagnoseError(f"pod {facts.ref(source)} is not running "
                                f"({(source.get('status') or {}).get('phase', 'no status')})")

        self._layer("identity")
        await self._identity(source, "source")
        if target is not None:
            await self._identity(target, "target")
        self._pass()

        if authority is None:
            self._layer("proxy")
            try:
                ready = await self._admin(source, "/ready")
            except proxies.ProxyUnreachable as exc:
                raise Failure(f"the proxy of {facts.ref(source)} does not answer: {exc}",
                              f"`kubectl logs ... -c {PROXY_CONTAINER}`") from None
            self._note(f"proxy admin {facts.ref(source)}", f"/ready {ready.status}")
            if ready.status != 200:
                raise Failure(f"the proxy of {facts.ref(source)} is not ready", f"`kubectl logs ... -c {PROXY_CONTAINER}`")
            self._pass()
            return

        self._layer("discovery")
        service, svc_port, ready_targets = await self._discovery(authority, source, trust_domain)
        target = ready_targets[0]
        self._pass()

        self._layer("policy")
        port = facts.target_port(svc_port, target) or authority.port
        await self._policy(target, port, source, trust_domain)
        self._pass()

        self._layer("proxy")
        await self._proxy_and_application(source, target, authority, port)
        self._pass()
