"""``audit`` (proxy.md §8.2): the default policy and a Server's ``accessPolicy: audit`` allow every client and
log each request or connection that only the audit authorization let in, counted as allowed under it.

Socket-free: the request check (``core.inbound_authz``) and the inbound layer driven with made-up replies.
"""

from __future__ import annotations

import ipaddress
import logging

import pytest
from layer_helpers import drive, replies
from test_inbound_authz import WEB, identities_authz, request, server_message
from test_inbound_layer import CLIENT, settings

from tether.api import inbound_pb2 as pb
from tether.api import meta_pb2
from tether.proxy.codec.addrs import parse_socket_addr
from tether.proxy.core import commands as cmd
from tether.proxy.core.config import DefaultPolicy
from tether.proxy.core.inbound import inbound
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate
from tether.proxy.core.server_policy import ServerPolicy, default_policy


def audit_authz() -> pb.Authz:
    """What the policy controller sends for ``accessPolicy: audit`` (and the ``audit`` default server)."""
    out = pb.Authz(metadata=meta_pb2.Metadata(default="audit"))
    out.networks.add().net.prefix_len = 0  # 0.0.0.0/0
    out.networks[0].net.ip.ipv4 = 0
    out.authentication.unauthenticated.SetInParent()
    return out


def check(policy: ServerPolicy, client_id: str | None, registry: Registry) -> object:
    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.0.0.7"), mesh_tls=client_id is not None,
                            client_id=client_id, target_labels='target_port="8080"', tls_labels="tls=\"true\"",
                            registry=registry)
    return InboundRequestPolicy(lambda: policy, facts, clock=lambda: 0.0).check(request(b"/api/vote"))


def test_the_audit_default_policy_allows_and_logs_each_request(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(retain_idle=600)
    policy = default_policy(DefaultPolicy.AUDIT, (), opaque=False)
    with caplog.at_level(logging.INFO, logger="tether.proxy"):
        assert check(policy, None, registry) is None
    assert "request allowed" in caplog.text and "default:audit" in caplog.text
    assert 'authz_group="",authz_kind="default",authz_name="audit"' in registry.render()


def test_a_server_with_access_policy_audit_logs_only_what_its_other_authorizations_deny(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(retain_idle=600)
    # A Server whose AuthorizationPolicy admits web, with accessPolicy: audit after it (the controller's order).
    policy = translate(server_message(route_authz=[], server_authz=[identities_authz("web-only", WEB), audit_authz()]))
    with caplog.at_level(logging.INFO, logger="tether.proxy"):
        assert check(policy, WEB, registry) is None
        assert "request allowed" not in caplog.text  # web is allowed by its own authorization
        assert check(policy, None, registry) is None  # would have been denied: audited
    assert caplog.text.count("request allowed") == 1
    text = registry.render()
    assert 'authz_name="web-only"' in text and 'authz_kind="default",authz_name="audit"' in text


def test_opaque_connections_are_audited_too(caplog: pytest.LogCaptureFixture) -> None:
    policy = default_policy(DefaultPolicy.AUDIT, (), opaque=True)
    with caplog.at_level(logging.INFO, logger="tether.proxy"):
        seen = drive(inbound(parse_socket_addr("10.1.0.5:3306"), CLIENT,
                             settings(policies=lambda port: policy, registry=Registry(retain_idle=600))),
                     replies({cmd.Connect: cmd.Connected(None, 0.001), cmd.Forward: None}))
    assert isinstance(seen[-1], cmd.Forward)
    assert "request allowed" in caplog.text and "10.1.0.9" in caplog.text
