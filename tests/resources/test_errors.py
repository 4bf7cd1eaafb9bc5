"""How errors print: the one line a user reads to find the broken field."""

from tether.resources.errors import UnknownKind, ValidationError


def test_full_location_reads_file_doc_kind_name_path_message():
    e = ValidationError(
        "expected a string",
        path="spec.routes[0].condition.method",
        source="emoji.yaml",
        doc_index=2,
        kind="ServiceProfile",
        name="web-svc.emojivoto.svc.cluster.local",
    )
    assert str(e) == (
        "emoji.yaml doc 2 ServiceProfile web-svc.emojivoto.svc.cluster.local: "
        "spec.routes[0].condition.method: expected a string"
    )


def test_unknown_parts_are_left_out():
    assert str(ValidationError("required", path="kind")) == "kind: required"
    assert str(ValidationError("bad", source="a.yaml", line=3)) == "a.yaml line 3: bad"
    assert str(ValidationError("bad", kind="Pod", name="web")) == "Pod web: bad"


def test_located_fills_only_what_is_unknown():
    inner = ValidationError("bad", path="spec", kind="Server")
    e = inner.located(source="p.yaml", doc_index=4, kind="Other", name="web-http")
    assert (e.source, e.doc_index, e.kind, e.name, e.path, e.message) == ("p.yaml", 4, "Server", "web-http", "spec", "bad")
    assert inner.source is None


def test_unknown_kind_lists_close_matches():
    assert str(UnknownKind("srvr", ("srv", "servers"))) == "unknown resource type 'srvr'; did you mean srv, servers?"
    assert str(UnknownKind("zzz")) == "unknown resource type 'zzz'"
