"""The injector's patch for the local platform's pods: the mesh configuration and the pod controller's `Mesher`.

``tether platform run`` hands `LocalMesher` to the pod controller
(``tether.platform.local.meshing``), so local pods are meshed by the same `inject` (origin
WEBHOOK: Linkerd's truth table for ``linkerd.io/inject``, namespace inheritance, the native
sidecar, proxy-init) as pods admitted by the webhook on Kubernetes. What differs is only
where things are, given in `MeshConfig` by `mesh_config`:

- the control plane is addressed by the host bridge's gateway IP and each component's port
  (there is no cluster DNS), `Placement`;
- the proxy's identity directory and token are files the platform writes per pod under its
  run directory (``$(_pod_ns)``/``$(_pod_name)`` expand per pod), `Placement`;
- the containers run ``tether proxy`` and ``tether init`` as the platform's commands, proxy-init
  as root (the local sandbox grants no capabilities to other users) with the host's
  ``iptables`` (legacy or nft, whichever it is);
- the proxy's log level is the platform's, without Linkerd's span filters (Tether's proxy
  refuses them), and its readiness is probed every second.

Other mutating webhooks a cluster would run after the proxy injector (viz's tap injector) are
passed in as `LaterAdmission`s: each sees the meshed pod and answers JSON-patch operations,
applied in order, as the API server applies a webhook chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tether.injector.config import HOST_IPTABLES, Commands, MeshConfig, Placement, ProbeTiming, ProxyInit
from tether.injector.decision import Origin
from tether.injector.owners import event_for
from tether.injector.jsonpatch import JsonPatchError, apply
from tether.injector.patch import inject
from tether.platform.local.config import LocalPlatformConfig
from tether.platform.local.meshing import Meshed


def mesh_config(config: LocalPlatformConfig, trust_anchors_pem: str, version: str) -> MeshConfig:
    """The mesh as the local platform runs it."""
    host = str(config.host_ip)
    layout = config.layout
    return MeshConfig(
        trust_anchors_pem=trust_anchors_pem,
        control_plane_ns=config.control_plane_ns,
        trust_domain=config.trust_domain,
        cluster_domain=config.cluster_domain,
        cluster_networks=config.cluster_networks,
        version=version,
        proxy_version=version,
        log_level=config.proxy_log_level,
        # Readiness checked every second (the sandbox has no kubelet cadence to keep): pods serve sooner.
        readiness_probe=ProbeTiming(initial_delay_seconds=0, period_seconds=1, failure_threshold=3),
        proxy_init=ProxyInit(run_as_root=True, iptables_mode=HOST_IPTABLES),
        commands=Commands(proxy=tuple(config.proxy_command), init=tuple(config.init_command)),
        placement=Placement(
            identity_addr=f"{host}:{config.ports.identity}",
            destination_addr=f"{host}:{config.ports.destination}",
            policy_addr=f"{host}:{config.ports.policy}",
            identity_dir=str(layout.identity_dir("$(_pod_ns)", "$(_pod_name)")),
            token_file=str(layout.token_file("$(_pod_ns)", "$(_pod_name)")),
        ),
    )


# A later mutating webhook: (pod after the injector, its namespace's annotations) -> RFC 6902 operations.
LaterAdmission = Callable[[Mapping[str, Any], Mapping[str, str]], list[dict[str, Any]]]


class LocalMesher:
    """The pod controller's `Mesher`: `inject` with origin WEBHOOK under the local mesh configuration,
    then the ``later`` webhooks in order (each given the pod as the one before left it)."""

    def __init__(self, config: MeshConfig, later: Sequence[LaterAdmission] = ()) -> None:
        self._config = config
        self._later = tuple(later)

    def __call__(self, pod: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> Meshed:
        result = inject(pod, namespace_annotations, self._config, origin=Origin.WEBHOOK)
        report = result.report
        meshed = report.action == "injected"
        reason = "" if meshed else ", ".join(r.value for r in report.skip_reasons)
        obj, warnings = result.obj, report.warnings
        for admit in self._later:
            try:
                obj = apply(obj, admit(obj, namespace_annotations))
            except JsonPatchError as err:  # as failurePolicy Ignore: the pod runs without that webhook's change
                warnings = (*warnings, f"a later admission's patch did not apply: {err}")
        return Meshed(obj, meshed, reason, warnings, event_for(meshed, report.reasons))
