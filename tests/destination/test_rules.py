"""The pure rules: port sets, context tokens, authorities, facts read from resources, the layering rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from destination_helpers import pod, service
from hypothesis import given
from hypothesis import strategies as st

from tether.serving.context_token import ContextToken, parse_context_token
from tether.destination.server import InvalidAuthority, split_host_port
from tether.destination.watcher.facts import PodFacts, ServiceFacts, facts_of
from tether.ports import DEFAULT_OPAQUE_PORTS, PortSet, parse_port_set, port_of_address

SRC = Path(__file__).resolve().parents[2] / "src" / "tether"


@pytest.mark.parametrize(
    ("text", "ports", "skipped"),
    [
        ("25,587,3306-3310", [25, 587, 3306, 3310], []),
        (" 80 , 443 ,", [80, 443], []),
        ("http,9000", [8080, 9000], []),
        ("0,65536,abc,10-5,x-y", [], ["0", "65536", "abc", "10-5", "x-y"]),
        ("", [], []),
    ],
)
def test_port_sets(text: str, ports: list[int], skipped: list[str]) -> None:
    parsed, bad = parse_port_set(text, {"http": (8080,)})
    assert all(p in parsed for p in ports)
    assert bad == skipped


def test_port_set_ranges_merge_and_stay_small() -> None:
    every = parse_port_set("1-65535")[0]
    assert every.ranges == ((1, 65535),) and 4143 in every and 0 not in every
    assert PortSet.of([1, 2, 3, (5, 9), 4]) == PortSet.of([(1, 9)])
    assert str(DEFAULT_OPAQUE_PORTS) == "25,587,3306,4444,5432,6379,9300,11211"
    assert port_of_address("0.0.0.0:4143") == 4143 and port_of_address("[::]:4191") == 4191
    assert port_of_address("nonsense") is None


@given(st.lists(st.integers(1, 65535), max_size=30))
def test_port_set_membership_matches_a_plain_set(ports: list[int]) -> None:
    parsed = parse_port_set(",".join(map(str, ports)))[0]
    probes = {1, 65535} | {q for p in ports for q in (p - 1, p, p + 1) if 1 <= q <= 65535}
    assert {p for p in probes if p in parsed} == set(ports)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ('{"ns":"emojivoto","nodeName":"node-1","pod":"web-0"}', ContextToken("emojivoto", "node-1", "web-0")),
        ("ns:emojivoto", ContextToken("emojivoto")),
        ("", ContextToken()),
        ("{not json", ContextToken()),
        ('["ns"]', ContextToken()),
        ('{"ns": 5}', ContextToken()),
        ("garbage", ContextToken()),
    ],
)
def test_context_tokens(token: str, expected: ContextToken) -> None:
    assert parse_context_token(token) == expected


@given(st.text(max_size=200))
def test_any_context_token_parses_to_something(token: str) -> None:
    assert isinstance(parse_context_token(token), ContextToken)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("web.ns.svc.cluster.local:8080", ("web.ns.svc.cluster.local", 8080)),
        ("web.ns.svc.cluster.local", ("web.ns.svc.cluster.local", 80)),
        ("10.0.0.1:80", ("10.0.0.1", 80)),
        ("[fd00::1]:443", ("fd00::1", 443)),
        ("[fd00::1]", ("fd00::1", 80)),
    ],
)
def test_split_host_port(path: str, expected: tuple[str, int]) -> None:
    assert split_host_port(path) == expected


@pytest.mark.parametrize("path", ["", ":80", "web:0", "web:65536", "web:http", "fd00::1", "[fd00::1", "[::1]x",
                                  "web:000000080"])
def test_split_host_port_rejects(path: str) -> None:
    with pytest.raises(InvalidAuthority):
        split_host_port(path)


def test_pod_facts() -> None:
    facts = facts_of(pod("web-1", "10.1.0.1", annotations={"config.linkerd.io/skip-inbound-ports": "9000-9001"}))
    assert isinstance(facts, PodFacts)
    assert (facts.owner_kind, facts.owner_name, facts.pod_template_hash) == ("deployment", "web", "5d4f8")
    assert facts.proxy is not None and facts.proxy.inbound_port == 4143
    assert facts.proxy.meta_ports == frozenset({4190, 4191})
    assert 9001 in facts.skip_inbound_ports and facts.is_endpoint
    assert facts.resolve_port("http") == 8080 and facts.resolve_port("nope") is None

    bare = facts_of(pod("solo", "10.1.0.2", meshed=False, template_hash=None))
    assert isinstance(bare, PodFacts)
    assert (bare.owner_kind, bare.owner_name, bare.proxy, bare.control_plane_ns) == ("pod", "solo", None, None)

    by_annotation = facts_of(pod("annotated", "10.1.0.3", meshed=False,
                                 annotations={"linkerd.io/proxy-version": "edge"}))
    assert isinstance(by_annotation, PodFacts) and by_annotation.proxy is not None

    statefulset = pod("db-0", "10.1.0.4", template_hash=None)
    statefulset["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                                   "controller": True}]
    facts = facts_of(statefulset)
    assert isinstance(facts, PodFacts) and (facts.owner_kind, facts.owner_name) == ("statefulset", "db")


def test_service_facts_resolve_annotation_names() -> None:
    facts = facts_of(service(ports=[{"name": "http", "port": 80}, {"name": "admin", "port": 9990}],
                             annotations={"config.linkerd.io/opaque-ports": "admin,3306"}))
    assert isinstance(facts, ServiceFacts) and facts.opaque_ports is not None
    assert 9990 in facts.opaque_ports and 3306 in facts.opaque_ports and 80 not in facts.opaque_ports


def test_watch_code_imports_no_generated_protobufs() -> None:
    """Habit 12: only translators build wire messages; the watch side never imports ``tether.api``."""
    watch_side = [*sorted((SRC / "destination" / "watcher").glob("*.py")), SRC / "platform" / "watch.py",
                  SRC / "platform" / "local" / "watch.py"]
    for path in watch_side:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("tether.api", "grpc", "google.protobuf")), f"{path.name} imports {name}"
