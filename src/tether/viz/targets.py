"""What a viz command is asked about: ``deploy/web``, ``po``, ``ns/emojivoto``, ``svc/web``, ``au/web.svc:80``.

``Target(kind, namespace, name)`` is one resource selection (``name`` empty
for every object of the kind).  ``parse_targets`` reads the CLI's RESOURCE
arguments as ``linkerd viz stat`` does (``deploy web emoji``, ``deploy/web
po``, ``deploy,po``); ``parse_one`` reads a ``--to``/``--from`` value.

Each kind's Prometheus label is its name (``deployment``, ``pod``,
``namespace``, ``service``, ``authority``), as the scrape configuration's
relabelling makes it (``linkerd.io/proxy-deployment`` -> ``deployment``).

Pure.  Callers: ``tether.viz.promql``, ``tether.viz.metrics_api``, the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

DEPLOYMENT = "deployment"
POD = "pod"
NAMESPACE = "namespace"
SERVICE = "service"
AUTHORITY = "authority"
KINDS = (DEPLOYMENT, POD, NAMESPACE, SERVICE, AUTHORITY)

_NAMES = {
    DEPLOYMENT: ("deploy", "deployment", "deployments", "deployment.apps", "deployments.apps"),
    POD: ("po", "pod", "pods"),
    NAMESPACE: ("ns", "namespace", "namespaces"),
    SERVICE: ("svc", "service", "services"),
    AUTHORITY: ("au", "authority", "authorities"),
}
_KIND_OF = {name: kind for kind, names in _NAMES.items() for name in names}


class TargetError(ValueError):
    """A resource argument that names no kind viz knows, or no object; the message says which."""


@dataclass(frozen=True, slots=True)
class Target:
    kind: str
    namespace: str | None  # None: every namespace; for a namespace target, unused
    name: str = ""

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}" if self.name else self.kind

    @property
    def label(self) -> str:
        """The Prometheus label that holds this kind's name."""
        return self.kind


def kind_of(text: str) -> str:
    kind = _KIND_OF.get(text.strip().lower())
    if kind is None:
        known = ", ".join(names[0] for names in _NAMES.values())
        raise TargetError(f"unknown resource type {text!r} (viz knows {known})")
    return kind


def parse_one(text: str, namespace: str | None) -> Target:
    """``deploy/web`` or ``deploy`` (every deployment) in ``namespace``."""
    kind_text, slash, name = text.partition("/")
    if slash and not name:
        raise TargetError(f"{text!r} names no object")
    return Target(kind_of(kind_text), namespace, name)


def parse_targets(args: tuple[str, ...] | list[str], namespace: str | None) -> list[Target]:
    """RESOURCE arguments: ``deploy web emoji`` -> two targets; ``deploy/web po`` -> deploy/web and every pod."""
    parts = [p for arg in args for p in (arg.split(",") if "/" not in arg else [arg]) if p]
    out: list[Target] = []
    bare_kind: str | None = None
    for i, part in enumerate(parts):
        if "/" not in part and bare_kind is not None and part.lower() not in _KIND_OF and i > 0:
            if out and out[-1].kind == bare_kind and not out[-1].name:
                out.pop()
            out.append(Target(bare_kind, namespace, part))
            continue
        target = parse_one(part, namespace)
        bare_kind = None if target.name else target.kind
        out.append(target)
    if not out:
        raise TargetError("name a resource type, such as deploy, po, ns, svc or au")
    return out
