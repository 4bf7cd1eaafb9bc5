"""``tether apply`` and ``get`` given hostile or broken input: each refused with an error naming the file and
document (never a traceback, which the ``tether`` fixture checks), and nothing stored."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

Run = Any  # the `tether` fixture from conftest

NS = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"


def _assert_nothing_stored(tether: Run) -> None:
    assert json.loads(tether("get", "namespaces", "-o", "json").stdout)["items"] == []


def test_alias_bomb_is_refused_before_it_expands(tether: Run, tmp_path: Path) -> None:
    # 600 bytes that expand to 9^9 (~387 million) strings.
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefghi":
        prev = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(NS.format(name="first") + "---\n" + "\n".join(lines) + "\n")
    err = tether("apply", "-f", str(bomb), ok=False).stderr
    assert f"{bomb} doc 2: the document expands to more than 1000000 nodes through YAML aliases" in err
    _assert_nothing_stored(tether)


@pytest.mark.parametrize("syntax", ["yaml", "json"])
def test_deep_nesting_is_refused(tether: Run, tmp_path: Path, syntax: str) -> None:
    depth = 500
    if syntax == "json":
        text = '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "deep"}, "x": ' + "[" * depth + "]" * depth + "}"
    else:
        text = NS.format(name="deep") + "x: " + "[" * depth + "]" * depth + "\n"
    path = tmp_path / f"deep.{syntax}"
    path.write_text(text)
    err = tether("apply", "-f", str(path), ok=False).stderr
    assert f"{path} doc 1" in err and "nested more than 100 levels deep" in err
    _assert_nothing_stored(tether)


def test_large_annotation_and_object_are_refused(tether: Run, tmp_path: Path) -> None:
    annotated = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "noted", "annotations": {"big": "x" * (256 * 1024)}}}
    huge = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "huge"}, "data": ["y" * 1000] * 2000}
    first, second = tmp_path / "annotated.json", tmp_path / "huge.json"
    first.write_text(json.dumps(annotated))
    second.write_text(json.dumps(huge))
    err = tether("apply", "-f", str(first), "-f", str(second), ok=False).stderr
    assert f"{first} doc 1 Namespace noted: metadata.annotations: annotations total 262147 bytes, over " \
           "Kubernetes' limit of 262144 bytes (256 KiB)" in err
    assert f"{second} doc 1 huge: the object is 2006" in err and "over Kubernetes' limit of 1572864 bytes" in err
    _assert_nothing_stored(tether)


def test_non_utf8_stdin_is_an_error(tether_executable: str, home: Path) -> None:
    done = subprocess.run([tether_executable, "apply", "-f", "-"], input=b"kind: \xff\xfe\n", capture_output=True,
                          env={**os.environ, "TETHER_HOME": str(home)}, timeout=60)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert b"<stdin> line 1: not UTF-8 text (byte 6)" in done.stderr


@pytest.mark.parametrize(("doc", "message"), [
    ("apiVersion: v1\nkind: Gadget\nmetadata: {name: g}\n", "doc 2 Gadget g: kind: unknown kind 'Gadget'"),
    ("apiVersion: v1\nmetadata: {name: g}\n", "doc 2 g: kind: required"),
    ("kind: Namespace\nmetadata: {name: g}\n", "doc 2 g: apiVersion: required"),
    ("apiVersion: v9\nkind: Namespace\nmetadata: {name: g}\n",
     "doc 2 Namespace g: apiVersion: unsupported version 'v9' of Namespace"),
])
def test_type_errors_name_the_file_and_document(tether: Run, tmp_path: Path, doc: str, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(NS.format(name="ok") + "---\n" + doc)
    assert f"{path} {message}" in tether("apply", "-f", str(path), ok=False).stderr
    _assert_nothing_stored(tether)


def test_an_object_named_twice_is_created_then_configured(tether: Run, tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(NS.format(name="dup") + "---\n" + NS.format(name="dup") + "  labels: {team: b}\n"
                    + "---\n" + NS.format(name="dup") + "  labels: {team: b}\n")
    out = tether("apply", "-f", str(path)).stdout.splitlines()
    assert out == ["namespace/dup created", "namespace/dup configured", "namespace/dup unchanged"]
    stored = json.loads(tether("get", "namespace", "dup", "-o", "json").stdout)
    assert stored["metadata"]["labels"] == {"team": "b"}


def test_get_names_a_corrupt_object_and_shows_the_rest(tether: Run, tmp_path: Path, home: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(NS.format(name="good") + "---\n" + NS.format(name="bad"))
    tether("apply", "-f", str(path))
    stores = list(home.rglob("*.db"))
    assert len(stores) == 1
    with sqlite3.connect(stores[0]) as db:
        db.execute("UPDATE objects SET body = '{\"metad' WHERE name = 'bad'")
    proc = tether("get", "namespaces", ok=False)
    assert "good" in proc.stdout and "bad" not in proc.stdout
    assert "Namespace bad: the stored object is corrupt" in proc.stderr
    assert "Namespace bad: the stored object is corrupt" in tether("get", "namespace", "bad", ok=False).stderr
