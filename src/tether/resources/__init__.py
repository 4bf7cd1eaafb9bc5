"""Typed models of the resources the mesh reads: parsing, validation with field paths, label selectors. Pure.

The bottom layer: it imports nothing else of Tether and does no I/O beyond
reading the files `loading` is asked to load. Modules:

- `errors`: `ValidationError` (file, document, kind, name, field path) and `UnknownKind`.
- `kinds`: the `ResourceType` registry, kubectl-style name `lookup`, `type_of`.
- `loading`: YAML/JSON text, files, directories and stdin into plain objects.
- `model`: `parse` an object into a `Resource` with a typed ``spec``/``status``.
- `selectors`: label selectors (``-l`` text, ``matchLabels``/``matchExpressions``).
- `durations`, `quantities`, `formats`: Go durations, Kubernetes quantities, name formats.
- `fields`, `meta`, `references`: how the per-kind modules read manifests.
- `core`, `workloads`, `profiles`, `policy`, `routes`: the typed specs per kind.
"""
