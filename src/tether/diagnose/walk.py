"""What a diagnosis is, and the judgements both platforms make on what they read.

- the result model (``Diagnosis``, ``Evidence``), ``Failure`` (a layer failed)
  and ``DiagnoseError`` (the question cannot be asked), ``parse_authority``;
- ``Walk``: the evidence notebook and layer bookkeeping, and the judgements that
  do not depend on where the facts came from — why a pod is not meshed, a called
  port skipped by the proxy, the controllers' answers (``Get``/``GetProfile``,
  ``GetPort``) judged for the client, and what a proxy's own errors mean;
- ``ask_destination`` / ``ask_policy``: one question to each controller, as a
  proxy asks it, at an address (the local component's, or a port-forward's).

Subclasses: ``tether.diagnose.layers.LocalDiagnosis`` (the local platform) and
``tether.diagnose.kube_layers.KubeDiagnosis`` (an API server).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.diagnose.authz import allowing
from tether.injector import annotations as inject_keys
from tether.injector.decision import Origin, decide
from tether.injector.workloads import KINDS, pod_template
from tether.ports import parse_port_set

LAYERS = ("injection", "redirection", "identity", "discovery", "policy", "proxy", "application")
PROBE_TIMEOUT_S = 2.0
_AUTHORITY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.svc(\.[a-z0-9.-]+)?)?:(\d+)$")


class DiagnoseError(Exception):
    """The question cannot be asked (unknown workload, bad authority, no platform); not a diagnosis."""


@dataclass(frozen=True)
class Evidence:
    source: str
    detail: str


class Failure(Exception):
    """A layer failed: why, and what to do next."""

    def __init__(self, reason: str, next_step: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.next_step = next_step


@dataclass
class Diagnosis:
    target: str
    to: str | None
    ok: bool = False
    layer: str | None = None
    reason: str = ""
    next: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"target": self.target, "to": self.to, "ok": self.ok, "layer": self.layer, "reason": self.reason,
                "evidence": [{"source": e.source, "detail": e.detail} for e in self.evidence], "next": self.next}


@dataclass(frozen=True)
class Authority:
    service: str
    namespace: str
    port: int
    cluster_domain: str

    @property
    def fqdn(self) -> str:
        return f"{self.service}.{self.namespace}.svc.{self.cluster_domain}:{self.port}"


def parse_authority(text: str, cluster_domain: str) -> Authority:
    match = _AUTHORITY.match(text.strip().lower())
    if match is None:
        raise DiagnoseError(f"--to: {text!r} is not SVC.NS:PORT or SVC.NS.svc.{cluster_domain}:PORT")
    suffix = match.group(6)
    if suffix and suffix[1:] != cluster_domain:
        raise DiagnoseError(f"--to: {text!r} is not in the cluster domain {cluster_domain}")
    port = int(match.group(7))
    if not 0 < port < 65536:
        raise DiagnoseError(f"--to: port {port} is out of range")
    return Authority(match.group(1), match.group(3), port, cluster_domain)


# What Linkerd's synthesized errors (l5d-proxy-error) and the proxies' error labels
# (<direction>_http_errors_total{error}) say about where a call broke.
_PROXY_ERRORS = (
    ("discovery unavailable", "the client's proxy gets no answer from the destination, so it cannot resolve the "
                              "service and drops the call"),
    ("fail-fast", "the client's proxy found no ready endpoint for the service in time (fail-fast)"),
    ("failfast", "the client's proxy found no ready endpoint for the service in time (fail-fast)"),
    ("load", "the proxy shed load: more requests were in flight than it admits"),
    ("timed out", "a connection or response timed out between the proxies"),
    ("timeout", "a connection or response timed out between the proxies"),
    ("tls", "the TLS handshake between the proxies failed (identity or trust mismatch)"),
    ("certificate", "the TLS handshake between the proxies failed (identity or trust mismatch)"),
    ("identity", "the server proxy's identity is not the one discovery named"),
    ("i/o", "the client's proxy could not connect to, or lost, the endpoint"),
)


def proxy_error_meaning(error: str) -> str:
    """`` (what it means)`` for a proxy's error text or label, or ``""`` when it is not one we know."""
    lowered = error.lower()
    meaning = next((text for needle, text in _PROXY_ERRORS if needle in lowered), None)
    return f" ({meaning})" if meaning else ""


def service_port(service: Mapping[str, Any], port: int) -> dict[str, Any] | None:
    return next((p for p in (service.get("spec") or {}).get("ports") or () if p.get("port") == port), None)


class Walk:
    """The evidence notebook of one diagnosis and the judgements shared by both platforms."""

    result: Diagnosis
    _current: str

    def _start(self, target: str, to: str | None) -> None:
        self.result = Diagnosis(target=target, to=to)
        self._current = "injection"

    def _note(self, source: str, detail: str) -> None:
        self.result.evidence.append(Evidence(source, detail))

    def _sample_note(self, where: str, name: str, labels: Mapping[str, str], value: float, when: str = "") -> None:
        shown = ",".join(f'{k}="{v}"' for k, v in labels.items() if v)
        self._note(f"proxy metrics {where}", f"{name}{{{shown}}} {value:g}" + (f" ({when})" if when else ""))

    def _layer(self, name: str) -> None:
        self._current = name

    def _pass(self) -> None:
        self.result.passed.append(self._current)

    def _failed(self, failure: Failure) -> Diagnosis:
        self.result.layer = self._current
        self.result.reason = failure.reason
        self.result.next = failure.next_step
        return self.result

    def _ok(self, authority: Authority | None) -> Diagnosis:
        """The walk passed every layer it had to: the result, with what was established."""
        result = self.result
        result.ok, result.layer = True, None
        if authority is None:
            result.reason = (f"{result.target} is meshed, its traffic is redirected and its proxy holds a valid "
                             "certificate; name a service with --to to diagnose a call")
            result.next = f"tether diagnose {result.target} --to SVC.NS:PORT"
        else:
            result.reason = (f"{result.target} reaches {authority.fqdn}: both sides are meshed, the connection "
                             "between their proxies is mTLS and the call succeeds")
            result.next = "nothing to do"
        return result

    # -- injection ---------------------------------------------------------------------------------

    def _unmeshed(self, pod: Mapping[str, Any], ref: str, side: str, ns_annotations: Mapping[str, str]) -> Failure:
        """Why the injector left ``pod`` without a proxy, as a failure of the injection layer."""
        from tether.injector.config import DEFAULT_PROXY_IMAGE  # only for an unmeshed pod (a class-heavy module)

        decision = decide(pod_template(copy.deepcopy(dict(pod)), KINDS["Pod"]), ns_annotations, Origin.WEBHOOK,
                          proxy_image=DEFAULT_PROXY_IMAGE)
        why = decision.reasons[0].value if decision.reasons else "it was started before injection was enabled"
        return Failure(f"the {side} pod {ref} is not meshed: {why}",
                       f"annotate the namespace or the pod template with {inject_keys.INJECT}: enabled "
                       "and restart the workload (its Deployment makes new pods)")

    def _inject_notes(self, pod: Mapping[str, Any], ref: str, ns_annotations: Mapping[str, str], where: str) -> None:
        annotations = pod["metadata"].get("annotations") or {}
        self._note(f"{where}: pod {ref}", f"{inject_keys.INJECT}={annotations.get(inject_keys.INJECT, '(absent)')}")
        self._note(f"{where}: namespace {pod['metadata']['namespace']}",
                   f"{inject_keys.INJECT}={ns_annotations.get(inject_keys.INJECT, '(absent)')}")

    # -- redirection -------------------------------------------------------------------------------

    def _skip_ports(self, pod: Mapping[str, Any], ref: str, side: str, port: int | None, inbound: bool,
                    where: str, restart: str) -> None:
        """Fail when the called ``port`` is one the pod's proxy is told to leave alone."""
        if port is None:
            return
        key = inject_keys.CONFIG + ("skip-inbound-ports" if inbound else "skip-outbound-ports")
        text = (pod["metadata"].get("annotations") or {}).get(key, "")
        skipped, _ = parse_port_set(text)
        if port in skipped:
            self._note(f"{where}: pod {ref}", f"{key}={text}")
            raise Failure(
                f"port {port} is in the {side} pod's {key} ({text}): its traffic bypasses the proxy, so it is "
                "neither mTLS nor seen by the mesh",
                f"remove {port} from {key} unless skipping the proxy is what you meant ({restart})")

    # -- identity ----------------------------------------------------------------------------------

    @staticmethod
    def _trust_failure(side: str, ref: str, foreign_trust: bool, problem: str | None, refused: float,
                       restart: str) -> Failure:
        """A pod outside the mesh's trust: it trusts other anchors, or serves a certificate the current issuer
        did not sign (an old or foreign CA's), and so its TLS with meshed peers fails."""
        parts = []
        if foreign_trust:
            parts.append(f"the {side} pod {ref} trusts other trust anchors than the mesh's current ones")
        if problem is not None:
            owner = "its" if parts else f"the {side} pod {ref}'s"
            parts.append(f"{owner} proxy serves a certificate not issued by the current issuer ({problem})")
        reason = "; ".join(parts)
        if refused:
            reason += f": TLS handshakes between it and its peers fail ({refused:g} counted)"
        return Failure(reason, restart)

    # -- discovery ---------------------------------------------------------------------------------

    def _judge_service(self, authority: Authority, service: Mapping[str, Any] | None, where: str,
                       list_hint: str) -> dict[str, Any]:
        """The Service ``authority`` names exists and declares its port: that port; else a failure."""
        if service is None:
            raise Failure(f"service {authority.service} does not exist in namespace {authority.namespace}",
                          f"check the name in --to, or `{list_hint}`")
        svc_port = service_port(service, authority.port)
        declared = ", ".join(str(p.get("port")) for p in (service.get("spec") or {}).get("ports") or ())
        self._note(f"{where}: service {authority.namespace}/{authority.service}", f"ports {declared or '(none)'}")
        if svc_port is None:
            raise Failure(f"service {authority.namespace}/{authority.service} does not declare port {authority.port}",
                          "use one of the service's ports, or add the port to the Service")
        return svc_port

    def _judge_endpoints(self, authority: Authority, service: Mapping[str, Any], endpoints: dict | None,
                         profile: dict | None, pods: list[Mapping[str, Any]], ready: int, where: str,
                         list_hint: str) -> None:
        """The destination's answers for ``authority``: fail when it has no endpoint; note what it said."""
        assert endpoints is not None
        if "no_endpoints" in endpoints or not endpoints.get("add", {}).get("addrs"):
            self._note(f"destination Get {authority.fqdn}", "no endpoints")
            self._note(f"{where}: service {authority.namespace}/{authority.service}",
                       f"selector {json.dumps((service.get('spec') or {}).get('selector') or {})} matches "
                       f"{len(pods)} running pod(s), {ready} ready")
            raise Failure(f"{authority.fqdn} has no ready endpoints",
                          "check the Service's selector against the pods' labels, and the pods' readiness "
                          f"(`{list_hint}`)")
        for addr in endpoints["add"]["addrs"]:
            self._note(f"destination Get {authority.fqdn}",
                       f"{addr['addr']} pod={addr['metric_labels'].get('pod', '-')} identity="
                       f"{addr.get('tls_identity', '-')} hint={addr.get('protocol_hint', '-')}")
        if profile is not None:
            ref = profile.get("profile_ref") or {}
            found = f"{ref.get('namespace')}/{ref.get('name')}" if ref.get("name") else "none"
            self._note(f"destination GetProfile {authority.fqdn}",
                       f"opaque_protocol={profile['opaque_protocol']} service profile={found}")

    # -- policy ------------------------------------------------------------------------------------

    def _judge_server(self, server: Mapping[str, Any], ref: str, port: int, client_id: str, client_ip: str) -> None:
        """The policy controller's answer for the target's port, judged for the client's identity and address."""
        labels = server.get("labels") or {}
        self._note(f"policy GetPort {ref}:{port}",
                   f"server {labels.get('kind', '?')}/{labels.get('name', '?')}, protocol {server.get('protocol')}")
        for authz in server.get("authorizations", ()):
            self._note(f"policy GetPort {ref}:{port}", f"authorization {authz['ref']}: {authz['authentication']} "
                       f"{' '.join(authz.get('identities', []) + authz.get('suffixes', []))} from "
                       f"{', '.join(authz.get('networks', []))}".replace("  ", " "))
        allowed = allowing(server, client_id, client_ip)
        if not allowed:
            raise Failure(f"no authorization of {labels.get('kind', 'server')}/{labels.get('name', '?')} on "
                          f"{ref}:{port} admits {client_id or 'an unmeshed client'} from {client_ip}",
                          "add an AuthorizationPolicy (or ServerAuthorization) naming the client's identity "
                          "(a MeshTLSAuthentication) for that Server")
        self._note(f"policy GetPort {ref}:{port}", f"{client_id} is admitted by {', '.join(allowed)}")


async def ask_destination(addr: str, tls: Any, authority: Authority, namespace: str
                          ) -> tuple[dict | None, dict | None, str]:
    """The first ``Get`` and ``GetProfile`` answers for ``authority``, asked as a proxy of ``namespace``;
    the third item says why an answer is missing (``""`` when both came)."""
    from tether.destination.client import (
        DestinationError,
        open_channel,
        profile_dict,
        stream_endpoints,
        stream_profile,
        update_dict,
    )

    channel = open_channel(addr, tls)
    token = json.dumps({"ns": namespace})
    try:
        endpoints = profile = None
        try:
            async for update in stream_endpoints(channel, authority.fqdn, token, PROBE_TIMEOUT_S):
                endpoints = update_dict(update)
                break
            async for message in stream_profile(channel, authority.fqdn, token, PROBE_TIMEOUT_S):
                profile = profile_dict(message)
                break
        except DestinationError as exc:
            return endpoints, profile, f"{exc.code.name}: {exc.details}"
        except TimeoutError:
            return endpoints, profile, f"no answer within {PROBE_TIMEOUT_S:g}s"
        return endpoints, profile, ""
    finally:
        await channel.close()


async def ask_policy(addr: str, tls: Any, namespace: str, pod: str, port: int) -> dict[str, Any]:
    """The policy controller's ``GetPort`` answer for ``port`` of ``namespace/pod``, as its proxy asks."""
    from tether.policy.client import inbound_policy
    from tether.serving.channel import open_channel

    channel = open_channel(addr, tls)
    try:
        return await inbound_policy(channel, namespace, pod, port, PROBE_TIMEOUT_S)
    finally:
        await channel.close()
