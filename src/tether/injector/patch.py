"""The injection patch: one pure function from a pod or workload to the meshed object, and its reverse.

Callers: the webhook (`admission`, on Pods and Services, origin WEBHOOK) and ``tether inject``
(`manifests`, on every workload kind, origin CLI). Each function takes a decoded object and
returns a new one plus a `Report` of what was done or skipped and why; the input is never
changed. A malformed template raises `tether.resources.errors.ValidationError` at its path.

- `inject`: the full patch (Linkerd's ``pkg/inject`` + ``charts/patch``): proxy as a native
  sidecar by default or a classic one, ``linkerd-init`` or the CNI network validator, the
  proxy environment, identity volumes, labels and annotations.
- `mark_for_injection`: ``tether inject`` without ``--manual``: only ``linkerd.io/inject``
  (and any configuration annotations), leaving the real work to the webhook.
- `uninject`: removes what `inject` added (``linkerd uninject``).
- `opaque_ports_patch` (inside `inject` for the webhook): the annotation-only patch Services
  and pods that are not injected still get, so clients treat their opaque ports as such.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.injector import annotations as a
from tether.injector import sidecar
from tether.injector.config import DEFAULT_PROXY_IMAGE, MeshConfig
from tether.injector.decision import PROXY_CONTAINER, Decision, Origin, SkipReason, decide, unsupported
from tether.injector.workloads import KINDS, Owner, PodTemplate, owner_of, pod_template, workload_kind
from tether.ports import PortSet

__all__ = ["InjectResult", "Origin", "Report", "SkipReason", "inject", "mark_for_injection", "uninject"]

_CLOSE_WAIT = a.CONFIG + "close-wait-timeout"
_OWNER_LABELS = tuple(f"{a.PROXY_KIND_LABEL_PREFIX}{k.owner_label}" for k in KINDS.values() if k.owner_label)


@dataclass(frozen=True, slots=True)
class Report:
    """What happened to one object; ``summary`` is the line ``tether inject`` prints."""

    kind: str
    name: str
    namespace: str
    action: str  # injected | annotated | uninjected | skipped
    skip_reasons: tuple[SkipReason, ...] = ()
    reasons: tuple[str, ...] = ()  # why it was skipped, in words
    changes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    annotation_at: str = ""
    owner_kind: str = ""

    @property
    def skipped(self) -> bool:
        return self.action == "skipped"

    @property
    def summary(self) -> str:
        head = f'{self.kind.lower()} "{self.name}" {self.action}'
        return f"{head}: {'; '.join(self.reasons)}" if self.reasons else head


@dataclass(frozen=True, slots=True)
class InjectResult:
    obj: dict[str, Any]
    report: Report
    changed: bool = field(default=False)


def _identify(obj: Mapping[str, Any]) -> tuple[str, str, str | None]:
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = metadata.get("name") or (f"{metadata['generateName']}*" if metadata.get("generateName") else "<unnamed>")
    namespace = metadata.get("namespace")
    return kind, str(name), namespace if isinstance(namespace, str) and namespace else None


def inject(
    obj: Mapping[str, Any],
    namespace_annotations: Mapping[str, str],
    config: MeshConfig,
    *,
    origin: Origin = Origin.WEBHOOK,
    namespace: str | None = None,
    owner: Owner | None = None,
    overrides: Mapping[str, str] | None = None,
) -> InjectResult:
    """Mesh ``obj`` (a Pod or any workload with a pod template), or say why not.

    ``namespace`` is used when the object names none (an admission request carries it;
    the CLI defaults to ``default``). ``owner`` overrides the ``linkerd.io/proxy-<kind>``
    label (a webhook that can ask the API for a pod's owner passes it). ``overrides`` are
    annotations set on the pod template first, as ``tether inject``'s flags are.
    """
    out = copy.deepcopy(dict(obj))
    kind_name, name, obj_ns = _identify(out)
    ns = obj_ns or namespace or "default"
    kind = workload_kind(out)
    if kind is None:
        if origin is Origin.WEBHOOK and kind_name == "Service":
            return _service_opaque_ports(obj, namespace_annotations, config, name, ns)
        return _skipped(obj, kind_name, name, ns, unsupported())
    template = pod_template(out, kind)
    decision = decide(
        template,
        namespace_annotations,
        origin,
        proxy_image=config.proxy_image,
        token_projection=config.token_projection,
    )
    owner = owner or owner_of(out, kind)
    owner_kind = owner.label if owner else kind.kind.lower()
    if not decision.inject:
        if origin is Origin.WEBHOOK and SkipReason.SIDECAR_EXISTS not in decision.reasons:
            added = _annotate_default_opaque_ports(template, namespace_annotations, config)
            if added:
                report = _report(kind_name, name, ns, decision, owner_kind, action="skipped", changes=(added,))
                return InjectResult(out, report, changed=True)
        return _skipped(obj, kind_name, name, ns, decision, owner_kind)

    mode = decision.mode
    if overrides:
        template.metadata.setdefault("annotations", {}).update(overrides)
        if overrides.get(a.INJECT) in (a.INJECT_ENABLED, a.INJECT_INGRESS):
            mode = overrides[a.INJECT]
    own = dict(template.metadata.get("annotations") or {})
    inherited = a.inherited_annotations(own, namespace_annotations)
    reader = a.AnnotationReader({**own, **inherited})
    labels = template.metadata.get("labels") or {}
    settings = sidecar.resolve(
        config,
        reader,
        template.spec,
        pod_annotations=own,
        namespace_annotations=namespace_annotations,
        mode=mode,
        control_plane_pod=a.CONTROL_PLANE_COMPONENT_LABEL in labels,
    )
    changes = _apply(template, settings, config, origin, decision, inherited, ns, owner)
    warnings = list(reader.warnings)
    if _CLOSE_WAIT in own:
        warnings.append(f"ignoring {_CLOSE_WAIT}: tether init does not set the conntrack close-wait timeout")
    if origin is Origin.CLI:
        warnings += _udp_warnings(template.spec)
    report = _report(
        kind_name, name, ns, decision, owner_kind, action="injected", changes=tuple(changes), warnings=tuple(warnings)
    )
    return InjectResult(out, report, changed=True)


def _apply(
    template: PodTemplate,
    s: sidecar.Settings,
    config: MeshConfig,
    origin: Origin,
    decision: Decision,
    inherited: Mapping[str, str],
    ns: str,
    owner: Owner | None,
) -> list[str]:
    """Add everything to ``template`` in place; return what was done, in words."""
    meta, spec = template.metadata, template.spec
    changes: list[str] = []
    annotations = meta.setdefault("annotations", {})
    created_by = "tether/proxy-injector" if origin is Origin.WEBHOOK else "tether/cli"
    annotations[a.CREATED_BY] = f"{created_by} {config.version}"
    annotations[a.PROXY_VERSION] = s.version
    annotations[a.TRUST_ROOT_SHA256] = a.trust_root_sha256(config.trust_anchors_pem)
    for key, value in inherited.items():
        annotations[key] = value
    if inherited:
        changes.append(f"inherited from namespace {ns}: {', '.join(inherited)}")
    annotations.setdefault(a.INJECT, decision.mode)
    if a.OPAQUE_PORTS not in annotations:
        default = sidecar.default_opaque_ports(config, spec)
        if default:
            annotations[a.OPAQUE_PORTS] = default
            changes.append(f"annotated default opaque ports {default}")

    labels = meta.setdefault("labels", {})
    labels[a.CONTROL_PLANE_NS_LABEL] = config.control_plane_ns
    labels[a.WORKLOAD_NS_LABEL] = ns
    if owner is not None:
        labels[owner.label_key] = owner.name

    spec.setdefault("volumes", []).extend(sidecar.volumes(s))
    first = [sidecar.validator_container(s) if config.cni_enabled else sidecar.init_container(s)]
    changes.append(
        "added init container linkerd-network-validator (CNI)" if config.cni_enabled else
        f"added init container linkerd-init ({' '.join(config.commands.init)})"
    )  # fmt: skip
    proxy = sidecar.proxy_container(s)
    containers = spec.setdefault("containers", [])
    if s.native_sidecar:
        first.append(proxy)
        changes.append("added linkerd-proxy as a native sidecar (init container, restartPolicy: Always)")
    elif s.await_:
        if containers and a.DEFAULT_CONTAINER not in annotations and isinstance(containers[0].get("name"), str):
            annotations[a.DEFAULT_CONTAINER] = containers[0]["name"]
        containers.insert(0, proxy)
        changes.append("added linkerd-proxy first in containers, waiting for it to be ready")
    else:
        containers.append(proxy)
        changes.append("added linkerd-proxy to containers")
    spec["initContainers"] = first + list(spec.get("initContainers") or [])
    if s.debug:
        containers.append(sidecar.debug_container(s))
        changes.append("added linkerd-debug")
    return changes


def _udp_warnings(spec: Mapping[str, Any]) -> list[str]:
    out = []
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("protocol") == "UDP":
                out.append(
                    f"container {container.get('name')} exposes UDP port {port.get('containerPort')}: "
                    "the proxy handles TCP only; UDP is not meshed"
                )
    return out


def _report(
    kind: str,
    name: str,
    ns: str,
    decision: Decision,
    owner_kind: str = "",
    *,
    action: str,
    changes: tuple[str, ...] = (),
    warnings: tuple[str, ...] = (),
) -> Report:
    return Report(
        kind=kind,
        name=name,
        namespace=ns,
        action=action,
        skip_reasons=decision.reasons,
        reasons=tuple(r.description for r in decision.reasons),
        changes=changes,
        warnings=warnings,
        annotation_at=decision.annotation_at,
        owner_kind=owner_kind,
    )


def _skipped(
    original: Mapping[str, Any], kind: str, name: str, ns: str, decision: Decision, owner_kind: str = ""
) -> InjectResult:
    """The object unchanged (a fresh copy), with why."""
    return InjectResult(copy.deepcopy(dict(original)), _report(kind, name, ns, decision, owner_kind or kind.lower(), action="skipped"))


def _annotate_default_opaque_ports(
    template: PodTemplate, namespace_annotations: Mapping[str, str], config: MeshConfig
) -> str:
    """Add ``config.linkerd.io/opaque-ports`` to a pod that is not injected; return what was done."""
    annotations = template.metadata.get("annotations") or {}
    if a.OPAQUE_PORTS in annotations:
        return ""
    value = namespace_annotations.get(a.OPAQUE_PORTS) or sidecar.default_opaque_ports(config, template.spec)
    if not value:
        return ""
    template.metadata.setdefault("annotations", {})[a.OPAQUE_PORTS] = value
    return f"annotated opaque ports {value}"


def _service_opaque_ports(
    original: Mapping[str, Any],
    namespace_annotations: Mapping[str, str],
    config: MeshConfig,
    name: str,
    ns: str,
) -> InjectResult:
    """A Service's annotation-only patch: the namespace's opaque ports, else its default opaque ports."""
    out = copy.deepcopy(dict(original))
    metadata = out.get("metadata") if isinstance(out.get("metadata"), dict) else {}
    annotations = metadata.get("annotations") if isinstance(metadata.get("annotations"), dict) else {}
    value = ""
    if a.OPAQUE_PORTS not in annotations:
        value = namespace_annotations.get(a.OPAQUE_PORTS) or _service_default_opaque_ports(out, config)
    if not value:
        return _skipped(original, "Service", name, ns, unsupported(), "service")
    out["metadata"] = metadata
    metadata["annotations"] = {**annotations, a.OPAQUE_PORTS: value}
    decision = unsupported()
    report = _report("Service", name, ns, decision, "service", action="skipped", changes=(f"annotated opaque ports {value}",))
    return InjectResult(out, report, changed=True)


def _service_default_opaque_ports(service: Mapping[str, Any], config: MeshConfig) -> str:
    """Service ports whose port (without targetPort) or numeric targetPort is a default opaque port."""
    defaults = PortSet.parse(config.opaque_ports)
    spec = service.get("spec") if isinstance(service.get("spec"), Mapping) else {}
    ports = set()
    for port in spec.get("ports") or []:
        if not isinstance(port, Mapping) or not isinstance(port.get("port"), int):
            continue
        target = port.get("targetPort")
        if target is None:
            target = port["port"]
        if isinstance(target, int) and target in defaults:
            ports.add(port["port"])
    return ",".join(str(p) for p in sorted(ports))


def mark_for_injection(
    obj: Mapping[str, Any],
    *,
    proxy_image: str = DEFAULT_PROXY_IMAGE,
    overrides: Mapping[str, str] | None = None,
    ingress: bool = False,
) -> InjectResult:
    """``tether inject`` without ``--manual``: set ``linkerd.io/inject: enabled`` (or ``ingress``).

    The same decision as `inject` with origin CLI: hosts' networks, existing proxies and
    ``linkerd.io/inject: disabled`` are skipped. ``overrides`` are further annotations.
    """
    out = copy.deepcopy(dict(obj))
    kind_name, name, ns = _identify(out)
    ns = ns or "default"
    kind = workload_kind(out)
    if kind is None:
        return _skipped(obj, kind_name, name, ns, unsupported())
    template = pod_template(out, kind)
    decision = decide(template, {}, Origin.CLI, proxy_image=proxy_image)
    if not decision.inject:
        return _skipped(obj, kind_name, name, ns, decision)
    annotations = template.metadata.setdefault("annotations", {})
    before = dict(annotations)
    annotations[a.INJECT] = a.INJECT_INGRESS if ingress else a.INJECT_ENABLED
    annotations.update(overrides or {})
    changes = tuple(f"set {k}: {v}" for k, v in annotations.items() if before.get(k) != v)
    warnings = tuple(_udp_warnings(template.spec))
    report = _report(kind_name, name, ns, decision, action="injected", changes=changes, warnings=warnings)
    return InjectResult(out, report, changed=bool(changes))


def uninject(obj: Mapping[str, Any]) -> InjectResult:
    """Remove the proxy, its init containers, volumes, labels and ``linkerd.io/*`` annotations.

    ``linkerd.io/inject: disabled`` and the ``config.linkerd.io/*`` annotations stay, as
    ``linkerd uninject`` keeps them; lists and maps the patch created and left empty go.
    """
    out = copy.deepcopy(dict(obj))
    kind_name, name, ns = _identify(out)
    ns = ns or "default"
    kind = workload_kind(out)
    if kind is None:
        return _skipped(obj, kind_name, name, ns, unsupported())
    template = pod_template(out, kind)
    meta, spec = template.metadata, template.spec
    removed: list[str] = []

    containers = spec.get("containers") or []
    legacy_first = bool(containers) and containers[0].get("name") == PROXY_CONTAINER
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if items is None:
            continue
        kept = [c for c in items if c.get("name") not in sidecar.CONTAINERS]
        removed += [f"removed {key[:-1] if key == 'containers' else 'init container'} {c.get('name')}"
                    for c in items if c.get("name") in sidecar.CONTAINERS]  # fmt: skip
        spec[key] = kept
    if spec.get("volumes") is not None:
        kept_volumes = [v for v in spec["volumes"] if v.get("name") not in sidecar.VOLUMES]
        if len(kept_volumes) != len(spec["volumes"]):
            removed.append("removed identity and proxy-init volumes")
        spec["volumes"] = kept_volumes
    annotations = meta.get("annotations") or {}
    dropped = [
        k for k, v in annotations.items()
        if k.startswith(a.PREFIX + "/") and not (k == a.INJECT and v == a.INJECT_DISABLED)
    ]  # fmt: skip
    if legacy_first and spec.get("containers") and annotations.get(a.DEFAULT_CONTAINER) == spec["containers"][0].get("name"):
        dropped.append(a.DEFAULT_CONTAINER)
    for key in dropped:
        del annotations[key]
    if dropped:
        removed.append(f"removed annotations {', '.join(dropped)}")
    labels = meta.get("labels") or {}
    label_keys = [k for k in labels if k in (a.CONTROL_PLANE_NS_LABEL, a.WORKLOAD_NS_LABEL, *_OWNER_LABELS)]
    for key in label_keys:
        del labels[key]
    if label_keys:
        removed.append(f"removed labels {', '.join(label_keys)}")
    for container, key in ((spec, "initContainers"), (spec, "volumes"), (meta, "annotations"), (meta, "labels")):
        if key in container and not container[key]:
            del container[key]
    if template.path and not meta:
        del template.node["metadata"]
    if not removed:
        report = Report(kind_name, name, ns, "skipped", reasons=("no proxy to remove",))
        return InjectResult(copy.deepcopy(dict(obj)), report)
    return InjectResult(out, Report(kind_name, name, ns, "uninjected", changes=tuple(removed)), changed=True)
