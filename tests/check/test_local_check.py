"""``tether check`` against a running local platform: healthy, a component down, the issuer near or past
expiry, a pod whose proxy holds another trust root, ``--pre``, ``--wait`` and ``-o json``.

One platform for the module; the tests run in file order and the last ones change the PKI.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from datetime import UTC, datetime, timedelta

from tether.identity import pem, pki
from tether.platform.local import config as platform_config
from tether.platform.local.launcher import Launcher
from up import uplab
from up.uplab import client, web_server

NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: chk, annotations: {linkerd.io/inject: enabled}}
"""


def _check(p: uplab.Platform, *args: str, ok: bool | None = None) -> tuple[int, str, dict | None]:
    proc = p.tether("check", "--wait", "0", *args, ok=ok)
    doc = json.loads(proc.stdout) if "json" in args else None
    return proc.returncode, proc.stdout, doc


def _results(doc: dict) -> dict[str, dict]:
    return {c["description"]: c | {"category": cat["categoryName"]} for cat in doc["categories"] for c in cat["checks"]}


def test_a_healthy_platform_and_its_proxies_pass(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("web", "chk", 1))
    p.apply(client("client", "chk", "http://web.chk.svc.cluster.local/"))
    # --wait lets the proxies become ready while the check runs.
    proc = p.tether("check", "--proxy", "-n", "chk", "--wait", "60s")
    assert proc.stdout.rstrip().endswith("Status check results are \u221a"), proc.stdout
    for category in ("local-platform", "linkerd-existence", "linkerd-config", "linkerd-identity",
                     "control-plane-version", "linkerd-identity-data-plane", "linkerd-data-plane",
                     "linkerd-opaque-ports-definition"):
        assert f"\n{category}\n{'-' * len(category)}\n" in "\n" + proc.stdout
    assert "\u00d7" not in proc.stdout and "\u203c" not in proc.stdout
    code, _, doc = _check(p, "--proxy", "-n", "chk", "-o", "json", ok=True)
    assert doc["success"] is True
    assert {c["result"] for cat in doc["categories"] for c in cat["checks"]} == {"success"}


def test_pre_fails_while_a_platform_runs(running: uplab.Platform) -> None:
    code, out, _ = _check(running, "--pre", ok=False)
    assert "\u00d7 control plane is not already running" in out and "already running in" in out
    assert code == 1


def test_a_missing_namespace_and_deleted_redirect_rules_are_named(running: uplab.Platform) -> None:
    p = running
    code, out, _ = _check(p, "--proxy", "-n", "nowhere", ok=False)
    assert "\u00d7 data plane namespace exists" in out and 'The "nowhere" namespace does not exist' in out
    (web,) = [x for x in p.ready_pods("chk", 2) if x["metadata"]["name"].startswith("web-")]
    netns = p.netns_of(web)
    nat = subprocess.run(["ip", "netns", "exec", netns, "iptables", "-t", "nat", "-S"], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    rule = shlex.split(next(r for r in nat if r.startswith("-A PREROUTING") and "PROXY_INIT_REDIRECT" in r))
    iptables = ["ip", "netns", "exec", netns, "iptables", "-t", "nat"]
    subprocess.run([*iptables, "-D", *rule[1:]], check=True, capture_output=True)
    try:
        code, _, doc = _check(p, "--proxy", "-n", "chk", "-o", "json", ok=False)
        rules = _results(doc)["data plane redirect rules are present"]
        assert rules["result"] == "error" and web["metadata"]["name"] in rules["error"]
        assert "PREROUTING does not jump to PROXY_INIT_REDIRECT" in rules["error"]
    finally:
        subprocess.run([*iptables, *rule], check=True, capture_output=True)


def test_a_component_down_fails_existence_and_skips_the_rest(running: uplab.Platform) -> None:
    p = running
    config = platform_config.load(p.home)
    assert config is not None
    Launcher(config.layout.components, config.layout.logs).stop("destination")
    try:
        code, out, _ = _check(p, ok=False)
        assert code == 1
        assert "\u00d7 control plane components are running" in out and "* destination: stopped" in out
        assert "linkerd-identity" not in out  # a fatal category: nothing after it ran
        assert out.rstrip().endswith("Status check results are \u00d7")
        _, _, doc = _check(p, "-o", "json", ok=False)
        assert doc["success"] is False
        assert [c["categoryName"] for c in doc["categories"]] == ["local-platform", "linkerd-existence"]
        failed = doc["categories"][1]["checks"][0]
        assert failed["result"] == "error" and "tether up" in failed["hint"]
    finally:
        p.tether("up", *p.up_args)


def _replace_issuer(p: uplab.Platform, valid_for: timedelta, start: datetime) -> None:
    pki_dir = p.home / "pki"
    anchor = pem.read_certificates(pki_dir / "ca.crt")[0]
    key = pem.read_private_key(pki_dir / "ca.key")
    cert, issuer_key = pki.create_issuer(anchor, key, control_plane_ns="linkerd", trust_domain="cluster.local",
                                         valid_for=valid_for, now=start)
    pem.write_file(pki_dir / "issuer.crt", pem.certificate_pem(cert), private=False)
    pem.write_file(pki_dir / "issuer.key", pem.private_key_pem(issuer_key), private=True)


def test_an_issuer_expiring_soon_warns_and_an_expired_one_fails(running: uplab.Platform) -> None:
    p = running
    pki_dir = p.home / "pki"
    saved = {n: (pki_dir / n).read_bytes() for n in ("issuer.crt", "issuer.key")}
    now = datetime.now(UTC)
    try:
        _replace_issuer(p, timedelta(days=30), now - timedelta(minutes=1))
        code, out, _ = _check(p, ok=True)
        assert "\u203c issuer cert is valid for at least 60 days" in out
        assert out.rstrip().endswith("Status check results are \u221a")
        _replace_issuer(p, timedelta(days=1), now - timedelta(days=2))
        code, _, doc = _check(p, "-o", "json", ok=False)
        expired = _results(doc)["issuer cert is within its validity period"]
        assert expired["result"] == "error" and "Expired on" in expired["error"]
        assert expired["category"] == "linkerd-identity"
    finally:
        for name, data in saved.items():
            (pki_dir / name).write_bytes(data)


def test_a_proxy_holding_another_trust_root_fails_the_data_plane_identity_check(running: uplab.Platform) -> None:
    p = running
    pods = p.ready_pods("chk", 2)
    pki_dir = p.home / "pki"
    # A new trust anchor and issuer: the running pods still hold the old root.
    anchor, key = pki.create_trust_anchor(control_plane_ns="linkerd", trust_domain="cluster.local",
                                          valid_for=timedelta(days=365), now=datetime.now(UTC))
    pem.write_file(pki_dir / "ca.crt", pem.certificate_pem(anchor), private=False)
    pem.write_file(pki_dir / "ca.key", pem.private_key_pem(key), private=True)
    _replace_issuer(p, timedelta(days=365), datetime.now(UTC))
    code, out, doc = _check(p, "--proxy", "-n", "chk", "-o", "json", ok=False)
    match = _results(doc)["data plane proxies certificate match CA"]
    assert match["result"] == "error" and match["category"] == "linkerd-identity-data-plane"
    assert "must be restarted" in match["error"]
    for pod in pods:
        assert f"chk/{pod['metadata']['name']}" in match["error"]
