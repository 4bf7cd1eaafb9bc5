"""Reading manifests from text, files, directories and stdin."""

import io
import textwrap

import pytest

from tether.resources.errors import ValidationError
from tether.resources.loading import iter_documents, load_path, load_text


def yaml(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def test_multi_document_yaml_skips_empty_documents_but_counts_them():
    text = yaml(
        """
        ---
        apiVersion: v1
        kind: Namespace
        metadata: {name: emojivoto}
        ---
        # nothing here but a comment
        ---
        apiVersion: v1
        kind: ServiceAccount
        metadata: {name: web, namespace: emojivoto}
        """
    )
    assert [(i, o["kind"]) for i, o in iter_documents(text, "e.yaml")] == [(1, "Namespace"), (3, "ServiceAccount")]
    assert [o["metadata"]["name"] for o in load_text(text, "e.yaml")] == ["emojivoto", "web"]


def test_lists_are_flattened_and_their_items_keep_the_list_document_number():
    text = yaml(
        """
        apiVersion: v1
        kind: Namespace
        metadata: {name: a}
        ---
        apiVersion: v1
        kind: List
        items:
        - {apiVersion: v1, kind: Namespace, metadata: {name: b}}
        - apiVersion: v1
          kind: ServiceAccountList
          items:
          - {apiVersion: v1, kind: ServiceAccount, metadata: {name: c}}
        """
    )
    assert [(i, o["metadata"]["name"]) for i, o in iter_documents(text, "l.yaml")] == [(1, "a"), (2, "b"), (2, "c")]


def test_an_empty_list_yields_nothing():
    assert load_text("apiVersion: v1\nkind: List\nitems: []\n", "l.yaml") == []
    assert load_text("apiVersion: v1\nkind: List\nitems:\n", "l.yaml") == []


def test_values_decode_as_kubernetes_json_does():
    [obj] = load_text(
        yaml(
            """
            metadata:
              creationTimestamp: 2024-10-04T18:19:00Z
              labels: {date: 2024-10-04}
            data:
              80: http
              true: yes
            ports: [80, "80"]
            """
        ),
        "v.yaml",
    )
    assert obj["metadata"] == {"creationTimestamp": "2024-10-04T18:19:00Z", "labels": {"date": "2024-10-04"}}
    assert obj["data"] == {"80": "http", "true": True}
    assert obj["ports"] == [80, "80"]


def test_merge_keys_are_expanded_and_explicit_keys_win():
    [obj] = load_text("base: &b {a: 1, b: 2}\nthis:\n  <<: *b\n  b: 3\n", "m.yaml")
    assert obj["this"] == {"a": 1, "b": 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n",
            "dup.yaml doc 1 line 5: duplicate key 'name' (first given on line 4)",
        ),
        (
            "kind: Pod\n---\nkind: Pod\nmetadata: {name: a}\nkind: Service\n",
            "dup.yaml doc 2 line 5: duplicate key 'kind' (first given on line 3)",
        ),
        ("kind: Pod\nmetadata: [\n", "dup.yaml doc 1 line 3: while parsing a flow node: did not find expected node content"),
        (
            "kind: Pod\nmetadata:\n  name: a\n bad: indent\n",
            "dup.yaml doc 1 line 4: while parsing a block mapping: did not find expected key",
        ),
        ("? [a, b]\n: c\n", "dup.yaml doc 1 line 1: a mapping key must be a string, not a collection"),
        ("- kind: Pod\n", "dup.yaml doc 1: expected a mapping (a Kubernetes object), got a list"),
        ("kind: Pod\n---\njust text\n", "dup.yaml doc 2: expected a mapping (a Kubernetes object), got a string"),
        ("kind: List\nitems: {a: 1}\n", "dup.yaml doc 1: items: expected a list"),
        ("kind: List\nitems: [1]\n", "dup.yaml doc 1: items[0]: expected a mapping (a Kubernetes object)"),
        ("42\n", "dup.yaml doc 1: expected a mapping (a Kubernetes object), got a number"),
        ("kind: Pod\n---\nfalse\n", "dup.yaml doc 2: expected a mapping (a Kubernetes object), got a boolean"),
        ("kind: Pod\nname: a\x07\n", "dup.yaml line 2: unacceptable character #x0007: control characters are not allowed"),
    ],
)
def test_yaml_errors_name_source_document_and_line(text, expected):
    with pytest.raises(ValidationError) as info:
        load_text(text, "dup.yaml")
    assert str(info.value) == expected


def test_json_documents_and_streams():
    assert load_text('{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}', "a.json") == [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}
    ]
    stream = '{"kind": "Namespace"}\n\t{"kind": "List", "items": [{"kind": "Pod"}]}\n'
    assert [(i, o["kind"]) for i, o in iter_documents(stream, "s.json")] == [(1, "Namespace"), (2, "Pod")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"kind": "Pod",\n "kind": "Service"}', "bad.json doc 1: duplicate key 'kind'"),
        ('{"kind": "Pod"}\n{"kind": ', "bad.json doc 2 line 2: Expecting value"),
        ('[{"kind": "Pod"}]', "bad.json doc 1: expected a mapping (a Kubernetes object), got a list"),
    ],
)
def test_json_errors(text, expected):
    with pytest.raises(ValidationError) as info:
        load_text(text, "bad.json")
    assert str(info.value) == expected


def test_load_path_walks_a_directory_recursively_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "svc.yml").write_text("kind: Service\n---\nkind: Pod\n")
    (tmp_path / "a.yaml").write_text("kind: Namespace\n")
    (tmp_path / "c.json").write_text('{"kind": "ServiceAccount"}')
    (tmp_path / "README.md").write_text("kind: ignored\n")
    got = [(src.removeprefix(str(tmp_path) + "/"), i, o["kind"]) for src, i, o in load_path(tmp_path)]
    assert got == [("a.yaml", 1, "Namespace"), ("b/svc.yml", 1, "Service"), ("b/svc.yml", 2, "Pod"), ("c.json", 1, "ServiceAccount")]


def test_load_path_reads_one_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "ns.yaml"
    path.write_bytes("\ufeffkind: Namespace\n".encode())
    assert load_path(str(path)) == [(str(path), 1, {"kind": "Namespace"})]


def test_load_path_reads_stdin_for_a_dash(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"kind: Namespace\n---\nkind: Pod\n")))
    assert load_path("-") == [("<stdin>", 1, {"kind": "Namespace"}), ("<stdin>", 2, {"kind": "Pod"})]


def test_load_path_errors_name_the_file(tmp_path):
    with pytest.raises(ValidationError) as info:
        load_path(tmp_path / "missing.yaml")
    assert str(info.value) == f"{tmp_path}/missing.yaml: no such file or directory"
    too_long = tmp_path / ("x" * 300 + ".yaml")
    with pytest.raises(ValidationError) as info:
        load_path(too_long)
    assert str(info.value) == f"{too_long}: cannot read: File name too long"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"kind: \xff\xfe\n")
    with pytest.raises(ValidationError) as info:
        load_path(binary)
    assert str(info.value) == f"{binary} line 1: not UTF-8 text (byte 6)"


def test_unreadable_files_are_reported_not_raised(tmp_path, monkeypatch):
    path = tmp_path / "secret.yaml"
    path.write_text("kind: Namespace\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(path), "read_bytes", denied)
    with pytest.raises(ValidationError) as info:
        load_path(path)
    assert str(info.value) == f"{path}: cannot read: Permission denied"
