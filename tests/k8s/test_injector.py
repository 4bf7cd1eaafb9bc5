"""``tether injector serve --platform kubernetes`` against kmock (a mock of the API server, not a cluster).

The webhook runs as its own process, as ``tether install`` deploys it, and reads from the
emulated API server what Linkerd's injector reads from its informers: the Namespaces (their
``linkerd.io/inject`` and ``config.linkerd.io/*`` annotations, followed through a watch), the
owners of pods (ReplicaSet -> Deployment, Job -> CronJob), and it writes Events on the owner.
kmock runs on a thread of its own (``ThreadedApi``) so the test may block on HTTPS calls while
the webhook calls the API.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from injector.helpers import ANCHOR_FILE
from injector.test_webhook import TETHER, StderrLines, _make_pki, admin_get, patched, post, response_of, review

from .kube_helpers import ThreadedApi

NS = "emojivoto"
OWNER_LOOKUP_DEADLINE = 20.0
STARTUP_DEADLINE = 60.0  # a shared CI machine may take long to import and start a process


def namespace(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "annotations": annotations or {}}}


def owned_pod(name: str, owner_kind: str, owner_name: str, api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": api_version, "kind": owner_kind, "name": owner_name,
                                          "uid": f"uid-{owner_name}", "controller": True}]},
        "spec": {"containers": [{"name": "web", "image": "example/web", "ports": [{"containerPort": 8080}]}]},
    }


def owner(kind: str, api_version: str, name: str, parent_kind: str, parent_name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "ownerReferences": [{"apiVersion": "apps/v1" if parent_kind == "Deployment" else "batch/v1",
                                              "kind": parent_kind, "name": parent_name, "controller": True}]}}


@pytest.fixture
def kube(tmp_path: Path):  # noqa: ANN201
    with ThreadedApi(tmp_path) as api:
        yield api


def _events(api: ThreadedApi) -> list[dict[str, Any]]:
    async def posted() -> list[dict[str, Any]]:
        return [r.data for r in api.api["post"] if r.url.path.endswith("/events")]

    return api.call(posted)


def test_namespace_annotations_owners_and_events_from_the_api(kube: ThreadedApi, tmp_path: Path) -> None:
    api = kube.api
    api.namespaces.append(namespace())
    api.namespace_gate.clear()  # the Namespace listing is held: the webhook must not answer yet

    async def seed() -> None:
        # A ReplicaSet whose name does not follow the Deployment's naming: only the API knows its owner.
        await api.post(f"/apis/apps/v1/namespaces/{NS}/replicasets",
                       json=owner("ReplicaSet", "apps/v1", "web-legacy", "Deployment", "web"))
        await api.post(f"/apis/batch/v1/namespaces/{NS}/jobs", json=owner("Job", "batch/v1", "nightly-29", "CronJob",
                                                                            "nightly"))

    kube.call(seed)
    pki = _make_pki(tmp_path / "tls", "kube")
    proc = subprocess.Popen(
        [TETHER, "injector", "serve", "--platform", "kubernetes", "--kubeconfig", str(kube.settings.kubeconfig),
         "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--tls-cert", str(pki.cert), "--tls-key",
         str(pki.key), "--identity-trust-anchors-file", str(ANCHOR_FILE)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    stderr = StderrLines(proc)
    try:
        admin_port = stderr.port("admin", timeout=STARTUP_DEADLINE)
        assert admin_get(admin_port, "/ready")[0] == 503  # listing held: not ready, the webhook port is closed
        kube.call(_release(api))
        port = stderr.port("webhook", timeout=STARTUP_DEADLINE)
        assert admin_get(admin_port, "/ready")[0] == 200

        web = owned_pod("web-legacy-x1", "ReplicaSet", "web-legacy", "apps/v1")
        answer = response_of(*post(port, review(web, namespace=NS), pki.ca))
        assert "patch" not in answer  # no linkerd.io/inject anywhere: not injected
        skipped = _wait_for_event(kube, "InjectionSkipped", "web-legacy")
        assert skipped["reason"] == "InjectionSkipped"
        assert skipped["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-legacy",
                                             "namespace": NS, "uid": "uid-web-legacy"}
        assert skipped["message"].startswith("Linkerd sidecar proxy injection skipped: neither the namespace")

        # kubectl annotate ns emojivoto linkerd.io/inject=enabled config.linkerd.io/proxy-log-level=debug
        kube.call(_put(api, namespace({"linkerd.io/inject": "enabled", "config.linkerd.io/proxy-log-level": "debug",
                                       "config.alpha.linkerd.io/proxy-wait-before-exit-seconds": "7"})))
        out = _injected_when_the_watch_delivers(port, pki.ca, web)
        assert out["metadata"]["labels"]["linkerd.io/proxy-deployment"] == "web"
        annotations = out["metadata"]["annotations"]
        assert annotations["config.linkerd.io/proxy-log-level"] == "debug"
        assert annotations["config.alpha.linkerd.io/proxy-wait-before-exit-seconds"] == "7"
        proxy = next(c for c in out["spec"]["initContainers"] if c["name"] == "linkerd-proxy")
        log_level = next(e["value"] for e in proxy["env"] if e["name"] == "LINKERD2_PROXY_LOG")
        assert log_level.startswith("debug,")
        injected = _wait_for_event(kube, "Injected", "web-legacy")
        assert injected["message"] == "Linkerd sidecar proxy injected"
        assert injected["type"] == "Normal"

        job_pod = owned_pod("nightly-29-abcde", "Job", "nightly-29", "batch/v1")
        out = patched(job_pod, response_of(*post(port, review(job_pod, namespace=NS), pki.ca)))
        assert out["metadata"]["labels"]["linkerd.io/proxy-cronjob"] == "nightly"
        assert _wait_for_event(kube, "Injected", "nightly-29")["involvedObject"]["kind"] == "Job"

        # An owner the API does not have: labelled by the pod's own reference, and no Event to record.
        orphan = owned_pod("gone-1", "ReplicaSet", "gone", "apps/v1")
        out = patched(orphan, response_of(*post(port, review(orphan, namespace=NS), pki.ca)))
        assert out["metadata"]["labels"]["linkerd.io/proxy-replicaset"] == "gone"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    log = stderr.rest()
    assert proc.returncode == 0, log
    assert "Traceback" not in log
    assert not [e for e in _events(kube) if e["involvedObject"]["name"] == "gone"]


def _release(api: Any):  # noqa: ANN202
    async def release() -> None:
        api.namespace_gate.set()

    return release


def _put(api: Any, ns: dict[str, Any]):  # noqa: ANN202
    async def put() -> None:
        api.put_namespace(ns)

    return put


def _injected_when_the_watch_delivers(port: int, ca: Path, pod: dict[str, Any]) -> dict[str, Any]:
    """Review ``pod`` until the webhook has the namespace change (the watch delivers it asynchronously)."""
    deadline = time.monotonic() + OWNER_LOOKUP_DEADLINE
    while True:
        answer = response_of(*post(port, review(pod, namespace=NS), ca))
        if "patch" in answer:
            return patched(pod, answer)
        if time.monotonic() > deadline:
            raise AssertionError(f"the namespace annotation never reached the webhook: {json.dumps(answer)}")
        time.sleep(0.05)


def _wait_for_event(kube: ThreadedApi, reason: str, involved: str) -> dict[str, Any]:
    """The first Event ``reason`` about ``involved`` (Events are written after the answer, on the loop)."""
    deadline = time.monotonic() + OWNER_LOOKUP_DEADLINE
    while True:
        events = _events(kube)
        found = [e for e in events if e["reason"] == reason and e["involvedObject"]["name"] == involved]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {reason} Event on {involved}: {events}")
        time.sleep(0.05)
