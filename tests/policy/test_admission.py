"""The validating admission webhook over real HTTPS: the same rules, and the same messages, as ``tether apply``."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from policy_helpers import NS, SERVER_NAME, Harness, Pki, mesh_tls, namespace, policy, server
from executables import TETHER

from tether.policy.admission import PolicyAdmission
from tether.policy.config import WebhookSettings

P = "policy.linkerd.io"


def review(obj: dict[str, Any], *, operation: str = "CREATE", uid: str = "u-1") -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": operation, "namespace": NS, "object": obj,
                        "kind": {"group": group, "version": version, "kind": obj["kind"]},
                        "resource": {"group": group, "version": version, "resource": obj["kind"].lower() + "s"}}}


def post(port: int, ca: Path, body: bytes) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # the certificate names the controller's identity, not 127.0.0.1
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("POST", "/", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


BAD = {
    "namespace-target": policy("elsewhere", ("", "Namespace", "other"), [(P, "MeshTLSAuthentication", "m")]),
    "identity": mesh_tls("bad", identities=["Not An Identity"]),
    "access-policy": server("web", access_policy="allow-everything"),
    "two-meshtls": policy("two", (P, "Server", "web"), [(P, "MeshTLSAuthentication", "a"),
                                                      (P, "MeshTLSAuthentication", "b")]),
}


async def test_the_webhook_admits_valid_objects_and_denies_bad_ones_naming_the_field(
    workdir: Path, pki: Pki
) -> None:
    webhook = WebhookSettings("127.0.0.1:0", pki.server_cert, pki.server_key)
    async with Harness(workdir, pki, namespace(), webhook=webhook) as h:
        port = h.service.webhook_port
        assert port is not None

        async def ask(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
            status, body = await asyncio.to_thread(post, port, pki.ca, json.dumps(review(obj, **kw)).encode())
            assert status == 200, body
            return json.loads(body)["response"]

        assert (await ask(server("web")))["allowed"] is True
        assert (await ask(mesh_tls("ok", identities=["*", SERVER_NAME, "spiffe://cluster.local/ns/a/sa/b"])))[
            "allowed"] is True
        for key, obj in BAD.items():
            response = await ask(obj)
            assert response["allowed"] is False, key
            assert response["status"]["code"] == 400
            assert "spec." in response["status"]["message"], response  # names the field
        bad_gateway = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                       "metadata": {"name": "r", "namespace": NS},
                       "spec": {"rules": [{"matches": [{"path": {"type": "Nope"}}]}]}}
        lenient = await ask(bad_gateway)
        assert lenient["allowed"] is True and "linkerd-policy:" in lenient["warnings"][0]
        assert (await ask(BAD["identity"], operation="DELETE"))["allowed"] is True
        status, body = await asyncio.to_thread(post, port, pki.ca, b"{not json")
        assert status == 400 and b"malformed admission request" in body
        assert h.service.admission.denied == len(BAD)


@pytest.mark.parametrize("key", sorted(BAD))
async def test_tether_apply_refuses_with_the_webhooks_message(workdir: Path, pki: Pki, key: str) -> None:
    webhook = WebhookSettings("127.0.0.1:0", pki.server_cert, pki.server_key)
    async with Harness(workdir, pki, namespace(), webhook=webhook) as h:
        port = h.service.webhook_port
        assert port is not None
        _, body = await asyncio.to_thread(post, port, pki.ca, json.dumps(review(BAD[key])).encode())
        message = json.loads(body)["response"]["status"]["message"]
    manifest = workdir / "bad.json"
    manifest.write_text(json.dumps(BAD[key]))
    applied = subprocess.run([TETHER, "apply", "-f", str(manifest)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "TETHER_HOME": str(workdir / "home")})
    assert applied.returncode != 0 and "Traceback" not in applied.stderr
    field_message = message.split(": ", 1)[-1] if "spec." not in message.split(": ", 1)[0] else message
    assert field_message.split("spec.", 1)[1] in applied.stderr, (message, applied.stderr)


def test_gateway_routes_that_break_linkerds_rules_are_denied_and_unreadable_ones_admitted() -> None:
    def verdict(obj: dict[str, Any]) -> dict[str, Any]:
        return json.loads(PolicyAdmission().review(json.dumps(review(obj)).encode()).body)["response"]

    egress_parent = {"group": "policy.linkerd.io", "kind": "EgressNetwork", "name": "all"}
    backend = {"name": "all", "group": "policy.linkerd.io", "kind": "EgressNetwork"}
    for kind in ("TLSRoute", "TCPRoute"):
        route = {"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": kind,
                 "metadata": {"name": "r", "namespace": NS},
                 "spec": {"parentRefs": [{**egress_parent, "port": 443}], "rules": [{"backendRefs": [backend]}]}}
        assert verdict(route) == {"uid": "u-1", "allowed": True}
        two_rules = {**route, "spec": {**route["spec"], "rules": [{}, {}]}}
        denied = verdict(two_rules)
        assert denied["allowed"] is False
        assert denied["status"]["message"] == f"{kind} r: spec.rules: {kind} supports a single rule only (Linkerd), got 2"
        no_port = {**route, "spec": {**route["spec"], "parentRefs": [egress_parent]}}
        assert "spec.parentRefs[0].port: required for an EgressNetwork parent" in verdict(no_port)["status"]["message"]
        unreadable = {**route, "spec": {**route["spec"], "rules": [{"backendRefs": [{"name": "svc"}]}]}}
        lenient = verdict(unreadable)  # another controller's route, maybe: admitted, with a warning
        assert lenient["allowed"] is True and "required for a Service backend" in lenient["warnings"][0]
