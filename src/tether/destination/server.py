"""The ``io.linkerd.proxy.destination.Destination`` gRPC handlers: ``Get`` and ``GetProfile``.

Registered on the grpc.aio server by ``tether.destination.service``.  Each
handler resolves the request to a target, builds its listener pipeline back to
front (translator <- adaptors <- watcher subscriptions), then lets the
stream's single writer run until the client leaves, the queue overflows or the
server shuts down; subscriptions are always undone on the way out.

Status codes (Linkerd's, see ``docs/destination.md``): a malformed authority,
a name outside ``svc.<cluster-domain>``, ``Get`` on an IP, or an ExternalName
Service -> INVALID_ARGUMENT; ``Get`` on an unknown Service -> NOT_FOUND; an IP
claimed by several pods or Services -> FAILED_PRECONDITION; a client too slow
for its queue -> RESOURCE_EXHAUSTED; a server shutting down -> UNAVAILABLE for
new calls, OK for open streams.  Responses are pre-encoded bytes, so one
update is serialised once for every stream that receives it.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable

import grpc

from tether.api import destination_pb2 as pb
from tether.destination.config import DestinationConfig
from tether.destination.endpoint_translator import EndpointEncoder, EndpointTranslator
from tether.destination.metrics import DestinationMetrics
from tether.destination.profile_listeners import FallbackProfileListener, OpaquePortsAdaptor
from tether.destination.profile_translator import EndpointProfileTranslator, ProfileTranslator
from tether.destination.watcher.cluster import ClusterIndex
from tether.destination.watcher.endpoints import EndpointsWatcher
from tether.destination.watcher.errors import ConflictingAddress, InvalidService, ServiceNotFound
from tether.destination.watcher.opaque_ports import OpaquePortsWatcher
from tether.destination.watcher.profiles import ProfileWatcher
from tether.destination.watcher.workloads import WorkloadWatcher
from tether.naming import InvalidName, ServiceAuthority
from tether.serving.context_token import ContextToken, parse_context_token
from tether.serving.rpc import Rejected, StreamSet, passthrough
from tether.serving.stream import UpdateStream

log = logging.getLogger(__name__)

SERVICE_NAME = "io.linkerd.proxy.destination.Destination"


class InvalidAuthority(ValueError):
    """``GetDestination.path`` is not ``host[:port]`` with a port in 1-65535."""


def split_host_port(path: str) -> tuple[str, int]:
    """``host:port`` (port 80 when absent; IPv6 in brackets) -> (host, port)."""
    if path.startswith("["):
        host, bracket, rest = path[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidAuthority(f"Invalid authority: {path!r}")
        port_s = rest[1:] if rest else "80"
    else:
        if path.count(":") > 1:
            raise InvalidAuthority(f"Invalid authority: {path!r} (put an IPv6 address in brackets)")
        host, sep, port_s = path.rpartition(":")
        if not sep:
            host, port_s = path, "80"
    if not host or not (port_s.isascii() and port_s.isdigit() and len(port_s) <= 5) or not 0 < int(port_s) < 65536:
        raise InvalidAuthority(f"Invalid authority: {path!r}")
    return host, int(port_s)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class DestinationServer:
    """The Destination service over the watchers; one per process."""

    def __init__(
        self,
        config: DestinationConfig,
        index: ClusterIndex,
        endpoints: EndpointsWatcher,
        profiles: ProfileWatcher,
        opaque_ports: OpaquePortsWatcher,
        workloads: WorkloadWatcher,
        metrics: DestinationMetrics,
    ) -> None:
        self._config = config
        self._index = index
        self._endpoints = endpoints
        self._profiles = profiles
        self._opaque_ports = opaque_ports
        self._workloads = workloads
        self._metrics = metrics
        self._encoder = EndpointEncoder(config)
        self.streams = StreamSet(config.stream_queue_capacity, config.stream_queue_bytes)
        self._sent = {kind: metrics.updates_sent.labels(kind) for kind in ("endpoints", "profile")}
        self._lag = {kind: metrics.delivery_lag.labels(kind) for kind in ("endpoints", "profile")}

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Get": grpc.unary_stream_rpc_method_handler(
                    self.get, request_deserializer=pb.GetDestination.FromString, response_serializer=passthrough
                ),
                "GetProfile": grpc.unary_stream_rpc_method_handler(
                    self.get_profile, request_deserializer=pb.GetDestination.FromString,
                    response_serializer=passthrough,
                ),
            },
        )

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    def _new_stream(self, kind: str, on_overflow: Callable[[], None]) -> UpdateStream:
        sent, lag = self._sent[kind], self._lag[kind]

        def on_sent(delay: float | None) -> None:
            sent.inc()
            if delay is not None:  # None: a subscription's first answer, not caused by a change
                lag.observe(delay)

        return self.streams.new_stream(on_sent=on_sent, on_overflow=on_overflow)

    async def _run(
        self, method: str, stream: UpdateStream, context: grpc.aio.ServicerContext, release: Callable[[], None]
    ) -> None:
        await self.streams.run(stream, context, release, self._metrics.streams.labels(method))

    # -- Get ---------------------------------------------------------------------

    async def get(self, request: pb.GetDestination, context: grpc.aio.ServicerContext) -> None:
        try:
            instance, authority = self._resolve_get(request)
        except Rejected as rejected:
            await context.abort(rejected.code, rejected.message)
            return
        overflows = self._metrics.endpoint_updates_queue_overflow
        # The labelled series is made only on overflow: clients choose the names, don't let them mint series.
        stream = self._new_stream("endpoints", lambda: overflows.labels(str(authority)).inc())
        node_name = parse_context_token(request.context_token).node_name
        translator = EndpointTranslator(self._encoder, stream)
        ns, name, port = authority.namespace, authority.service, authority.port
        try:
            self._endpoints.subscribe(ns, name, port, translator, instance, node_name)
        except ServiceNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            return
        except InvalidService as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        await self._run("Get", stream, context,
                        lambda: self._endpoints.unsubscribe(ns, name, port, translator, instance))

    def _resolve_get(self, request: pb.GetDestination) -> tuple[str | None, ServiceAuthority]:
        """The Service asked for, and the endpoint hostname when the name has one (``web-0.web.ns.svc...``)."""
        if self.streams.stopping:
            raise Rejected(grpc.StatusCode.UNAVAILABLE, "the destination service is shutting down")
        try:
            host, port = split_host_port(request.path)
        except InvalidAuthority as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if is_ip(host):
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, "IP queries not supported by Get API")
        try:
            return ServiceAuthority.parse_with_instance(f"{host}:{port}", self._config.cluster_domain)
        except InvalidName as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid authority: {exc}") from None

    # -- GetProfile ----------------------------------------------------------------

    async def get_profile(self, request: pb.GetDestination, context: grpc.aio.ServicerContext) -> None:
        try:
            target = self._resolve_profile(request)
        except Rejected as rejected:
            await context.abort(rejected.code, rejected.message)
            return
        token = parse_context_token(request.context_token)
        if isinstance(target, ServiceAuthority):
            await self._service_profile(target, token, context)
        else:
            await self._endpoint_profile(*target, context)

    def _resolve_profile(self, request: pb.GetDestination) -> ServiceAuthority | tuple[str, int]:
        """A service authority, or (ip, port) of an endpoint."""
        if self.streams.stopping:
            raise Rejected(grpc.StatusCode.UNAVAILABLE, "the destination service is shutting down")
        try:
            host, port = split_host_port(request.path)
        except InvalidAuthority as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        cluster_domain = self._config.cluster_domain
        if is_ip(host):
            ip = str(ipaddress.ip_address(host))
            services = self._index.services_at(ip)
            if len(services) > 1:
                names = ", ".join(f"{s.namespace}/{s.name}" for s in services)
                raise Rejected(grpc.StatusCode.FAILED_PRECONDITION,
                                f"service IP address conflict: {ip} is the cluster IP of {names}")
            if services:
                return ServiceAuthority(services[0].name, services[0].namespace, port, cluster_domain)
            return ip, port
        try:
            instance, authority = ServiceAuthority.parse_with_instance(f"{host}:{port}", cluster_domain)
        except InvalidName as exc:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid authority: {exc}") from None
        service = self._index.services.get((authority.namespace, authority.service))
        if service is not None and service.is_external_name:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT,
                            f"Service {authority.namespace}/{authority.service} is an ExternalName service")
        if instance is not None:
            # <hostname>.<svc>...: the profile of that one endpoint (a StatefulSet pod), as Linkerd answers it.
            address = self._index.address_of_hostname(authority.namespace, authority.service, instance)
            if address is None:
                raise Rejected(grpc.StatusCode.NOT_FOUND, f"no endpoint of Service {authority.namespace}/"
                                                          f"{authority.service} has the hostname {instance!r}")
            return str(ipaddress.ip_address(address)), port
        return authority

    async def _service_profile(
        self, authority: ServiceAuthority, token: ContextToken, context: grpc.aio.ServicerContext
    ) -> None:
        overflows = self._metrics.profile_updates_queue_overflow
        stream = self._new_stream("profile", lambda: overflows.labels(authority.fqdn, str(authority.port)).inc())
        adaptor = OpaquePortsAdaptor(ProfileTranslator(authority, stream), authority.port)
        ns, service, profile_name = authority.namespace, authority.service, authority.fqdn
        # The profile named after the service, in the client's namespace first, then in the service's.
        subscriptions: list[tuple[str, object]] = []
        if token.ns and token.ns != ns:
            fallback = FallbackProfileListener(adaptor)
            subscriptions = [(token.ns, fallback.primary), (ns, fallback.backup)]
        else:
            subscriptions = [(ns, adaptor)]

        def release() -> None:
            for profile_ns, listener in subscriptions:
                self._profiles.unsubscribe(profile_ns, profile_name, listener)  # type: ignore[arg-type]
            self._opaque_ports.unsubscribe(ns, service, adaptor)

        try:
            self._opaque_ports.subscribe(ns, service, adaptor)
            for profile_ns, listener in subscriptions:
                self._profiles.subscribe(profile_ns, profile_name, listener)  # type: ignore[arg-type]
        except BaseException:
            release()
            raise
        await self._run("GetProfile", stream, context, release)

    async def _endpoint_profile(self, ip: str, port: int, context: grpc.aio.ServicerContext) -> None:
        stream = self._new_stream("profile", self._metrics.endpoint_profile_updates_queue_overflow.inc)
        translator = EndpointProfileTranslator(self._encoder, stream)
        try:
            self._workloads.subscribe(ip, port, translator)
        except ConflictingAddress as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            return
        await self._run("GetProfile", stream, context, lambda: self._workloads.unsubscribe(ip, port, translator))
