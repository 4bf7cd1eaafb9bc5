"""The proxy injector: the pod patch that meshes a workload, and the admission webhook that applies it.

Sits beside the controllers (identity, destination): it reads resource manifests as plain
objects and the mesh's naming rules, and imports nothing of the proxy or the other
controllers. The patch is one pure function, shared by the webhook (``tether injector
serve``) and the CLI (``tether inject``/``uninject``), so both produce the same pod.

Modules:

- `config`: `MeshConfig`, the typed mesh configuration (Linkerd's Helm values and defaults);
  `config_files`: the same from a values file and the trust anchors, re-read when they change.
- `annotations`: the ``linkerd.io``/``config.linkerd.io`` keys, namespace inheritance, value parsing.
- `workloads`: which kinds carry a pod template and where; the owner a pod is labelled with.
- `decision`: whether an object is injected, and the skip reasons (Linkerd's report).
- `sidecar`: the containers, environment and volumes the patch adds.
- `patch`: `inject`, `mark_for_injection`, `uninject`, `opaque_ports_patch` and their `Report`.
- `jsonpatch`: RFC 6902 patches between two objects, and applying one.
- `manifests`: multi-document YAML/JSON text in, transformed text out (for the CLI).
- `namespaces`: the `NamespaceAnnotations` seam and its static and file-backed forms.
- `admission`: AdmissionReview in, AdmissionReview out, sans-IO (for the server).
- `metrics`, `http`, `server`: the webhook process (HTTPS, admin port with /metrics, /ready, /live).
"""

from typing import TYPE_CHECKING

from tether.lazy import lazy_exports

if TYPE_CHECKING:
    from tether.injector.config import MeshConfig
    from tether.injector.patch import InjectResult, Origin, Report, inject, mark_for_injection, uninject

# Imported on first use: ``import tether.injector.X`` must not load the whole package (see tether.lazy).
__getattr__ = lazy_exports(__name__, {
    "MeshConfig": "tether.injector.config",
    "InjectResult": "tether.injector.patch",
    "Origin": "tether.injector.patch",
    "Report": "tether.injector.patch",
    "inject": "tether.injector.patch",
    "mark_for_injection": "tether.injector.patch",
    "uninject": "tether.injector.patch",
})

__all__ = ["InjectResult", "MeshConfig", "Origin", "Report", "inject", "mark_for_injection", "uninject"]
