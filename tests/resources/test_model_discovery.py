"""EndpointSlices: the shape Kubernetes writes, and bad entries left out with their path instead of failing."""

from __future__ import annotations

import pytest

from tether.resources.discovery import EndpointSliceSpec
from tether.resources.errors import ValidationError
from tether.resources.model import parse


def slice_(**fields: object) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-x", "namespace": "ns"}, "addressType": "IPv4", **fields}


def test_endpoints_ports_and_conditions() -> None:
    spec = parse(slice_(
        ports=[{"name": "http", "port": 8080}, {"port": 9090, "protocol": "UDP"}],
        endpoints=[{"addresses": ["10.0.0.1"], "conditions": {"ready": False, "terminating": True},
                    "hostname": "web-0", "zone": "a", "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "ns"},
                    "hints": {"forZones": [{"name": "a"}]}},
                   {"addresses": ["10.0.0.2"]}],
    )).spec
    assert isinstance(spec, EndpointSliceSpec)
    first, second = spec.endpoints
    assert (first.is_ready, first.terminating, first.hostname, first.zone, first.for_zones) == (False, True, "web-0", "a", ("a",))
    assert first.target_ref is not None and first.target_ref.name == "web-0"
    assert second.is_ready and second.ready is None  # unset means ready
    assert [(p.name, p.port, p.protocol) for p in spec.ports] == [("http", 8080, "TCP"), ("", 9090, "UDP")]
    assert spec.problems == ()


def test_bad_entries_are_left_out_and_named() -> None:
    spec = parse(slice_(
        ports=[{"name": "http", "port": 70000}, {"name": "ok", "port": 80}],
        endpoints=[{"addresses": ["fd00::1"]}, {"addresses": ["nope"]}, {"addresses": ["10.0.0.3"]}],
    )).spec
    assert isinstance(spec, EndpointSliceSpec)
    assert [e.addresses for e in spec.endpoints] == [("10.0.0.3",)]
    assert [p.name for p in spec.ports] == ["ok"]
    assert len(spec.problems) == 3
    assert "endpoints[0].addresses[0]" in spec.problems[0] and "not an IPv4 address" in spec.problems[0]
    assert "endpoints[1].addresses[0]" in spec.problems[1]
    assert "ports[0].port" in spec.problems[2]


def test_a_slice_without_an_address_type_does_not_parse() -> None:
    bad = slice_()
    del bad["addressType"]
    with pytest.raises(ValidationError, match="addressType"):
        parse(bad)
