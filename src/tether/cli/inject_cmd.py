"""``tether inject`` and ``tether uninject``: add the mesh to manifests, or take it away (``linkerd inject``).

A thin shell over ``tether.injector``: read each input (a file, a directory of manifests, an
http(s) URL or ``-`` for stdin), transform its workloads with `manifests.transform_text`,
print the result on stdout and, on stderr, one line per object saying what was injected or
skipped and why. Without ``--manual`` only ``linkerd.io/inject: enabled`` is added (the
webhook does the rest at admission); ``--manual`` renders the full proxy spec offline and
needs the trust anchors. Errors name the file and document; exit code 1. Registered by
``tether.cli.main``.
"""

from __future__ import annotations

import copy
import functools
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from tether.cli.errors import CliError
from tether.injector import annotations as a
from tether.injector.config import DEFAULT_PROXY_IMAGE, MeshConfig
from tether.injector.config_files import ConfigFiles
from tether.injector.decision import PROXY_CONTAINER, Origin
from tether.injector.manifests import Output, transform_text
from tether.injector.namespaces import NamespaceFile, StaticNamespaces
from tether.injector.patch import InjectResult, inject as inject_patch, mark_for_injection, uninject as uninject_patch
from tether.injector.workloads import pod_template, workload_kind
from tether.resources.errors import ValidationError
from tether.resources.loading import MANIFEST_SUFFIXES

_URL_TIMEOUT = 30.0


def _read_inputs(inputs: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(source name, text)`` for every manifest file named, found under a directory, or fetched."""
    out: list[tuple[str, str]] = []
    for item in inputs:
        if item == "-":
            out.append(("<stdin>", sys.stdin.read()))
        elif item.startswith(("http://", "https://")):
            out.append((item, _fetch(item)))
        else:
            out.extend(_read_path(Path(item)))
    return out


def _fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=_URL_TIMEOUT) as response:  # noqa: S310 - http(s) only
            return response.read().decode("utf-8-sig")
    except urllib.error.HTTPError as err:
        raise CliError(f"{url}: HTTP {err.code} {err.reason}") from None
    except urllib.error.URLError as err:
        raise CliError(f"{url}: {err.reason}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CliError(f"{url}: {err}") from None


def _read_path(path: Path) -> list[tuple[str, str]]:
    try:
        files = (
            sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            if path.is_dir()
            else [path]
        )
        return [(str(f), f.read_text(encoding="utf-8-sig")) for f in files]
    except FileNotFoundError:
        raise CliError(f"{path}: no such file or directory") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None
    except OSError as err:
        raise CliError(f"{path}: cannot read: {err.strerror or err}") from None


def _run(inputs: tuple[str, ...], transform: Any, verbose: bool) -> None:
    outputs: list[Output] = []
    try:
        for source, text in _read_inputs(inputs):
            outputs.append(transform_text(text, source, transform))
    except ValidationError as err:
        raise CliError(str(err)) from None
    texts = [o.text for o in outputs if o.text.strip()]
    joiner = "\n" if outputs and all(o.is_json for o in outputs) else "---\n"
    sys.stdout.write(joiner.join(texts))
    sys.stdout.flush()
    lines = [""]
    for output in outputs:
        for item in output.reports:
            report = item.report
            lines.append(report.summary)
            lines += [f"  warning: {w}" for w in report.warnings]
            if verbose:
                lines += [f"  {c}" for c in report.changes]
    lines.append("")
    click.echo("\n".join(lines), err=True)


def _carries_proxy(obj: dict[str, Any]) -> bool:
    kind = workload_kind(obj)
    if kind is None:
        return False
    spec = pod_template(copy.deepcopy(obj), kind).spec
    return any(c.get("name") == PROXY_CONTAINER for key in ("initContainers", "containers") for c in spec.get(key) or ())


def _reinjecting(transform: Any) -> Any:
    """As Linkerd: a workload that already carries a proxy is uninjected first, so re-running inject updates it."""

    def run(obj: dict[str, Any]) -> InjectResult:
        if not _carries_proxy(obj):
            return transform(obj)
        result = transform(uninject_patch(obj).obj)
        return InjectResult(result.obj, result.report, changed=result.obj != obj)

    return run


def _overrides(
    annotations: tuple[str, ...],
    proxy_image: str | None,
    proxy_version: str | None,
    proxy_log_level: str | None,
    skip_inbound_ports: str | None,
    skip_outbound_ports: str | None,
    opaque_ports: str | None,
    native_sidecar: bool | None,
    debug_sidecar: bool,
) -> dict[str, str]:
    out: dict[str, str] = {}
    c = a.CONFIG
    for key, value in (
        (c + "proxy-image", proxy_image),
        (c + "proxy-version", proxy_version),
        (c + "proxy-log-level", proxy_log_level),
        (c + "skip-inbound-ports", skip_inbound_ports),
        (c + "skip-outbound-ports", skip_outbound_ports),
        (c + "opaque-ports", opaque_ports),
        (a.NATIVE_SIDECAR, None if native_sidecar is None else str(native_sidecar).lower()),
        (c + "enable-debug-sidecar", "true" if debug_sidecar else None),
    ):
        if value is not None:
            out[key] = value
    for item in annotations:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--annotation {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


_INPUTS = click.argument("inputs", nargs=-1, required=True, metavar="FILE|DIR|URL|-...")


@click.command("inject")
@_INPUTS
@click.option("--manual", is_flag=True, help="Render the full proxy spec here instead of leaving it to the webhook.")
@click.option("--ingress", is_flag=True, help="Mark the workloads as ingresses (linkerd.io/inject: ingress).")
@click.option("--values", "values", type=click.Path(dir_okay=False, path_type=Path),
              help="Helm values of the control plane (Linkerd's keys), for --manual.")
@click.option("--identity-trust-anchors-file", type=click.Path(dir_okay=False, path_type=Path),
              help="PEM trust anchors, for --manual (overrides identityTrustAnchorsPEM in --values).")
@click.option("--control-plane-namespace", "-L", help="Control plane namespace, for --manual [default: linkerd].")
@click.option("--cni", "cni", is_flag=True, default=None, help="With --manual: the CNI plugin redirects; add the network validator.")
@click.option("--namespaces", "namespaces", type=click.Path(exists=True, path_type=Path),
              help="Namespace manifests whose config.linkerd.io/* annotations the workloads inherit (--manual).")
@click.option("--namespace", "-n", "default_namespace", default="default", show_default=True,
              help="Namespace of objects that name none.")
@click.option("--proxy-image", help="Proxy image name (config.linkerd.io/proxy-image).")
@click.option("--proxy-version", help="Proxy image tag (config.linkerd.io/proxy-version).")
@click.option("--proxy-log-level", help="Proxy log filter (config.linkerd.io/proxy-log-level).")
@click.option("--skip-inbound-ports", help="Inbound ports not redirected (config.linkerd.io/skip-inbound-ports).")
@click.option("--skip-outbound-ports", help="Outbound ports not redirected (config.linkerd.io/skip-outbound-ports).")
@click.option("--opaque-ports", help="Ports without protocol detection (config.linkerd.io/opaque-ports).")
@click.option("--native-sidecar/--no-native-sidecar", default=None,
              help="Proxy as a native sidecar (default) or a classic one (config.linkerd.io/proxy-enable-native-sidecar).")
@click.option("--enable-debug-sidecar", is_flag=True, help="Add the linkerd-debug container.")
@click.option("--annotation", "-a", "annotations", multiple=True, metavar="KEY=VALUE",
              help="Any other annotation to set on the pod templates (repeatable).")
@click.option("--verbose", "-v", is_flag=True, help="Also report each change made.")
def inject(
    inputs: tuple[str, ...],
    manual: bool,
    ingress: bool,
    values: Path | None,
    identity_trust_anchors_file: Path | None,
    control_plane_namespace: str | None,
    cni: bool | None,
    namespaces: Path | None,
    default_namespace: str,
    proxy_image: str | None,
    proxy_version: str | None,
    proxy_log_level: str | None,
    skip_inbound_ports: str | None,
    skip_outbound_ports: str | None,
    opaque_ports: str | None,
    native_sidecar: bool | None,
    enable_debug_sidecar: bool,
    annotations: tuple[str, ...],
    verbose: bool,
) -> None:
    """Add the Tether (Linkerd) proxy to the workloads in Kubernetes manifests.

    Deployments, StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers, Jobs,
    CronJobs, Pods and Lists of them are transformed; every other document is printed
    as it was, in order. The report goes to stderr.
    """
    overrides = _overrides(
        annotations, proxy_image, proxy_version, proxy_log_level, skip_inbound_ports,
        skip_outbound_ports, opaque_ports, native_sidecar, enable_debug_sidecar,
    )  # fmt: skip
    if not manual:
        if values or identity_trust_anchors_file or namespaces or cni:
            raise CliError("--values, --identity-trust-anchors-file, --namespaces and --cni need --manual")
        transform = functools.partial(
            mark_for_injection, proxy_image=proxy_image or DEFAULT_PROXY_IMAGE, overrides=overrides, ingress=ingress
        )
        _run(inputs, _reinjecting(transform), verbose)
        return
    config = _manual_config(values, identity_trust_anchors_file, control_plane_namespace, cni)
    try:
        ns_source = NamespaceFile(namespaces) if namespaces else StaticNamespaces()
    except ValidationError as err:
        raise CliError(str(err)) from None
    if ingress:
        overrides[a.INJECT] = a.INJECT_INGRESS

    def transform(obj: dict[str, Any]) -> InjectResult:
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        ns = metadata.get("namespace") or default_namespace
        return inject_patch(
            obj, ns_source(ns), config, origin=Origin.CLI, namespace=default_namespace, overrides=overrides
        )

    _run(inputs, _reinjecting(transform), verbose)


def _manual_config(
    values: Path | None, anchors: Path | None, control_plane_namespace: str | None, cni: bool | None
) -> MeshConfig:
    if values is None and anchors is None:
        raise CliError(
            "--manual needs the trust anchors: --identity-trust-anchors-file FILE, "
            "or --values FILE with identityTrustAnchorsPEM"
        )

    def adjust(config: MeshConfig) -> MeshConfig:
        changes: dict[str, Any] = {}
        if control_plane_namespace:
            changes["control_plane_ns"] = control_plane_namespace
        if cni is not None:
            changes["cni_enabled"] = cni
        return config.replace(**changes) if changes else config

    try:
        return ConfigFiles(values=values, trust_anchors=anchors, adjust=adjust)()
    except ValidationError as err:
        raise CliError(str(err)) from None
    except ValueError as err:
        raise CliError(str(err)) from None


@click.command("uninject")
@_INPUTS
@click.option("--verbose", "-v", is_flag=True, help="Also report each change made.")
def uninject(inputs: tuple[str, ...], verbose: bool) -> None:
    """Remove the proxy from the workloads in Kubernetes manifests (the reverse of ``inject --manual``)."""
    _run(inputs, uninject_patch, verbose)
