"""References from one resource to another: policy ``targetRef``s, authentication refs, route ``parentRefs``.

Used by `policy` and `routes`; the policy controller compares a reference with a
`ResourceType` through ``targets``. Linkerd treats the group ``core`` as the core
(empty) group, so the typed reference stores it as ``""``; ``raw`` keeps the
spelling the user chose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tether.resources import formats
from tether.resources.fields import REQUIRED, Fields
from tether.resources.kinds import ResourceType

_KIND = re.compile(r"[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?")
_KIND_MAX = 63


def _group(value: str) -> str | None:
    return None if value in ("", "core") else formats.dns1123_subdomain(value)


def kind_name(value: str) -> str | None:
    if len(value) > _KIND_MAX or not _KIND.fullmatch(value):
        return f"must be a kind name: letters, digits and '-', starting with a letter, at most {_KIND_MAX} characters"
    return None


def ref_name(value: str) -> str | None:
    return None if 1 <= len(value) <= formats.SUBDOMAIN_MAX else f"must be 1 to {formats.SUBDOMAIN_MAX} characters"


def refers_to(group: str, kind: str, rtype: ResourceType) -> bool:
    """Whether ``group`` (already normalised) and ``kind`` name ``rtype``.

    Kinds compare case-insensitively, as Linkerd compares them.
    """
    return group == rtype.group and kind.lower() == rtype.kind.lower()


def read_group(node: Fields, default: str) -> str:
    group = node.string("group", default, check=_group)
    return "" if group == "core" else group


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """``{group, kind, name, namespace}``; name None means "all of that kind" where allowed."""

    group: str
    kind: str
    name: str | None
    namespace: str | None = None

    def targets(self, rtype: ResourceType) -> bool:
        return refers_to(self.group, self.kind, rtype)


def parse_ref(node: Fields, *, name_required: bool = True) -> ObjectRef:
    """A reference; ``group`` defaults to core, ``namespace`` to the referrer's (None)."""
    return ObjectRef(
        group=read_group(node, ""),
        kind=node.string("kind", check=kind_name),
        name=node.string("name", REQUIRED if name_required else None, check=ref_name),
        namespace=node.string("namespace", None, check=formats.dns1123_label),
    )


@dataclass(frozen=True, slots=True)
class ParentRef:
    """A route's attachment point: a Server (inbound), a Service or EgressNetwork (outbound)."""

    group: str
    kind: str
    name: str
    namespace: str | None = None
    section_name: str | None = None
    port: int | None = None

    def targets(self, rtype: ResourceType) -> bool:
        return refers_to(self.group, self.kind, rtype)


def parse_parent_ref(node: Fields, default_group: str) -> ParentRef:
    """A Gateway API ``ParentReference``, with its CRD's defaults (kind ``Gateway``)."""
    return ParentRef(
        group=read_group(node, default_group),
        kind=node.string("kind", "Gateway", check=kind_name),
        name=node.string("name", check=ref_name),
        namespace=node.string("namespace", None, check=formats.dns1123_label),
        section_name=node.string("sectionName", None, check=formats.dns1123_subdomain),
        port=node.port("port", None),
    )
