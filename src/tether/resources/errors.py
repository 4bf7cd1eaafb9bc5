"""The errors bad manifests produce: `ValidationError` (and its `PolicyRuleViolation`) and `UnknownKind`.

Every check in `tether.resources` raises `ValidationError` with the field path
it was looking at; `model.parse` and `loading` then fill in where the object
came from (file, document, kind, name), so the CLI and the store can print one
line that lets a user find the problem without a traceback.
"""

from __future__ import annotations


class ValidationError(Exception):
    """A manifest (or a selector string) that does not follow its kind's rules.

    ``str(e)`` reads ``<source> doc <n> line <l> <kind> <name>: <path>: <message>``;
    parts that are unknown are left out.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        source: str | None = None,
        doc_index: int | None = None,
        kind: str | None = None,
        name: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.source = source
        self.doc_index = doc_index
        self.kind = kind
        self.name = name
        self.line = line

    def located(
        self,
        *,
        source: str | None = None,
        doc_index: int | None = None,
        kind: str | None = None,
        name: str | None = None,
    ) -> "ValidationError":
        """A copy (of the same class) with the object's whereabouts filled in where still unknown."""
        return type(self)(
            self.message,
            path=self.path,
            source=self.source if self.source is not None else source,
            doc_index=self.doc_index if self.doc_index is not None else doc_index,
            kind=self.kind if self.kind is not None else kind,
            name=self.name if self.name is not None else name,
            line=self.line,
        )

    def __str__(self) -> str:
        where = [
            self.source,
            None if self.doc_index is None else f"doc {self.doc_index}",
            None if self.line is None else f"line {self.line}",
            self.kind,
            self.name,
        ]
        parts = [" ".join(p for p in where if p)]
        parts.append(self.path)
        parts.append(self.message)
        return ": ".join(p for p in parts if p)


class PolicyRuleViolation(ValidationError):
    """A manifest that reads but breaks one of Linkerd's admission rules (say a second TCPRoute rule).

    Linkerd's webhook admits Gateway API routes it cannot read (another
    controller may own them) but denies those that break its rules; this class
    lets the webhook tell the two apart.
    """


class UnknownKind(Exception):
    """A resource type name (``kubectl get <name>``) that names no known kind."""

    def __init__(self, name: str, suggestions: tuple[str, ...] = ()) -> None:
        self.name = name
        self.suggestions = suggestions
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown resource type {name!r}{hint}")
