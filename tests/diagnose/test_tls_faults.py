"""A peer certified under another trust anchor, on a running local platform: diagnose names identity.

The fault is real: a second identity service (``tether identity serve``) with a CA of its own certifies
one pod's proxy, which also trusts that CA.  The pod is otherwise an ordinary meshed pod of the platform
(the injected spec of a running pod, with its proxy's identity service and trust anchors changed), so the
client's proxy opens mTLS to it and the handshake fails: the pod's proxy counts the refused handshakes,
the client's proxy its failed calls.  diagnose names the identity layer with that evidence.
"""

from __future__ import annotations

import copy
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from tether.diagnose import proxies
from tether.identity import pem, pki
from up import uplab
from up.uplab import TETHER, client, ready, wait_for, web_server

NS = "tf"


def _foreign_ca(directory: Path) -> str:
    """A trust anchor and issuer of their own (same names as the mesh's); returns the anchor's PEM."""
    now = datetime.now(UTC) - timedelta(minutes=1)
    anchor, anchor_key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                                 valid_for=timedelta(days=2), now=now)
    issuer, issuer_key = pki.create_issuer(anchor, anchor_key, control_plane_ns="linkerd",
                                           trust_domain="cluster.local", valid_for=timedelta(days=2), now=now)
    directory.mkdir()
    pem.write_file(directory / "ca.crt", pem.certificate_pem(anchor), private=False)
    pem.write_file(directory / "issuer.crt", pem.certificate_pem(issuer), private=False)
    pem.write_file(directory / "issuer.key", pem.private_key_pem(issuer_key), private=True)
    return pem.certificate_pem(anchor).decode()


def _foreign_pod(template: dict, identity_addr: str, anchors: str) -> dict:
    """``template``'s injected spec as a bare pod ``foreign-0`` whose proxy is certified at ``identity_addr``."""
    pod = copy.deepcopy(template)
    annotations = {k: v for k, v in (pod["metadata"].get("annotations") or {}).items()
                   if not k.startswith("local.tether.io/")}  # not a pod of the template's Deployment
    pod["metadata"] = {"name": "foreign-0", "namespace": NS, "labels": {"app": "foreign"}, "annotations": annotations}
    pod.pop("status", None)
    proxy = proxies.proxy_container(pod)
    assert proxy is not None
    for var in proxy["env"]:
        if var["name"] == "LINKERD2_PROXY_IDENTITY_SVC_ADDR":
            var["value"] = identity_addr
        elif var["name"] == "LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS":
            var["value"] = anchors + var["value"]  # its own CA first; the mesh's, to reach the control plane
    return pod


def _pod(p: uplab.Platform, prefix: str) -> dict:
    (pod,) = p.pods(NS, prefix)
    return pod


def _refused_handshakes(pod: dict) -> float:
    text = proxies.admin_get(pod["status"]["podIP"], "/metrics").body
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('inbound_tcp_errors_total{error="tls handshake"'))


def test_a_peer_certified_under_another_trust_anchor_fails_at_identity(running: uplab.Platform,
                                                                       tmp_path: Path) -> None:
    p = running
    p.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}, annotations: {{linkerd.io/inject: enabled}}}}\n")
    p.apply(web_server("peer", NS, 1))
    p.apply(client("client", NS, f"http://foreign.{NS}.svc.cluster.local/"))
    wait_for("peer and client ready", lambda: len(p.pods(NS)) == 2 and all(ready(x) for x in p.pods(NS)),
             timeout=120)
    template = _pod(p, "peer-")
    gateway = proxies.proxy_env(template, "LINKERD2_PROXY_IDENTITY_SVC_ADDR").rsplit(":", 1)[0]
    anchors = _foreign_ca(tmp_path / "foreign")
    ca = tmp_path / "foreign"
    identity = subprocess.Popen(
        [TETHER, "identity", "serve", "--trust-anchors", str(ca / "ca.crt"), "--issuer-cert", str(ca / "issuer.crt"),
         "--issuer-key", str(ca / "issuer.key"), "--addr", f"{gateway}:0", "--admin-addr", "127.0.0.1:0",
         "--state-dir", str(p.home)],
        stdout=subprocess.PIPE, stderr=(tmp_path / "foreign-identity.log").open("w"), text=True, env=p.env)
    try:
        line = identity.stdout.readline()  # the service says when it serves (or ends: then "")
        assert "serving Certify on port" in line, (tmp_path / "foreign-identity.log").read_text()
        port = line.split("Certify on port ")[1].split(",")[0]
        pod = _foreign_pod(template, f"{gateway}:{port}", anchors)
        p.apply(yaml.safe_dump(pod) + f"---\napiVersion: v1\nkind: Service\nmetadata: {{name: foreign, namespace: {NS}}}\n"
                "spec: {selector: {app: foreign}, ports: [{name: http, port: 80, targetPort: 8080}]}\n")
        wait_for("foreign-0 ready", lambda: ready(_pod(p, "foreign-0")) if len(p.pods(NS)) == 3 else False,
                 timeout=60)
        foreign = _pod(p, "foreign-0")
        # The client's app calls foreign five times a second: its proxy's handshakes are refused. The first
        # one waits on the platform (the Service in the client's hosts file, foreign-0's endpoint at the
        # client's proxy), which on a loaded machine took more than 30 s: the bound is for a failure only,
        # the wait ends at the first refused handshake.
        wait_for("refused TLS handshakes at foreign-0", lambda: _refused_handshakes(foreign) > 0, timeout=120)

        proc = p.tether("diagnose", "deploy/client", "-n", NS, "--to", f"foreign.{NS}:80", "-o", "json", ok=False)
        doc = json.loads(proc.stdout)
        evidence = "\n".join(f"{e['source']}: {e['detail']}" for e in doc["evidence"])
        assert doc["layer"] == "identity", doc
        assert doc["reason"].startswith(f"the target pod {NS}/foreign-0 trusts other trust anchors than the mesh's")
        assert "serves a certificate not issued by the current issuer" in doc["reason"]
        assert "TLS handshakes between it and its peers fail" in doc["reason"]
        assert f'proxy metrics {NS}/foreign-0: inbound_tcp_errors_total{{error="tls handshake"' in evidence
        assert 'outbound_http_errors_total{error="i/o"}' in evidence  # the client's proxy's failed calls
        assert "trust root sha256" in evidence
    finally:
        identity.terminate()
        identity.wait(timeout=30)
