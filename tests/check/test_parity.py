"""Linkerd CLI parity found by trying Linkerd's docs as a new user: `identity create-* --out DIR` makes DIR."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tether.cli.main import cli


def test_create_commands_make_the_out_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    anchors = tmp_path / "new" / "anchors"
    done = runner.invoke(cli, ["identity", "create-trust-anchor", "--out", str(anchors)])
    assert done.exit_code == 0, done.output
    issuer = tmp_path / "other" / "issuer"
    done = runner.invoke(cli, ["identity", "create-issuer", "--anchor-cert", str(anchors / "ca.crt"),
                               "--anchor-key", str(anchors / "ca.key"), "--out", str(issuer)])
    assert done.exit_code == 0, done.output
    assert (issuer / "issuer.crt").exists() and (issuer / "issuer.key").stat().st_mode & 0o777 == 0o600


def test_an_out_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = CliRunner().invoke(cli, ["identity", "create-trust-anchor", "--out", str(tmp_path / "file" / "x")])
    assert done.exit_code == 1 and "Not a directory" in done.output and "Traceback" not in done.output


def test_version_flags_without_a_platform(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(cli, ["version"]).output == "Client version: 0.1.0\nServer version: unavailable\n"
    assert runner.invoke(cli, ["version", "--short", "--client"]).output == "0.1.0\n"
    assert runner.invoke(cli, ["version", "--proxy"]).output.endswith("Proxy versions:\n\tunavailable\n")


LIST_WITH_NULL = """
apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: default}
  spec:
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec: {containers: [{name: web, image: nginx}]}
-
"""


def _anchors(tmp_path: Path) -> Path:
    out = tmp_path / "pki"
    assert CliRunner().invoke(cli, ["identity", "create-trust-anchor", "--out", str(out)]).exit_code == 0
    return out / "ca.crt"


def _template_spec(text: str) -> dict:
    import yaml

    (deployment, *rest) = yaml.safe_load(text)["items"]
    assert rest == [None]  # the null item is printed back as it was
    return deployment["spec"]["template"]["spec"]


def test_inject_accepts_a_list_with_null_items_and_reinjects_injected_workloads(tmp_path: Path) -> None:
    manifest = tmp_path / "list.yaml"
    manifest.write_text(LIST_WITH_NULL)
    anchors = _anchors(tmp_path)
    runner = CliRunner()
    first = runner.invoke(cli, ["inject", "--manual", "--identity-trust-anchors-file", str(anchors), str(manifest)])
    assert first.exit_code == 0, first.output
    injected = first.stdout
    manifest.write_text(injected)
    again = runner.invoke(cli, ["inject", "--manual", "--identity-trust-anchors-file", str(anchors),
                                "--proxy-log-level", "debug", str(manifest)])
    assert again.exit_code == 0, again.output
    spec = _template_spec(again.stdout)
    names = [c["name"] for c in spec.get("initContainers", [])] + [c["name"] for c in spec["containers"]]
    assert names.count("linkerd-proxy") == 1 and names.count("linkerd-init") == 1
    proxy = next(c for c in spec["initContainers"] if c["name"] == "linkerd-proxy")
    log = next(e["value"] for e in proxy["env"] if e["name"] == "LINKERD2_PROXY_LOG")
    assert log.startswith("debug")  # the re-injection took the new setting
    assert "already" not in again.stderr


def test_gateway_httproute_v1alpha2_is_accepted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    route = tmp_path / "route.yaml"
    route.write_text("""
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: HTTPRoute
metadata: {name: egress, namespace: default}
spec:
  parentRefs: [{name: all-egress, kind: EgressNetwork, group: policy.linkerd.io, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /get}}]
    backendRefs: [{kind: EgressNetwork, group: policy.linkerd.io, name: all-egress, port: 80}]
""")
    done = CliRunner().invoke(cli, ["apply", "-f", str(route)])
    assert done.exit_code == 0 and "httproute.gateway.networking.k8s.io/egress created" in done.output, done.output
