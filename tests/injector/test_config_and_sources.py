"""`MeshConfig.from_values` (Linkerd's Helm keys), `ConfigFiles` reloading, the namespace seam, and
`manifests.transform_text` on awkward YAML (comments, empty documents, ``---`` inside text)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.injector import MeshConfig, Origin, inject, mark_for_injection
from tether.injector.config_files import ConfigFiles
from tether.injector.manifests import dump_yaml, transform_text
from tether.injector.namespaces import NamespaceFile, StaticNamespaces
from tether.resources.errors import ValidationError

from .helpers import ANCHOR_FILE, deployment


def test_defaults_are_linkerds_chart_values(anchors_pem: str) -> None:
    c = MeshConfig.from_values({}, trust_anchors_pem=anchors_pem)
    assert c == MeshConfig(trust_anchors_pem=anchors_pem)
    assert (c.ports.admin, c.ports.control, c.ports.inbound, c.ports.outbound) == (4191, 4190, 4143, 4140)
    assert c.proxy_uid == 2102 and c.native_sidecar and c.await_ and not c.cni_enabled
    assert c.opaque_ports == "25,587,3306,4444,5432,6379,9300,11211"
    assert c.proxy_init.ignore_inbound_ports == c.proxy_init.ignore_outbound_ports == "4567,4568"
    assert c.effective_trust_domain == "cluster.local"


def test_values_are_read(anchors_pem: str) -> None:
    values = {
        "identityTrustAnchorsPEM": anchors_pem,
        "controllerNamespace": "mesh",
        "clusterDomain": "k8s.example",
        "identityTrustDomain": "td.example",
        "cniEnabled": True,
        "disableIPv6": False,
        "linkerdVersion": "2.20.0",
        "proxy": {
            "image": {"name": "r.example/p", "pullPolicy": "Always"},
            "ports": {"admin": 5191},
            "uid": 3000,
            "logLevel": "debug",
            "resources": {"cpu": {"request": "100m", "limit": 1}, "memory": {"limit": "250Mi"}},
            "opaquePorts": 3306,
            "nativeSidecar": False,
            "await": False,
            "additionalEnv": [{"name": "A", "value": "1"}],
            "runtime": {"workers": {"minimum": 2}},
        },
        "proxyInit": {"ignoreInboundPorts": "25", "iptablesMode": "legacy", "runAsRoot": True},
        "networkValidator": {"connectAddr": "10.0.0.1:20001", "timeout": "5s"},
    }
    c = MeshConfig.from_values(values)
    assert (c.control_plane_ns, c.cluster_domain, c.effective_trust_domain) == ("mesh", "k8s.example", "td.example")
    assert c.cni_enabled and not c.disable_ipv6
    assert (c.proxy_image, c.proxy_version, c.image_pull_policy) == ("r.example/p", "2.20.0", "Always")
    assert c.ports.admin == 5191 and c.ports.inbound == 4143
    assert c.proxy_uid == 3000 and c.log_level == "debug" and c.opaque_ports == "3306"
    assert (c.resources.cpu_request, c.resources.cpu_limit, c.resources.memory_limit) == ("100m", "1", "250Mi")
    assert not c.native_sidecar and not c.await_
    assert c.additional_env == ({"name": "A", "value": "1"},)
    assert c.workers_minimum == 2
    assert c.proxy_init.ignore_inbound_ports == "25" and c.proxy_init.iptables_mode == "legacy"
    assert c.proxy_init.run_as_root
    assert c.network_validator.connect_addr == "10.0.0.1:20001" and c.network_validator.timeout == "5s"


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"proxy": {"nativeSidecar": "yes"}}, "proxy.nativeSidecar"),
        ({"proxy": {"ports": {"admin": 0}}}, "proxy.ports.admin"),
        ({"proxy": {"defaultInboundPolicy": "allow"}}, "proxy.defaultInboundPolicy"),
        ({"proxyInit": {"iptablesMode": "ebpf"}}, "proxyInit.iptablesMode"),
        ({"proxy": "x"}, "proxy"),
        ({}, "identityTrustAnchorsPEM"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as err:
        MeshConfig.from_values(values, trust_anchors_pem=None if path == "identityTrustAnchorsPEM" else "pem")
    assert err.value.path == path


def test_bad_names_are_refused(anchors_pem: str) -> None:
    with pytest.raises(ValueError):
        MeshConfig(trust_anchors_pem=anchors_pem, control_plane_ns="Not_A_Label")
    with pytest.raises(ValueError):
        MeshConfig(trust_anchors_pem="  ")


def _touch_later(path: Path) -> None:
    later = time.time_ns() + 2 * 10**9
    os.utime(path, ns=(later, later))


def test_config_files_reload_when_changed(tmp_path: Path) -> None:
    values = tmp_path / "values"
    values.write_text("proxy:\n  logLevel: info\n")
    anchors = tmp_path / "ca-bundle.crt"
    anchors.write_text(ANCHOR_FILE.read_text())
    files = ConfigFiles(values=values, trust_anchors=anchors)
    first = files()
    assert first.log_level == "info" and files() is first
    values.write_text("proxy:\n  logLevel: debug\n")
    _touch_later(values)
    assert files().log_level == "debug"
    values.write_text("proxy: [")
    _touch_later(values)
    with pytest.raises(ValidationError, match="not YAML"):
        files()


def test_static_and_file_namespaces(tmp_path: Path) -> None:
    assert StaticNamespaces({"a": {"k": "v"}})("a") == {"k": "v"}
    assert StaticNamespaces()("a") == {}
    ns_dir = tmp_path / "ns"
    ns_dir.mkdir()
    (ns_dir / "shop.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  annotations: {linkerd.io/inject: enabled}\n"
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: shop}\n"
    )
    (ns_dir / "list.json").write_text(
        '{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace",'
        ' "metadata": {"name": "db", "annotations": {"config.linkerd.io/opaque-ports": "5432"}}}]}'
    )
    source = NamespaceFile(ns_dir)
    assert source("shop") == {"linkerd.io/inject": "enabled"}
    assert source("db") == {"config.linkerd.io/opaque-ports": "5432"}
    assert source("other") == {}
    (ns_dir / "shop.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n")
    _touch_later(ns_dir / "shop.yaml")
    assert source("shop") == {}
    (ns_dir / "bad.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: Bad_Name\n")
    with pytest.raises(ValidationError, match="bad.yaml"):
        source("shop")


# --- manifests ------------------------------------------------------------------------------------------


def test_awkward_yaml_is_kept(config: MeshConfig) -> None:
    web = dump_yaml(deployment())
    text = (
        "# leading comment\n"
        "---\n"
        "---\n"  # an empty document
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  script: |\n    echo ---not a separator\n"
        "--- # a comment on the separator\n"
        "# about web\n" + web + "...\n"
    )
    out = transform_text(text, "t.yaml", lambda o: inject(o, {}, config, origin=Origin.CLI))
    assert out.text.startswith("# leading comment\n---\n---\napiVersion: v1\nkind: ConfigMap")
    assert "    echo ---not a separator\n" in out.text
    assert "---\n# about web\napiVersion: apps/v1" in out.text
    assert [(r.doc_index, r.report.kind) for r in out.reports] == [(2, "ConfigMap"), (3, "Deployment")]
    loaded = [d for d in yaml.safe_load_all(out.text) if d]
    assert loaded[1]["spec"]["template"]["spec"]["initContainers"][1]["name"] == "linkerd-proxy"


def test_unchanged_text_is_returned_as_is() -> None:
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}   # flow style kept\n"
    assert transform_text(text, "t", mark_for_injection).text == text


def test_multiline_strings_are_literal_blocks(config: MeshConfig) -> None:
    text = dump_yaml(inject(deployment(), {}, config, origin=Origin.CLI).obj)
    assert "value: |\n" in text and "-----BEGIN CERTIFICATE-----\n" in text
