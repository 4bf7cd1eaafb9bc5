"""The local HTTP rate limit of an inbound server (``core.ratelimit``), with a fake clock, and as requests see it."""

from __future__ import annotations

import ipaddress

from tether.api import inbound_pb2 as pb
from tether.proxy.codec.http1 import RequestHead
from tether.proxy.core.authz import Meta
from tether.proxy.core.errors import ErrorKind
from tether.proxy.core.inbound_authz import ConnectionFacts, InboundRequestPolicy
from tether.proxy.core.metrics import Registry
from tether.proxy.core.policy_translation import translate
from tether.proxy.core.ratelimit import RateLimit

WEB = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
BOT = "vote-bot.emojivoto.serviceaccount.identity.linkerd.cluster.local"


def admitted(limit: RateLimit, client: str | None, now: float, n: int) -> list[str | None]:
    return [limit.check(client, now) for _ in range(n)]


def test_total_limit_allows_a_seconds_burst_then_refills() -> None:
    limit = RateLimit(Meta.default("rl"), total=3)
    assert admitted(limit, WEB, 0.0, 4) == [None, None, None, "total"]
    assert limit.check(BOT, 0.2) == "total"  # 0.6 of a token back: not enough
    assert limit.check(BOT, 0.34) is None  # one whole token
    assert admitted(limit, WEB, 10.0, 4) == [None, None, None, "total"]  # never more than a second's worth


def test_per_identity_limits_and_overrides() -> None:
    limit = RateLimit(Meta.default("rl"), total=100, identity=2, overrides={BOT: 1})
    assert admitted(limit, WEB, 0.0, 3) == [None, None, "identity"]
    assert admitted(limit, BOT, 0.0, 2) == [None, "identity"]  # its override
    assert admitted(limit, None, 0.0, 3) == [None, None, "identity"]  # no identity: one shared bucket
    # A request refused by the total takes no token from its client.
    tight = RateLimit(Meta.default("rl"), total=1, identity=5)
    assert admitted(tight, WEB, 0.0, 2) == [None, "total"]
    assert tight.check(WEB, 1.0) is None


def test_requests_over_the_limit_get_429_counted_with_their_scope() -> None:
    message = pb.Server(labels={"group": "policy.linkerd.io", "kind": "server", "name": "web-http"})
    message.protocol.http1.SetInParent()
    authz = message.authorizations.add()
    authz.networks.add().net.prefix_len = 0
    authz.networks[0].net.ip.ipv4 = 0
    authz.authentication.unauthenticated.SetInParent()
    authz.metadata.default = "all-unauthenticated"
    rl = message.protocol.http1.local_rate_limit
    rl.metadata.resource.group, rl.metadata.resource.kind = "policy.linkerd.io", "HTTPLocalRateLimitPolicy"
    rl.metadata.resource.name = "web-rl"
    rl.total.requestsPerSecond = 2
    policy = translate(message)
    registry = Registry(retain_idle=600)
    now = [0.0]
    facts = ConnectionFacts(port=8080, client_ip=ipaddress.ip_address("10.0.0.7"), mesh_tls=True, client_id=WEB,
                            target_labels='target_port="8080"', tls_labels=f'tls="true",client_id="{WEB}"',
                            registry=registry)
    check = InboundRequestPolicy(lambda: policy, facts, clock=lambda: now[0]).check
    head = RequestHead(b"GET", b"/", ((b"host", b"web"),))
    assert check(head) is None and check(head) is None
    refused = check(head)
    assert refused is not None and refused.kind is ErrorKind.RATE_LIMITED and refused.status == 429
    assert refused.kind.grpc == 8  # RESOURCE_EXHAUSTED
    now[0] = 1.0
    assert check(head) is None
    text = registry.render()
    assert 'ratelimit_name="web-rl",ratelimit_scope="total"} 1' in text
    assert "inbound_http_authz_allow_total" in text
