"""The seam through which the local pod controller meshes a pod: the injector's patch, handed in from above.

The local platform plays the admission webhook's part for its pods (a Deployment's new pods
and bare Pods, before they run), but it sits below ``tether.injector`` in the layers. So the
pod controller takes a `Mesher` and never decides itself: ``tether platform run`` passes
``tether.injector.local_platform.LocalMesher``, which runs the same `inject` the webhook
runs, so a pod is meshed, skipped or annotated by one implementation on both platforms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Meshed:
    """The pod as it will run; ``meshed`` when the proxy was added, else ``reason`` says why not; ``event``
    the (reason, message) of the Event the webhook records on the pod's owner (``Injected``...)."""

    obj: dict[str, Any]
    meshed: bool
    reason: str = ""
    warnings: tuple[str, ...] = ()
    event: tuple[str, str] | None = None


class Mesher(Protocol):
    def __call__(self, pod: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> Meshed:
        """Mesh ``pod`` (a Pod object with its namespace set) as the webhook would; never changes it."""
        ...
