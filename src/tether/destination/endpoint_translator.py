"""Endpoints to ``Update`` messages: the ``WeightedAddr`` rules, and the per-stream ``Get`` translator.

``EndpointEncoder`` (one per server) knows how a proxy must see an endpoint:
weight 10000, metric labels, ``tls_identity`` only for pods meshed by this
control plane, the protocol hint (h2, or opaque with ``opaque_transport``),
``http2`` settings and ``resource_ref``; in a ``Get`` stream also ``zone_locality``
(the endpoint's zone against the subscriber's: ``local``, ``remote`` or ``unknown``).  It encodes each published
``AddressSet`` once, however many streams receive it.

``EndpointTranslator`` is the ``EndpointListener`` of one ``Get`` stream: it
turns adds and removes into messages on the stream's bounded queue.  Its first
message is the snapshot, or ``no_endpoints{exists: true}`` when the Service
has none (the proxy API asks for a prompt first message); a deleted Service is
``no_endpoints{exists: false}``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from tether.api import destination_pb2 as pb
from tether.api import meta_pb2
from tether.api.addresses import InvalidAddress, to_tcp_address
from tether.destination.config import DestinationConfig
from tether.serving.stream import UpdateStream
from tether.destination.watcher.facts import DEFAULT_INBOUND_PORT, ExternalWorkloadFacts, PodFacts
from tether.destination.watcher.listeners import Address, AddressSet
from tether.destination.watcher.topology import zone_locality
from tether.naming import InvalidName, WorkloadIdentity

log = logging.getLogger(__name__)

DEFAULT_WEIGHT = 10000

NO_ENDPOINTS_EXISTS = pb.Update(no_endpoints=pb.NoEndpoints(exists=True)).SerializeToString()
NO_ENDPOINTS_UNKNOWN = pb.Update(no_endpoints=pb.NoEndpoints(exists=False)).SerializeToString()


def pod_resource(pod: PodFacts) -> meta_pb2.Metadata:
    resource = meta_pb2.Resource(group="core", kind="Pod", name=pod.name, namespace=pod.namespace)
    return meta_pb2.Metadata(resource=resource)


class EndpointEncoder:
    """Builds ``WeightedAddr``s and encoded ``Update``s under one configuration."""

    def __init__(self, config: DestinationConfig) -> None:
        self._config = config
        http2 = config.http2
        self._http2 = pb.Http2ClientParams(
            keep_alive=pb.Http2ClientParams.KeepAlive(
                interval=timedelta(seconds=http2.keep_alive_interval),
                timeout=timedelta(seconds=http2.keep_alive_timeout),
                while_idle=http2.keep_alive_while_idle,
            )
        )

    def control_plane_of(self, pod: PodFacts) -> str | None:
        """The control plane that meshed the pod: its label, else ours if a proxy visibly runs there."""
        if pod.control_plane_ns is not None:
            return pod.control_plane_ns
        return self._config.control_plane_ns if pod.proxy is not None else None

    def weighted_addr(self, address: Address, *, namespace_label: bool = False) -> pb.WeightedAddr | None:
        """The endpoint as a proxy must see it; None when it can't be encoded (logged)."""
        try:
            addr = to_tcp_address(address.ip, address.port)
        except InvalidAddress as exc:
            log.warning("skipping endpoint %s:%s: %s", address.ip, address.port, exc)
            return None
        weighted = pb.WeightedAddr(addr=addr, weight=DEFAULT_WEIGHT)
        if address.external is not None:
            return self._external(weighted, address, address.external, namespace_label)
        pod = address.pod
        if pod is None:
            return weighted
        labels = weighted.metric_labels
        labels["pod"] = pod.name
        owner_key, owner_name = address.owner or (pod.owner_kind, pod.owner_name)
        labels[owner_key] = owner_name
        labels["serviceaccount"] = pod.service_account
        labels["zone"] = address.zone
        if pod.pod_template_hash:
            labels["pod_template_hash"] = pod.pod_template_hash
        if pod.control_plane_ns:
            labels["control_plane_ns"] = pod.control_plane_ns
        if namespace_label:
            labels["namespace"] = pod.namespace
        weighted.resource_ref.CopyFrom(pod_resource(pod))
        control_plane = self.control_plane_of(pod)
        if control_plane is None or address.port in pod.skip_inbound_ports:
            return weighted
        config = self._config
        weighted.http2.CopyFrom(self._http2)
        meta_ports = pod.proxy.meta_ports if pod.proxy is not None else frozenset()
        inbound = pod.proxy.inbound_port if pod.proxy is not None else DEFAULT_INBOUND_PORT
        self._hint(weighted, address, None if address.port in meta_ports else inbound)
        if config.identity_trust_domain and control_plane == config.control_plane_ns:
            try:
                name = WorkloadIdentity(pod.service_account, pod.namespace, control_plane,
                                        config.identity_trust_domain).dns_name
            except InvalidName as exc:
                log.warning("no identity for pod %s/%s: %s", pod.namespace, pod.name, exc)
            else:
                weighted.tls_identity.dns_like_identity.name = name
                weighted.tls_identity.server_name.name = name
        return weighted

    def _hint(self, weighted: pb.WeightedAddr, address: Address, inbound: int | None) -> None:
        """The protocol hint: opaque transport to ``inbound`` when forced or opaque, then opaque, h2 or none."""
        config = self._config
        hint = weighted.protocol_hint
        if inbound is not None and (config.force_opaque_transport or address.opaque):
            hint.opaque_transport.inbound_port = inbound
        if address.opaque:
            hint.opaque.SetInParent()
        elif config.enable_h2_upgrade:
            hint.h2.SetInParent()
        else:
            hint.SetInParent()

    def _external(
        self, weighted: pb.WeightedAddr, address: Address, workload: ExternalWorkloadFacts, namespace_label: bool
    ) -> pb.WeightedAddr:
        """An ExternalWorkload's endpoint: always meshed, identified by its SPIFFE URI and server name."""
        labels = weighted.metric_labels
        labels["external_workload"] = workload.name
        if workload.owner_kind:
            labels[workload.owner_kind] = workload.owner_name
        labels["zone"] = address.zone
        if namespace_label:
            labels["namespace"] = workload.namespace
        weighted.resource_ref.CopyFrom(meta_pb2.Metadata(resource=meta_pb2.Resource(
            group="workload.linkerd.io", kind="ExternalWorkload", name=workload.name, namespace=workload.namespace)))
        weighted.http2.CopyFrom(self._http2)
        self._hint(weighted, address, workload.inbound_port)
        weighted.tls_identity.uri_like_identity.uri = workload.identity
        weighted.tls_identity.server_name.name = workload.server_name
        return weighted

    def add(self, addresses: AddressSet) -> bytes:
        encoded = addresses.memo.get(self)
        if encoded is None:
            addrs = []
            for address in addresses.addresses:
                weighted = self.weighted_addr(address)
                if weighted is not None:
                    locality = zone_locality(addresses.subscriber_zone, address.zone)
                    weighted.metric_labels["zone_locality"] = locality
                    if locality == "local" and self._config.ext_endpoint_zone_weights:
                        weighted.weight *= 10
                    addrs.append(weighted)
            message = pb.Update(add=pb.WeightedAddrSet(addrs=addrs, metric_labels=addresses.labels))
            encoded = addresses.memo[self] = message.SerializeToString()
        assert isinstance(encoded, bytes)
        return encoded

    def remove(self, addresses: AddressSet) -> bytes:
        encoded = addresses.memo.get(self)
        if encoded is None:
            addrs = []
            for a in addresses.addresses:
                try:
                    addrs.append(to_tcp_address(a.ip, a.port))
                except InvalidAddress:
                    continue
            encoded = addresses.memo[self] = pb.Update(remove=pb.AddrSet(addrs=addrs)).SerializeToString()
        assert isinstance(encoded, bytes)
        return encoded


class EndpointTranslator:
    """The ``EndpointListener`` of one ``Get`` stream."""

    __slots__ = ("_encoder", "_stream", "_fresh")

    def __init__(self, encoder: EndpointEncoder, stream: UpdateStream) -> None:
        self._encoder = encoder
        self._stream = stream
        # True until the client has heard the Service's current state (again, after a deletion).
        self._fresh = True

    def add(self, addresses: AddressSet) -> None:
        if addresses.addresses:
            self._stream.send(self._encoder.add(addresses), addresses.at)
        elif self._fresh:
            self._stream.send(NO_ENDPOINTS_EXISTS, addresses.at)
        self._fresh = False

    def remove(self, addresses: AddressSet) -> None:
        if not addresses.service_exists:
            self._stream.send(NO_ENDPOINTS_UNKNOWN, addresses.at)
            self._fresh = True
        elif addresses.addresses:
            self._stream.send(self._encoder.remove(addresses), addresses.at)
