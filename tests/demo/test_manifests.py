"""The demo's manifests as rendered for the local platform, and the readers ``dev/demo.sh`` uses."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from demo.conftest import DEMO_DIR, load_demo
from tether.resources.loading import load_text
from tether.resources.model import parse
from tether.resources.selectors import LabelSelector


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    text = load_demo("render").render("/opt/py/bin/python3", "/srv/checkout/demo")
    return load_text(text, "<render>")


def test_render_fills_in_every_placeholder_and_every_object_validates(docs: list[dict]) -> None:
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("Namespace", "emojivoto"),
        ("ServiceAccount", "emoji"), ("Service", "emoji-svc"), ("Deployment", "emoji"),
        ("ServiceAccount", "voting"), ("Service", "voting-svc"), ("Deployment", "voting"),
        ("ServiceAccount", "web"), ("Service", "web-svc"), ("Deployment", "web"),
        ("ServiceAccount", "vote-bot"), ("Deployment", "vote-bot"),
        ("ServiceProfile", "web-svc.emojivoto.svc.cluster.local"),
        ("ServiceProfile", "emoji-svc.emojivoto.svc.cluster.local"),
        ("ServiceProfile", "voting-svc.emojivoto.svc.cluster.local"),
    ]
    for doc in docs:
        parse(doc)  # raises ValidationError naming the field
        assert "@PYTHON@" not in repr(doc) and "@DEMO_DIR@" not in repr(doc)


def test_the_namespace_is_meshed_and_each_deployment_runs_its_module(docs: list[dict]) -> None:
    namespace = docs[0]
    assert namespace["metadata"]["annotations"]["linkerd.io/inject"] == "enabled"
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for deploy in (d for d in docs if d["kind"] == "Deployment"):
        spec = deploy["spec"]
        template = spec["template"]
        assert LabelSelector.from_spec(spec["selector"], "spec.selector").matches(template["metadata"]["labels"])
        (container,) = template["spec"]["containers"]
        assert container["command"][0] == "/opt/py/bin/python3" and container["workingDir"] == "/srv/checkout/demo"
        module = container["command"][-1]
        assert module.startswith("emojivoto.") and importlib.util.find_spec(module) is not None
        assert template["spec"]["serviceAccountName"] == deploy["metadata"]["name"]
        if deploy["metadata"]["name"] != "vote-bot":
            svc = services[f"{deploy['metadata']['name']}-svc"]
            assert LabelSelector.for_service(svc["spec"]["selector"], "spec.selector").matches(
                template["metadata"]["labels"])
            (port,) = container["ports"]
            assert port["containerPort"] == svc["spec"]["ports"][0]["targetPort"]


def test_render_defaults_and_vote_rate() -> None:
    render = load_demo("render")
    text = render.render(sys.executable, str(DEMO_DIR), vote_rate=7.5)
    bot = next(d for d in load_text(text, "<render>") if d["metadata"]["name"] == "vote-bot" and d["kind"] ==
               "Deployment")
    env = {e["name"]: e["value"] for e in bot["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VOTE_RATE"] == "7.5" and env["WEB_HOST"] == "web-svc.emojivoto:80"


def _pod(app: str, ready: bool, ip: str = "10.0.0.4") -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": f"{app}-abc-x", "labels": {"linkerd.io/proxy-deployment": app}},
            "status": {"phase": "Running" if ready else "Pending", "conditions": conditions, "podIP": ip}}


def test_checks_summarise_pods_and_find_the_web_page() -> None:
    checks = load_demo("checks")
    doc = {"items": [_pod("web", True), _pod("emoji", False)]}
    assert checks.pods(doc) == "1 2 emoji Pending  web ✓"
    assert checks.pods({"items": []}) == "0 0 (no pods yet)"
    assert checks.web_url(doc) == "http://10.0.0.4:8080/"
    assert checks.web_url({"items": [_pod("web", False)]}) == ""


def _row(name: str, meshed: str = "1/1") -> dict:
    return {"name": name, "meshed": meshed, "stats": None}


def _edge(src: str, dst: str, secured: bool = True) -> dict:
    return {"src": src, "dst": dst, "secured": secured, "no_tls_reason": "" if secured else "Not Provided By Remote"}


def test_checks_traffic_wants_every_edge_meshed_and_mtls() -> None:
    checks = load_demo("checks")
    rows = [_row("web"), _row("emoji"), _row("voting"), _row("vote-bot")]
    edges = [_edge("vote-bot", "web"), _edge("web", "emoji"), _edge("web", "voting")]
    assert checks.traffic(rows, edges) == []
    bad_rows = [_row("web"), _row("emoji", meshed="0/1"), _row("voting")]
    bad_edges = [_edge("web", "emoji", secured=False), _edge("web", "voting")]
    problems = checks.traffic(bad_rows, bad_edges)
    assert "vote-bot: no such deployment" in problems
    assert "emoji: meshed 0/1" in problems
    assert any(p.startswith("web: no connection from vote-bot") for p in problems)
    assert "web -> emoji: not mTLS (Not Provided By Remote)" in problems
    assert not any(p.startswith("voting") or "-> voting" in p for p in problems)
