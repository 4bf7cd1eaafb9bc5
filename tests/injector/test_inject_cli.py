"""``tether inject`` and ``tether uninject`` as a user runs them: files, directories, stdin, a URL, YAML and JSON,
multi-document streams with other kinds kept as written and in order, the report on stderr, and errors
that name the file and document without a traceback."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from executables import TETHER

from tether.injector import MeshConfig, Origin, inject

from .helpers import ANCHOR_FILE, WORKLOADS_FILE, template_of

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def tether(tmp_path: Path) -> Run:
    def run(*args: str, input: str | None = None, ok: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "TETHER_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
        proc = subprocess.run([TETHER, *args], input=input, capture_output=True, text=True, env=env, timeout=60)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert (proc.returncode == 0) is ok, proc.stderr
        return proc

    return run


def docs(text: str) -> list[Any]:
    return [d for d in yaml.safe_load_all(text)]


def split_documents(text: str) -> list[str]:
    """Each document's text, with its leading ``---`` line dropped."""
    out, current = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("---"):
            out.append("".join(current))
            current = []
        else:
            current.append(line)
    out.append("".join(current))
    return [d for d in out if d.strip()]


def test_default_only_adds_the_inject_annotation(tether: Run) -> None:
    proc = tether("inject", str(WORKLOADS_FILE))
    before, after = docs(WORKLOADS_FILE.read_text()), docs(proc.stdout)
    assert len(before) == len(after)
    for original, out in zip(before, after):
        if original["kind"] in ("Namespace", "Service", "ConfigMap"):
            assert out == original
            continue
        template = template_of(out)
        assert template["metadata"].pop("annotations") == {"linkerd.io/inject": "enabled"}
        if not template["metadata"]:
            del template["metadata"]  # the Job and CronJob templates had none
        assert out == original
    assert 'deployment "web" injected' in proc.stderr
    assert 'configmap "settings" skipped: not a workload' in proc.stderr


def test_other_documents_are_kept_as_written_and_in_order(tether: Run) -> None:
    text = WORKLOADS_FILE.read_text()
    out = tether("inject", "--manual", "--identity-trust-anchors-file", str(ANCHOR_FILE), str(WORKLOADS_FILE)).stdout
    assert out.startswith("# One of every kind")  # the leading comment stays
    original, result = split_documents(text), split_documents(out)
    assert len(original) == len(result)
    kinds = [yaml.safe_load(d)["kind"] for d in original]
    assert [yaml.safe_load(d)["kind"] for d in result] == kinds
    for kind, before, after in zip(kinds, original, result):
        if kind in ("Namespace", "Service", "ConfigMap"):
            assert after == before  # byte for byte, comments included
        else:
            assert after != before
    assert "created: 2024-01-01   # a date that must stay as written" in out


def test_manual_output_is_the_pure_function(tether: Run, config: MeshConfig) -> None:
    out = docs(tether("inject", "--manual", "--identity-trust-anchors-file", str(ANCHOR_FILE), str(WORKLOADS_FILE)).stdout)
    for original, injected in zip(docs(WORKLOADS_FILE.read_text()), out):
        expected = inject(original, {}, config, origin=Origin.CLI).obj
        assert injected == expected


def test_report_on_stderr(tether: Run, tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  hostNetwork: true\n  containers: [{name: c, image: i}]\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n  annotations: {linkerd.io/inject: disabled}\n"
        "spec: {containers: [{name: c, image: i}]}\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: c}\n"
        "spec: {containers: [{name: c, image: i, ports: [{containerPort: 53, protocol: UDP}]}]}\n"
    )
    proc = tether("inject", "--manual", "--identity-trust-anchors-file", str(ANCHOR_FILE), "-v", str(manifest))
    lines = proc.stderr.splitlines()
    assert any(line.startswith('pod "a" skipped: hostNetwork is enabled') for line in lines)
    assert 'pod "b" skipped: the pod has the annotation "linkerd.io/inject: disabled"' in lines
    assert 'pod "c" injected' in lines
    assert any("warning: container c exposes UDP port 53" in line for line in lines)
    assert any("added linkerd-proxy as a native sidecar" in line for line in lines)
    # skipped documents are printed unchanged
    assert docs(proc.stdout)[:2] == docs(manifest.read_text())[:2]


def test_lists_are_injected_item_by_item(tether: Run, workloads: dict[str, dict[str, Any]]) -> None:
    items = [workloads["Deployment"], workloads["ConfigMap"], workloads["Pod"]]
    lst = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    out = docs(tether("inject", "-", input=yaml.safe_dump(lst)).stdout)[0]
    assert out["kind"] == "List"
    assert [i["kind"] for i in out["items"]] == ["Deployment", "ConfigMap", "Pod"]
    assert out["items"][1] == workloads["ConfigMap"]
    assert out["items"][2]["metadata"]["annotations"] == {"linkerd.io/inject": "enabled"}


def test_json_in_json_out(tether: Run, workloads: dict[str, dict[str, Any]]) -> None:
    text = json.dumps(workloads["Deployment"], indent=4) + "\n" + json.dumps(workloads["ConfigMap"]) + "\n"
    out = tether("inject", "-", input=text).stdout
    decoder = json.JSONDecoder()
    first, end = decoder.raw_decode(out)
    assert template_of(first)["metadata"]["annotations"] == {"linkerd.io/inject": "enabled"}
    assert out[end:].strip() == json.dumps(workloads["ConfigMap"])  # untouched, as written


def test_directory_input(tether: Run, tmp_path: Path, workloads: dict[str, dict[str, Any]]) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(workloads["Deployment"]))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text(json.dumps(workloads["Job"]))
    (tmp_path / "notes.txt").write_text("ignored")
    proc = tether("inject", str(tmp_path))
    assert proc.stderr.split() == ["deployment", '"web"', "injected", "job", '"migrate"', "injected"]
    out = docs(proc.stdout)
    assert [d["kind"] for d in out] == ["Deployment", "Job"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "web.yaml").write_text(WORKLOADS_FILE.read_text())

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kw)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_url_input(tether: Run, served: str) -> None:
    out = tether("inject", f"{served}/web.yaml").stdout
    assert [d["kind"] for d in docs(out)] == [d["kind"] for d in docs(WORKLOADS_FILE.read_text())]
    err = tether("inject", f"{served}/missing.yaml", ok=False).stderr
    assert err.startswith(f"error: {served}/missing.yaml: HTTP 404")


def test_overrides_become_annotations(tether: Run, workloads: dict[str, dict[str, Any]]) -> None:
    proc = tether(
        "inject", "-", "--ingress", "--proxy-log-level", "debug", "--skip-outbound-ports", "5432",
        "--no-native-sidecar", "-a", "config.linkerd.io/proxy-cpu-limit=1",
        input=yaml.safe_dump(workloads["Deployment"]),
    )  # fmt: skip
    annotations = template_of(docs(proc.stdout)[0])["metadata"]["annotations"]
    assert annotations == {
        "linkerd.io/inject": "ingress",
        "config.linkerd.io/proxy-log-level": "debug",
        "config.linkerd.io/skip-outbound-ports": "5432",
        "config.linkerd.io/proxy-enable-native-sidecar": "false",
        "config.linkerd.io/proxy-cpu-limit": "1",
    }


def test_manual_overrides_shape_the_proxy(tether: Run, workloads: dict[str, dict[str, Any]]) -> None:
    proc = tether(
        "inject", "-", "--manual", "--identity-trust-anchors-file", str(ANCHOR_FILE), "--ingress",
        "--no-native-sidecar", "--proxy-log-level", "debug", "-L", "tether", "--cni",
        input=yaml.safe_dump(workloads["Deployment"]),
    )  # fmt: skip
    spec = template_of(docs(proc.stdout)[0])["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["linkerd-network-validator"]
    proxy = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["LINKERD2_PROXY_INGRESS_MODE"] == "true"
    assert env["LINKERD2_PROXY_LOG"].startswith("debug,")
    assert env["_l5d_ns"] == "tether"


def test_manual_with_values_and_namespaces(tether: Run, tmp_path: Path, workloads: dict[str, dict[str, Any]]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "identityTrustAnchorsPEM": ANCHOR_FILE.read_text(),
        "clusterDomain": "k8s.example",
        "proxy": {"image": {"name": "registry.example/tether", "version": "1.2.3"}, "nativeSidecar": False},
        "proxyInit": {"ignoreOutboundPorts": "25"},
    }))  # fmt: skip
    namespaces = tmp_path / "ns.yaml"
    namespaces.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop", "annotations": {"config.linkerd.io/proxy-log-level": "trace"}},
    }))  # fmt: skip
    out = tether("inject", "-", "--manual", "--values", str(values), "--namespaces", str(namespaces),
                 input=yaml.safe_dump(workloads["Deployment"])).stdout  # fmt: skip
    template = template_of(docs(out)[0])
    proxy = template["spec"]["containers"][0]
    assert proxy["image"] == "registry.example/tether:1.2.3"
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["LINKERD2_PROXY_LOG"].startswith("trace,")
    assert env["LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES"] == "svc.k8s.example."
    init = template["spec"]["initContainers"][0]
    assert init["args"][init["args"].index("--outbound-ports-to-ignore") + 1] == "25"
    assert template["metadata"]["annotations"]["config.linkerd.io/proxy-log-level"] == "trace"


def test_uninject_reverses_manual_inject(tether: Run) -> None:
    injected = tether("inject", "--manual", "--identity-trust-anchors-file", str(ANCHOR_FILE), str(WORKLOADS_FILE))
    proc = tether("uninject", "-", input=injected.stdout)
    original = docs(WORKLOADS_FILE.read_text())
    back = docs(proc.stdout)
    # The StatefulSet exposes 3306 and the ReplicaSet 6379: injection annotated them opaque, which stays.
    for before, after in zip(original, back):
        if before["kind"] in ("StatefulSet", "ReplicaSet"):
            assert template_of(after)["metadata"].pop("annotations") == {"config.linkerd.io/opaque-ports": str(
                template_of(before)["spec"]["containers"][0]["ports"][0]["containerPort"])}
        assert after == before
    assert 'deployment "web" uninjected' in proc.stderr
    assert 'configmap "settings" skipped: not a workload' in proc.stderr


def test_uninject_of_plain_manifests_changes_nothing(tether: Run) -> None:
    proc = tether("uninject", str(WORKLOADS_FILE))
    assert proc.stdout == WORKLOADS_FILE.read_text()
    assert 'deployment "web" skipped: no proxy to remove' in proc.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [unclosed\n", "doc 1 line 2"),
        ("apiVersion: v1\nkind: Pod\n---\n- a list\n", "doc 2: expected a mapping"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, name: q}\n", "duplicate key 'name'"),
        ("apiVersion: v1\nkind: ConfigMap\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
         "spec: {template: {spec: {containers: oops}}}\n",
         "doc 2 Deployment web: spec.template.spec.containers: expected a list of mappings"),
    ],
)
def test_errors_name_the_file_and_document(tether: Run, tmp_path: Path, content: str, message: str) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(content)
    proc = tether("inject", str(manifest), ok=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {manifest}")
    assert message in proc.stderr
    assert proc.stdout == ""


def test_input_errors(tether: Run, tmp_path: Path) -> None:
    assert "no such file or directory" in tether("inject", str(tmp_path / "nope.yaml"), ok=False).stderr
    err = tether("inject", "--manual", str(WORKLOADS_FILE), ok=False).stderr
    assert err.startswith("error: --manual needs the trust anchors")
    err = tether("inject", "--manual", "--identity-trust-anchors-file", str(tmp_path / "x"), str(WORKLOADS_FILE),
                 ok=False).stderr  # fmt: skip
    assert err.startswith(f"error: {tmp_path / 'x'}: no such file")
    assert "need --manual" in tether("inject", "--cni", str(WORKLOADS_FILE), ok=False).stderr
    bad_values = tmp_path / "values.yaml"
    bad_values.write_text("proxy:\n  nativeSidecar: maybe\n")
    err = tether("inject", "--manual", "--values", str(bad_values), "--identity-trust-anchors-file", str(ANCHOR_FILE),
                 str(WORKLOADS_FILE), ok=False).stderr  # fmt: skip
    assert err.startswith(f"error: {bad_values}: proxy.nativeSidecar: expected a boolean")
    assert tether("inject", ok=False).returncode == 2  # usage


def test_help_lists_the_commands(tether: Run) -> None:
    out = tether("--help").stdout
    assert "inject" in out and "uninject" in out and "injector" in out
    assert "--manual" in tether("inject", "--help").stdout
    assert "serve" in tether("injector", "--help").stdout
