"""Pod fields the local platform stores but cannot apply, named so that nothing is silently ignored.

Every local pod has a network namespace of its own and runs its containers' commands on the host's
filesystem (docs/local-platform.md), so a few fields a Kubernetes node would act on have no effect here:
sharing the host's network namespace, forwarding a host port, ``exec`` and ``grpc`` probes (they count as
passing), ``postStart`` hooks and ``preStop`` handlers other than the ones ``hooks`` runs. `tether apply`
prints each as a ``Warning:`` line (as kubectl prints the API server's warnings) and the pod controller
records them as one Warning Event ``FieldsNotApplied`` on the pod it starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tether.platform.local import hooks

REASON = "FieldsNotApplied"

_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for field in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field) or ()):
            if isinstance(container, Mapping):
                yield f"spec.{field}[{i}]", container


def unapplied_fields(spec: Mapping[str, Any]) -> list[str]:
    """Each field of the pod ``spec`` the local platform does not apply, as ``path: why``."""
    found = []
    if spec.get("hostNetwork") is True:
        found.append("spec.hostNetwork: every local pod has a network namespace of its own")
    for path, container in _containers(spec):
        for j, port in enumerate(container.get("ports") or ()):
            if isinstance(port, Mapping) and port.get("hostPort"):
                found.append(f"{path}.ports[{j}].hostPort: nothing is forwarded from the host to a local pod")
        for probe in _PROBES:
            handler = container.get(probe)
            if isinstance(handler, Mapping):
                for kind in ("exec", "grpc"):
                    if kind in handler:
                        found.append(f"{path}.{probe}.{kind}: {kind} probes are not run locally (they count as "
                                     "passing)")
        lifecycle = container.get("lifecycle")
        if isinstance(lifecycle, Mapping):
            if "postStart" in lifecycle:
                found.append(f"{path}.lifecycle.postStart: postStart hooks are not run locally")
            pre_stop = lifecycle.get("preStop")
            if isinstance(pre_stop, Mapping) and not any(kind in pre_stop for kind in hooks.PRE_STOP_RUN):
                kinds = ", ".join(sorted(pre_stop)) or "an empty handler"
                found.append(f"{path}.lifecycle.preStop: {kinds} is not run locally (only exec, sleep and httpGet)")
    return found


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec a Pod or Deployment carries (its template's), else None."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "Deployment":
        template = spec.get("template")
        if isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping):
            return template["spec"]
    return None
