"""The ``workload`` string of an inbound ``PortSpec``: which pod (or external workload) is asking.

Proxies send JSON ``{"ns": ..., "pod": ...}`` or ``{"ns": ..., "external_workload": ...}``,
or the legacy ``<ns>:<pod>``.  Anything else is ``InvalidWorkload`` (the RPC
answers ``INVALID_ARGUMENT``).  Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tether.naming import is_dns1123_label, is_dns1123_subdomain

MAX_WORKLOAD = 1024


class InvalidWorkload(ValueError):
    """A workload string that names no pod or external workload."""


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    external: bool = False  # an ExternalWorkload rather than a Pod

    def __str__(self) -> str:
        return f"{'externalworkload' if self.external else 'pod'} {self.namespace}/{self.name}"


def parse_workload(text: str) -> Workload:
    if not text or len(text) > MAX_WORKLOAD:
        raise InvalidWorkload(f"invalid workload {text[:80]!r}: empty or too long")
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise InvalidWorkload(f"invalid workload {text[:80]!r}: not JSON") from None
        if not isinstance(doc, dict):
            raise InvalidWorkload(f"invalid workload {text[:80]!r}: not a JSON object")
        ns, pod, external = doc.get("ns"), doc.get("pod"), doc.get("external_workload")
        if (pod is None) == (external is None):
            raise InvalidWorkload(f"invalid workload {text[:80]!r}: give exactly one of pod, external_workload")
        workload = Workload(ns, pod if pod is not None else external, external is not None)  # type: ignore[arg-type]
    else:
        ns, sep, pod = text.partition(":")
        if not sep:
            raise InvalidWorkload(f"invalid workload {text[:80]!r}: expected <namespace>:<pod> or JSON")
        workload = Workload(ns, pod)
    if not isinstance(workload.namespace, str) or not is_dns1123_label(workload.namespace):
        raise InvalidWorkload(f"invalid workload {text[:80]!r}: bad namespace")
    if not isinstance(workload.name, str) or not is_dns1123_subdomain(workload.name):
        raise InvalidWorkload(f"invalid workload {text[:80]!r}: bad name")
    return workload
