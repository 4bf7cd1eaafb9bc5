"""ServiceProfiles to ``DestinationProfile`` messages, and the per-stream ``GetProfile`` translators.

``profile_message`` is Linkerd's ``createDestinationProfile``: routes with
their request-match trees, response classes, ``is_retryable`` and timeouts;
the retry budget (0.2, 10/s, 10 s when the profile has none); traffic-split
``dst_overrides``; ``fully_qualified_name``; ``opaque_protocol``; parent and
profile references.  No profile gives the same message with no routes.  A port
the Service does not define gets an empty ``DestinationProfile`` (Linkerd's
``svcDefinesPort``, after 2.20): the proxy then follows the client policy API,
whose *undefined-port* policy forbids the traffic.

``ProfileTranslator`` (a service target) and ``EndpointProfileTranslator`` (an
IP target) encode what they are given and send it only when the encoding
differs from the last one sent: the stream carries a message whenever an input
changes, and only then.
"""

from __future__ import annotations

from datetime import timedelta

from tether.api import destination_pb2 as pb
from tether.api import http_types_pb2, meta_pb2
from tether.destination.endpoint_translator import EndpointEncoder
from tether.serving.stream import EndReason, UpdateStream
from tether.destination.watcher.facts import ProfileFacts
from tether.destination.watcher.listeners import Address
from tether.naming import ServiceAuthority
from tether.resources.profiles import RequestMatch, ResponseMatch, ServiceProfileSpec

DEFAULT_RETRY_BUDGET = pb.RetryBudget(retry_ratio=0.2, min_retries_per_second=10, ttl=timedelta(seconds=10))

_REGISTERED_METHODS = {
    name: getattr(http_types_pb2.HttpMethod, name)
    for name in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "HEAD", "TRACE")
}


def _method(name: str) -> http_types_pb2.HttpMethod:
    registered = _REGISTERED_METHODS.get(name.upper())
    if registered is not None:
        return http_types_pb2.HttpMethod(registered=registered)
    return http_types_pb2.HttpMethod(unregistered=name)


def request_match(match: RequestMatch) -> pb.RequestMatch:
    """One node of a route condition; a node setting several fields becomes an implicit ``all``."""
    parts: list[pb.RequestMatch] = []
    if match.all is not None:
        parts.append(pb.RequestMatch(all=pb.RequestMatch.Seq(matches=[request_match(m) for m in match.all])))
    if match.any is not None:
        parts.append(pb.RequestMatch(any=pb.RequestMatch.Seq(matches=[request_match(m) for m in match.any])))
    if match.not_ is not None:
        parts.append(pb.RequestMatch(**{"not": request_match(match.not_)}))
    if match.path_regex is not None:
        parts.append(pb.RequestMatch(path=pb.PathMatch(regex=match.path_regex)))
    if match.method is not None:
        parts.append(pb.RequestMatch(method=_method(match.method)))
    if len(parts) == 1:
        return parts[0]
    return pb.RequestMatch(all=pb.RequestMatch.Seq(matches=parts))


def response_match(match: ResponseMatch) -> pb.ResponseMatch:
    parts: list[pb.ResponseMatch] = []
    if match.all is not None:
        parts.append(pb.ResponseMatch(all=pb.ResponseMatch.Seq(matches=[response_match(m) for m in match.all])))
    if match.any is not None:
        parts.append(pb.ResponseMatch(any=pb.ResponseMatch.Seq(matches=[response_match(m) for m in match.any])))
    if match.not_ is not None:
        parts.append(pb.ResponseMatch(**{"not": response_match(match.not_)}))
    if match.status is not None:
        parts.append(pb.ResponseMatch(status=pb.HttpStatusRange(min=match.status.min or 0, max=match.status.max or 0)))
    if len(parts) == 1:
        return parts[0]
    return pb.ResponseMatch(all=pb.ResponseMatch.Seq(matches=parts))


def _with_port(authority: str, port: int) -> str:
    """Linkerd appends the requested port to a dstOverrides authority that has none."""
    if authority.startswith("["):
        return authority if "]:" in authority else f"{authority}:{port}"
    return authority if ":" in authority else f"{authority}:{port}"


def profile_message(
    authority: ServiceAuthority, profile: ProfileFacts | None, opaque: bool
) -> pb.DestinationProfile:
    """The ``DestinationProfile`` for a service authority under ``profile`` (None: no ServiceProfile)."""
    spec = profile.spec if profile is not None else ServiceProfileSpec()
    message = pb.DestinationProfile(
        fully_qualified_name=authority.fqdn,
        opaque_protocol=opaque,
        parent_ref=meta_pb2.Metadata(
            resource=meta_pb2.Resource(
                group="core", kind="Service", name=authority.service, namespace=authority.namespace,
                port=authority.port,
            )
        ),
        profile_ref=meta_pb2.Metadata(
            resource=meta_pb2.Resource(group="linkerd.io", kind="ServiceProfile", name=profile.name,
                                       namespace=profile.namespace)
            if profile is not None
            else meta_pb2.Resource(group="linkerd.io")
        ),
    )
    for route in spec.routes:
        out = message.routes.add(condition=request_match(route.condition), is_retryable=route.is_retryable)
        out.metrics_labels["route"] = route.name
        for response_class in route.response_classes:
            out.response_classes.add(condition=response_match(response_class.condition),
                                     is_failure=response_class.is_failure)
        if route.timeout is not None:
            out.timeout.FromTimedelta(timedelta(seconds=route.timeout))
    budget = spec.retry_budget
    if budget is None:
        message.retry_budget.CopyFrom(DEFAULT_RETRY_BUDGET)
    else:
        message.retry_budget.retry_ratio = budget.retry_ratio
        message.retry_budget.min_retries_per_second = budget.min_retries_per_second
        message.retry_budget.ttl.FromTimedelta(timedelta(seconds=budget.ttl))
    for override in spec.dst_overrides:
        # Weights are decimillis: a Kubernetes quantity's milli-value times ten (1 -> 10000, 500m -> 5000).
        message.dst_overrides.add(authority=_with_port(override.authority, authority.port),
                                  weight=override.weight.milli_value() * 10)
    return message


# No name, routes or budget: a proxy resolves the target through the client policy API instead.
_EMPTY = pb.DestinationProfile()


class ProfileTranslator:
    """Sends the ``DestinationProfile`` of one service target whenever it changes."""

    __slots__ = ("_authority", "_stream", "_last")

    def __init__(self, authority: ServiceAuthority, stream: UpdateStream) -> None:
        self._authority = authority
        self._stream = stream
        self._last: bytes | None = None

    def update(self, profile: ProfileFacts | None, opaque: bool, undefined_port: bool, at: float | None) -> None:
        message = _EMPTY if undefined_port else profile_message(self._authority, profile, opaque)
        encoded = message.SerializeToString(deterministic=True)
        if encoded != self._last:
            self._last = encoded
            self._stream.send(encoded, at)


class EndpointProfileTranslator:
    """The ``WorkloadListener`` of one IP:port ``GetProfile`` stream: the endpoint itself, no routes."""

    __slots__ = ("_encoder", "_stream", "_last")

    def __init__(self, encoder: EndpointEncoder, stream: UpdateStream) -> None:
        self._encoder = encoder
        self._stream = stream
        self._last: bytes | None = None

    def update(self, target: Address, at: float | None) -> None:
        message = pb.DestinationProfile(retry_budget=DEFAULT_RETRY_BUDGET, opaque_protocol=target.opaque)
        endpoint = self._encoder.weighted_addr(target, namespace_label=True)
        if endpoint is not None:
            message.endpoint.CopyFrom(endpoint)
        encoded = message.SerializeToString(deterministic=True)
        if encoded != self._last:
            self._last = encoded
            self._stream.send(encoded, at)

    def became_service(self) -> None:
        # Ended with OK, as a stream the server closes: the proxy asks again soon (keeping this answer
        # meanwhile) and the server resolves the address to the Service then.
        self._stream.end(EndReason.GONE)
