"""The message schema of tether.api, checked field by field against linkerd2-proxy-api v0.20.

TABLE was transcribed from shared/reference/proxy-api.md section 3 (itself generated
from upstream's descriptors), not from our .proto files, so a slip in proto/ shows
up here. Each message is a line of its own; its fields follow, indented, as
`number name type label oneof`. Names are relative to `io.linkerd.proxy.` unless
they start with `google.` or `transport.`; a message with no lines under it has no
fields (a presence marker).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.descriptor_pb2 import DescriptorProto

TABLE = """
# destination
destination.GetDestination
    1   scheme                          string                                                singular  -
    2   path                            string                                                singular  -
    3   context_token                   string                                                singular  -
destination.Update
    1   add                             destination.WeightedAddrSet                           singular  update
    2   remove                          destination.AddrSet                                   singular  update
    3   no_endpoints                    destination.NoEndpoints                               singular  update
destination.AddrSet
    1   addrs                           net.TcpAddress                                        repeated  -
destination.WeightedAddrSet
    1   addrs                           destination.WeightedAddr                              repeated  -
    2   metric_labels                   map<string,string>                                    map       -
destination.WeightedAddr
    1   addr                            net.TcpAddress                                        singular  -
    3   weight                          uint32                                                singular  -
    4   metric_labels                   map<string,string>                                    map       -
    5   tls_identity                    destination.TlsIdentity                               singular  -
    6   protocol_hint                   destination.ProtocolHint                              singular  -
    7   authority_override              destination.AuthorityOverride                         singular  -
    8   http2                           destination.Http2ClientParams                         singular  -
    9   resource_ref                    meta.Metadata                                         singular  -
destination.TlsIdentity
    1   dns_like_identity               destination.TlsIdentity.DnsLikeIdentity               singular  strategy
    3   uri_like_identity               destination.TlsIdentity.UriLikeIdentity               singular  strategy
    4   server_name                     destination.TlsIdentity.DnsLikeIdentity               singular  -
destination.TlsIdentity.DnsLikeIdentity
    1   name                            string                                                singular  -
destination.TlsIdentity.UriLikeIdentity
    1   uri                             string                                                singular  -
destination.AuthorityOverride
    1   authority_override              string                                                singular  -
destination.NoEndpoints
    1   exists                          bool                                                  singular  -
destination.ProtocolHint
    1   h2                              destination.ProtocolHint.H2                           singular  protocol
    3   opaque                          destination.ProtocolHint.Opaque                       singular  protocol
    2   opaque_transport                destination.ProtocolHint.OpaqueTransport              singular  -
destination.ProtocolHint.H2
destination.ProtocolHint.Opaque
destination.ProtocolHint.OpaqueTransport
    1   inbound_port                    uint32                                                singular  -
destination.Http2ClientParams
    1   flow_control                    destination.Http2ClientParams.FlowControl             singular  -
    2   keep_alive                      destination.Http2ClientParams.KeepAlive               singular  -
    3   internals                       destination.Http2ClientParams.Internals               singular  -
destination.Http2ClientParams.FlowControl
    1   initial_connection_window_size  uint32                                                singular  -
    2   initial_stream_window_size      uint32                                                singular  -
    3   adaptive_flow_control           bool                                                  singular  -
destination.Http2ClientParams.KeepAlive
    1   interval                        google.protobuf.Duration                              singular  -
    2   timeout                         google.protobuf.Duration                              singular  -
    3   while_idle                      bool                                                  singular  -
destination.Http2ClientParams.Internals
    1   max_concurrent_reset_streams    uint32                                                singular  -
    2   max_frame_size                  uint32                                                singular  -
    3   max_send_buf_size               uint32                                                singular  -
destination.DestinationProfile
    5   fully_qualified_name            string                                                singular  -
    4   opaque_protocol                 bool                                                  singular  -
    1   routes                          destination.Route                                     repeated  -
    2   retry_budget                    destination.RetryBudget                               singular  -
    3   dst_overrides                   destination.WeightedDst                               repeated  -
    6   endpoint                        destination.WeightedAddr                              singular  -
    7   parent_ref                      meta.Metadata                                         singular  -
    8   profile_ref                     meta.Metadata                                         singular  -
destination.Route
    1   condition                       destination.RequestMatch                              singular  -
    2   response_classes                destination.ResponseClass                             repeated  -
    3   metrics_labels                  map<string,string>                                    map       -
    4   is_retryable                    bool                                                  singular  -
    5   timeout                         google.protobuf.Duration                              singular  -
destination.RetryBudget
    1   retry_ratio                     float                                                 singular  -
    2   min_retries_per_second          uint32                                                singular  -
    3   ttl                             google.protobuf.Duration                              singular  -
destination.ResponseClass
    1   condition                       destination.ResponseMatch                             singular  -
    2   is_failure                      bool                                                  singular  -
destination.RequestMatch
    1   all                             destination.RequestMatch.Seq                          singular  match
    2   any                             destination.RequestMatch.Seq                          singular  match
    3   not                             destination.RequestMatch                              singular  match
    4   path                            destination.PathMatch                                 singular  match
    5   method                          http_types.HttpMethod                                 singular  match
destination.RequestMatch.Seq
    1   matches                         destination.RequestMatch                              repeated  -
destination.PathMatch
    1   regex                           string                                                singular  -
destination.ResponseMatch
    1   all                             destination.ResponseMatch.Seq                         singular  match
    2   any                             destination.ResponseMatch.Seq                         singular  match
    3   not                             destination.ResponseMatch                             singular  match
    4   status                          destination.HttpStatusRange                           singular  match
destination.ResponseMatch.Seq
    1   matches                         destination.ResponseMatch                             repeated  -
destination.HttpStatusRange
    1   min                             uint32                                                singular  -
    2   max                             uint32                                                singular  -
destination.WeightedDst
    1   authority                       string                                                singular  -
    2   weight                          uint32                                                singular  -
    3   backend_ref                     meta.Metadata                                         singular  -

# identity
identity.CertifyRequest
    1   identity                        string                                                singular  -
    2   token                           bytes                                                 singular  -
    3   certificate_signing_request     bytes                                                 singular  -
identity.CertifyResponse
    1   leaf_certificate                bytes                                                 singular  -
    2   intermediate_certificates       bytes                                                 repeated  -
    3   valid_until                     google.protobuf.Timestamp                             singular  -

# inbound
inbound.PortSpec
    1   workload                        string                                                singular  -
    2   port                            uint32                                                singular  -
inbound.Server
    1   protocol                        inbound.ProxyProtocol                                 singular  -
    2   server_ips                      net.IPAddress                                         repeated  -
    3   authorizations                  inbound.Authz                                         repeated  -
    4   labels                          map<string,string>                                    map       -
inbound.ProxyProtocol
    1   detect                          inbound.ProxyProtocol.Detect                          singular  kind
    2   opaque                          inbound.ProxyProtocol.Opaque                          singular  kind
    3   tls                             inbound.ProxyProtocol.Tls                             singular  kind
    4   http1                           inbound.ProxyProtocol.Http1                           singular  kind
    5   http2                           inbound.ProxyProtocol.Http2                           singular  kind
    6   grpc                            inbound.ProxyProtocol.Grpc                            singular  kind
inbound.ProxyProtocol.Detect
    1   timeout                         google.protobuf.Duration                              singular  -
    3   http_routes                     inbound.HttpRoute                                     repeated  -
    4   http_local_rate_limit           inbound.HttpLocalRateLimit                            singular  -
inbound.ProxyProtocol.Http1
    2   routes                          inbound.HttpRoute                                     repeated  -
    3   local_rate_limit                inbound.HttpLocalRateLimit                            singular  -
inbound.ProxyProtocol.Http2
    2   routes                          inbound.HttpRoute                                     repeated  -
    3   local_rate_limit                inbound.HttpLocalRateLimit                            singular  -
inbound.ProxyProtocol.Grpc
    2   routes                          inbound.GrpcRoute                                     repeated  -
inbound.ProxyProtocol.Opaque
inbound.ProxyProtocol.Tls
inbound.Authz
    1   networks                        inbound.Network                                       repeated  -
    2   authentication                  inbound.Authn                                         singular  -
    3   labels                          map<string,string>                                    map       -
    4   metadata                        meta.Metadata                                         singular  -
inbound.Network
    1   net                             net.IPNetwork                                         singular  -
    2   except                          net.IPNetwork                                         repeated  -
inbound.Authn
    1   unauthenticated                 inbound.Authn.PermitUnauthenticated                   singular  permit
    2   meshTLS                         inbound.Authn.PermitMeshTLS                           singular  permit
inbound.Authn.PermitUnauthenticated
inbound.Authn.PermitMeshTLS
    1   unauthenticated                 inbound.Authn.PermitUnauthenticated                   singular  clients
    2   identities                      inbound.Authn.PermitMeshTLS.PermitClientIdentities    singular  clients
inbound.Authn.PermitMeshTLS.PermitClientIdentities
    1   identities                      inbound.Identity                                      repeated  -
    2   suffixes                        inbound.IdentitySuffix                                repeated  -
inbound.Identity
    1   name                            string                                                singular  -
inbound.IdentitySuffix
    1   parts                           string                                                repeated  -
inbound.HttpRoute
    1   metadata                        meta.Metadata                                         singular  -
    2   hosts                           http_route.HostMatch                                  repeated  -
    3   authorizations                  inbound.Authz                                         repeated  -
    4   rules                           inbound.HttpRoute.Rule                                repeated  -
inbound.HttpRoute.Rule
    1   matches                         http_route.HttpRouteMatch                             repeated  -
    2   filters                         inbound.HttpRoute.Filter                              repeated  -
inbound.HttpRoute.Filter
    1   failure_injector                http_route.HttpFailureInjector                        singular  kind
    2   request_header_modifier         http_route.RequestHeaderModifier                      singular  kind
    3   redirect                        http_route.RequestRedirect                            singular  kind
inbound.GrpcRoute
    1   metadata                        meta.Metadata                                         singular  -
    2   hosts                           http_route.HostMatch                                  repeated  -
    3   authorizations                  inbound.Authz                                         repeated  -
    4   rules                           inbound.GrpcRoute.Rule                                repeated  -
inbound.GrpcRoute.Rule
    1   matches                         grpc_route.GrpcRouteMatch                             repeated  -
    2   filters                         inbound.GrpcRoute.Filter                              repeated  -
inbound.GrpcRoute.Filter
    1   failure_injector                grpc_route.GrpcFailureInjector                        singular  kind
    2   request_header_modifier         http_route.RequestHeaderModifier                      singular  kind
inbound.HttpLocalRateLimit
    1   metadata                        meta.Metadata                                         singular  -
    2   total                           inbound.HttpLocalRateLimit.Limit                      singular  -
    3   identity                        inbound.HttpLocalRateLimit.Limit                      singular  -
    4   overrides                       inbound.HttpLocalRateLimit.Override                   repeated  -
inbound.HttpLocalRateLimit.Override
    1   limit                           inbound.HttpLocalRateLimit.Limit                      singular  -
    2   clients                         inbound.HttpLocalRateLimit.Override.ClientIdentities  singular  -
inbound.HttpLocalRateLimit.Override.ClientIdentities
    1   identities                      inbound.Identity                                      repeated  -
inbound.HttpLocalRateLimit.Limit
    1   requestsPerSecond               uint32                                                singular  -

# outbound
outbound.TrafficSpec
    1   source_workload                 string                                                singular  -
    2   addr                            net.TcpAddress                                        singular  target
    3   authority                       string                                                singular  target
outbound.OutboundPolicy
    1   protocol                        outbound.ProxyProtocol                                singular  -
    2   metadata                        meta.Metadata                                         singular  -
outbound.ProxyProtocol
    1   detect                          outbound.ProxyProtocol.Detect                         singular  kind
    2   opaque                          outbound.ProxyProtocol.Opaque                         singular  kind
    3   http1                           outbound.ProxyProtocol.Http1                          singular  kind
    4   http2                           outbound.ProxyProtocol.Http2                          singular  kind
    5   grpc                            outbound.ProxyProtocol.Grpc                           singular  kind
    6   tls                             outbound.ProxyProtocol.Tls                            singular  kind
outbound.ProxyProtocol.Detect
    1   timeout                         google.protobuf.Duration                              singular  -
    2   opaque                          outbound.ProxyProtocol.Opaque                         singular  -
    3   http1                           outbound.ProxyProtocol.Http1                          singular  -
    4   http2                           outbound.ProxyProtocol.Http2                          singular  -
outbound.ProxyProtocol.Opaque
    1   routes                          outbound.OpaqueRoute                                  repeated  -
outbound.ProxyProtocol.Http1
    1   routes                          outbound.HttpRoute                                    repeated  -
    2   failure_accrual                 outbound.FailureAccrual                               singular  -
outbound.ProxyProtocol.Http2
    1   routes                          outbound.HttpRoute                                    repeated  -
    2   failure_accrual                 outbound.FailureAccrual                               singular  -
outbound.ProxyProtocol.Grpc
    1   routes                          outbound.GrpcRoute                                    repeated  -
    2   failure_accrual                 outbound.FailureAccrual                               singular  -
outbound.ProxyProtocol.Tls
    1   routes                          outbound.TlsRoute                                     repeated  -
outbound.HttpRoute
    1   metadata                        meta.Metadata                                         singular  -
    2   hosts                           http_route.HostMatch                                  repeated  -
    3   rules                           outbound.HttpRoute.Rule                               repeated  -
outbound.HttpRoute.Rule
    1   matches                         http_route.HttpRouteMatch                             repeated  -
    2   filters                         outbound.HttpRoute.Filter                             repeated  -
    3   backends                        outbound.HttpRoute.Distribution                       singular  -
    4   requestTimeout                  google.protobuf.Duration                              singular  -
    5   timeouts                        http_route.Timeouts                                   singular  -
    6   retry                           outbound.HttpRoute.Retry                              singular  -
    7   allow_l5d_request_headers       bool                                                  singular  -
outbound.HttpRoute.Filter
    1   failure_injector                http_route.HttpFailureInjector                        singular  kind
    2   request_header_modifier         http_route.RequestHeaderModifier                      singular  kind
    3   redirect                        http_route.RequestRedirect                            singular  kind
    4   response_header_modifier        http_route.ResponseHeaderModifier                     singular  kind
outbound.HttpRoute.Distribution
    1   empty                           outbound.HttpRoute.Distribution.Empty                 singular  kind
    2   first_available                 outbound.HttpRoute.Distribution.FirstAvailable        singular  kind
    3   random_available                outbound.HttpRoute.Distribution.RandomAvailable       singular  kind
outbound.HttpRoute.Distribution.Empty
outbound.HttpRoute.Distribution.FirstAvailable
    1   backends                        outbound.HttpRoute.RouteBackend                       repeated  -
outbound.HttpRoute.Distribution.RandomAvailable
    1   backends                        outbound.HttpRoute.WeightedRouteBackend               repeated  -
outbound.HttpRoute.Retry
    1   max_retries                     uint32                                                singular  -
    2   max_request_bytes               uint32                                                singular  -
    3   conditions                      outbound.HttpRoute.Retry.Conditions                   singular  -
    4   timeout                         google.protobuf.Duration                              singular  -
    5   backoff                         outbound.ExponentialBackoff                           singular  -
outbound.HttpRoute.Retry.Conditions
    1   status_ranges                   outbound.HttpRoute.Retry.Conditions.StatusRange       repeated  -
outbound.HttpRoute.Retry.Conditions.StatusRange
    1   start                           uint32                                                singular  -
    2   end                             uint32                                                singular  -
outbound.HttpRoute.RouteBackend
    1   backend                         outbound.Backend                                      singular  -
    3   filters                         outbound.HttpRoute.Filter                             repeated  -
    4   requestTimeout                  google.protobuf.Duration                              singular  -
outbound.HttpRoute.WeightedRouteBackend
    1   backend                         outbound.HttpRoute.RouteBackend                       singular  -
    2   weight                          uint32                                                singular  -
outbound.GrpcRoute
    1   metadata                        meta.Metadata                                         singular  -
    2   hosts                           http_route.HostMatch                                  repeated  -
    3   rules                           outbound.GrpcRoute.Rule                               repeated  -
outbound.GrpcRoute.Rule
    1   matches                         grpc_route.GrpcRouteMatch                             repeated  -
    2   filters                         outbound.GrpcRoute.Filter                             repeated  -
    3   backends                        outbound.GrpcRoute.Distribution                       singular  -
    4   requestTimeout                  google.protobuf.Duration                              singular  -
    5   timeouts                        http_route.Timeouts                                   singular  -
    6   retry                           outbound.GrpcRoute.Retry                              singular  -
    7   allow_l5d_request_headers       bool                                                  singular  -
outbound.GrpcRoute.Filter
    1   failure_injector                grpc_route.GrpcFailureInjector                        singular  kind
    2   request_header_modifier         http_route.RequestHeaderModifier                      singular  kind
outbound.GrpcRoute.Distribution
    1   empty                           outbound.GrpcRoute.Distribution.Empty                 singular  kind
    2   first_available                 outbound.GrpcRoute.Distribution.FirstAvailable        singular  kind
    3   random_available                outbound.GrpcRoute.Distribution.RandomAvailable       singular  kind
outbound.GrpcRoute.Distribution.Empty
outbound.GrpcRoute.Distribution.FirstAvailable
    1   backends                        outbound.GrpcRoute.RouteBackend                       repeated  -
outbound.GrpcRoute.Distribution.RandomAvailable
    1   backends                        outbound.GrpcRoute.WeightedRouteBackend               repeated  -
outbound.GrpcRoute.Retry
    1   max_retries                     uint32                                                singular  -
    2   max_request_bytes               uint32                                                singular  -
    3   conditions                      outbound.GrpcRoute.Retry.Conditions                   singular  -
    4   timeout                         google.protobuf.Duration                              singular  -
    5   backoff                         outbound.ExponentialBackoff                           singular  -
outbound.GrpcRoute.Retry.Conditions
    1   cancelled                       bool                                                  singular  -
    4   deadine_exceeded                bool                                                  singular  -
    8   resource_exhausted              bool                                                  singular  -
    13  internal                        bool                                                  singular  -
    14  unavailable                     bool                                                  singular  -
outbound.GrpcRoute.RouteBackend
    1   backend                         outbound.Backend                                      singular  -
    3   filters                         outbound.GrpcRoute.Filter                             repeated  -
    4   requestTimeout                  google.protobuf.Duration                              singular  -
outbound.GrpcRoute.WeightedRouteBackend
    1   backend                         outbound.GrpcRoute.RouteBackend                       singular  -
    2   weight                          uint32                                                singular  -
outbound.OpaqueRoute
    1   metadata                        meta.Metadata                                         singular  -
    3   rules                           outbound.OpaqueRoute.Rule                             repeated  -
outbound.OpaqueRoute.Rule
    1   backends                        outbound.OpaqueRoute.Distribution                     singular  -
    2   filters                         outbound.OpaqueRoute.Filter                           repeated  -
outbound.OpaqueRoute.Filter
    1   invalid                         opaque_route.Invalid                                  singular  kind
    2   forbidden                       opaque_route.Forbidden                                singular  kind
outbound.OpaqueRoute.Distribution
    1   empty                           outbound.OpaqueRoute.Distribution.Empty               singular  kind
    2   first_available                 outbound.OpaqueRoute.Distribution.FirstAvailable      singular  kind
    3   random_available                outbound.OpaqueRoute.Distribution.RandomAvailable     singular  kind
outbound.OpaqueRoute.Distribution.Empty
outbound.OpaqueRoute.Distribution.FirstAvailable
    1   backends                        outbound.OpaqueRoute.RouteBackend                     repeated  -
outbound.OpaqueRoute.Distribution.RandomAvailable
    1   backends                        outbound.OpaqueRoute.WeightedRouteBackend             repeated  -
outbound.OpaqueRoute.RouteBackend
    1   backend                         outbound.Backend                                      singular  -
    3   filters                         outbound.OpaqueRoute.Filter                           repeated  -
outbound.OpaqueRoute.WeightedRouteBackend
    1   backend                         outbound.OpaqueRoute.RouteBackend                     singular  -
    2   weight                          uint32                                                singular  -
outbound.TlsRoute
    1   metadata                        meta.Metadata                                         singular  -
    2   snis                            tls_route.SniMatch                                    repeated  -
    3   rules                           outbound.TlsRoute.Rule                                repeated  -
outbound.TlsRoute.Rule
    1   backends                        outbound.TlsRoute.Distribution                        singular  -
    2   filters                         outbound.TlsRoute.Filter                              repeated  -
outbound.TlsRoute.Filter
    1   invalid                         opaque_route.Invalid                                  singular  kind
    2   forbidden                       opaque_route.Forbidden                                singular  kind
outbound.TlsRoute.Distribution
    1   empty                           outbound.TlsRoute.Distribution.Empty                  singular  kind
    2   first_available                 outbound.TlsRoute.Distribution.FirstAvailable         singular  kind
    3   random_available                outbound.TlsRoute.Distribution.RandomAvailable        singular  kind
outbound.TlsRoute.Distribution.Empty
outbound.TlsRoute.Distribution.FirstAvailable
    1   backends                        outbound.TlsRoute.RouteBackend                        repeated  -
outbound.TlsRoute.Distribution.RandomAvailable
    1   backends                        outbound.TlsRoute.WeightedRouteBackend                repeated  -
outbound.TlsRoute.RouteBackend
    1   backend                         outbound.Backend                                      singular  -
    3   filters                         outbound.TlsRoute.Filter                              repeated  -
outbound.TlsRoute.WeightedRouteBackend
    1   backend                         outbound.TlsRoute.RouteBackend                        singular  -
    2   weight                          uint32                                                singular  -
outbound.Backend
    1   metadata                        meta.Metadata                                         singular  -
    2   forward                         destination.WeightedAddr                              singular  kind
    3   balancer                        outbound.Backend.BalanceP2c                           singular  kind
    4   queue                           outbound.Queue                                        singular  -
outbound.Backend.EndpointDiscovery
    1   dst                             outbound.Backend.EndpointDiscovery.DestinationGet     singular  kind
outbound.Backend.EndpointDiscovery.DestinationGet
    1   path                            string                                                singular  -
outbound.Backend.BalanceP2c
    1   discovery                       outbound.Backend.EndpointDiscovery                    singular  -
    2   peak_ewma                       outbound.Backend.BalanceP2c.PeakEwma                  singular  load
    3   penalty_peak_ewma               outbound.Backend.BalanceP2c.PenaltyPeakEwma           singular  load
outbound.Backend.BalanceP2c.PeakEwma
    1   default_rtt                     google.protobuf.Duration                              singular  -
    2   decay                           google.protobuf.Duration                              singular  -
outbound.Backend.BalanceP2c.PenaltyPeakEwma
    1   default_rtt                     google.protobuf.Duration                              singular  -
    2   decay                           google.protobuf.Duration                              singular  -
    3   penalty                         google.protobuf.Duration                              singular  -
    4   max_retry_after                 google.protobuf.Duration                              singular  -
    5   penalty_decay                   google.protobuf.Duration                              singular  -
outbound.Queue
    1   capacity                        uint32                                                singular  -
    2   failfast_timeout                google.protobuf.Duration                              singular  -
outbound.FailureAccrual
    1   consecutive_failures            outbound.FailureAccrual.ConsecutiveFailures           singular  kind
    2   unified                         outbound.FailureAccrual.Unified                       singular  kind
    3   ejection                        outbound.EjectionConfig                               singular  -
outbound.FailureAccrual.ConsecutiveFailures
    1   max_failures                    uint32                                                singular  -
    2   backoff                         outbound.ExponentialBackoff                           singular  -
outbound.FailureAccrual.Unified
    1   success_rate_threshold          double                                                singular  -
    2   decay                           google.protobuf.Duration                              singular  -
    3   min_requests                    uint32                                                singular  -
    4   max_consecutive_failures        uint32                                                singular  -
    5   backoff                         outbound.ExponentialBackoff                           singular  -
outbound.EjectionConfig
    1   min_ready_endpoints             uint32                                                singular  -
outbound.ExponentialBackoff
    1   min_backoff                     google.protobuf.Duration                              singular  -
    2   max_backoff                     google.protobuf.Duration                              singular  -
    3   jitter_ratio                    float                                                 singular  -
    4   respect_retry_after_hint        bool                                                  singular  -

# tap
tap.ObserveRequest
    1   limit                           uint32                                                singular  -
    2   match                           tap.ObserveRequest.Match                              singular  -
    3   extract                         tap.ObserveRequest.Extract                            singular  -
tap.ObserveRequest.Match
    1   all                             tap.ObserveRequest.Match.Seq                          singular  match
    2   any                             tap.ObserveRequest.Match.Seq                          singular  match
    3   not                             tap.ObserveRequest.Match                              singular  match
    4   source                          tap.ObserveRequest.Match.Tcp                          singular  match
    5   destination                     tap.ObserveRequest.Match.Tcp                          singular  match
    6   http                            tap.ObserveRequest.Match.Http                         singular  match
    7   destination_label               tap.ObserveRequest.Match.Label                        singular  match
    8   route_label                     tap.ObserveRequest.Match.Label                        singular  match
tap.ObserveRequest.Match.Seq
    1   matches                         tap.ObserveRequest.Match                              repeated  -
tap.ObserveRequest.Match.Label
    1   key                             string                                                singular  -
    2   value                           string                                                singular  -
tap.ObserveRequest.Match.Tcp
    1   netmask                         tap.ObserveRequest.Match.Tcp.Netmask                  singular  match
    3   ports                           tap.ObserveRequest.Match.Tcp.PortRange                singular  match
tap.ObserveRequest.Match.Tcp.Netmask
    1   ip                              net.IPAddress                                         singular  -
    2   mask                            uint32                                                singular  -
tap.ObserveRequest.Match.Tcp.PortRange
    1   min                             uint32                                                singular  -
    2   max                             uint32                                                singular  -
tap.ObserveRequest.Match.Http
    1   scheme                          http_types.Scheme                                     singular  match
    3   method                          http_types.HttpMethod                                 singular  match
    2   authority                       tap.ObserveRequest.Match.Http.StringMatch             singular  match
    4   path                            tap.ObserveRequest.Match.Http.StringMatch             singular  match
tap.ObserveRequest.Match.Http.StringMatch
    1   exact                           string                                                singular  match
    2   prefix                          string                                                singular  match
tap.ObserveRequest.Extract
    1   http                            tap.ObserveRequest.Extract.Http                       singular  extract
tap.ObserveRequest.Extract.Http
    1   headers                         tap.ObserveRequest.Extract.Http.Headers               singular  extract
tap.ObserveRequest.Extract.Http.Headers
tap.Eos
    1   grpc_status_code                uint32                                                singular  end
    2   reset_error_code                uint32                                                singular  end
tap.TapEvent
    1   source                          net.TcpAddress                                        singular  -
    5   source_meta                     tap.TapEvent.EndpointMeta                             singular  -
    7   route_meta                      tap.TapEvent.RouteMeta                                singular  -
    2   destination                     net.TcpAddress                                        singular  -
    4   destination_meta                tap.TapEvent.EndpointMeta                             singular  -
    6   proxy_direction                 tap.TapEvent.ProxyDirection                           singular  -
    3   http                            tap.TapEvent.Http                                     singular  event
tap.TapEvent.EndpointMeta
    1   labels                          map<string,string>                                    map       -
tap.TapEvent.RouteMeta
    1   labels                          map<string,string>                                    map       -
tap.TapEvent.Http
    1   request_init                    tap.TapEvent.Http.RequestInit                         singular  event
    2   response_init                   tap.TapEvent.Http.ResponseInit                        singular  event
    3   response_end                    tap.TapEvent.Http.ResponseEnd                         singular  event
tap.TapEvent.Http.StreamId
    1   base                            uint32                                                singular  -
    2   stream                          uint64                                                singular  -
tap.TapEvent.Http.RequestInit
    1   id                              tap.TapEvent.Http.StreamId                            singular  -
    2   method                          http_types.HttpMethod                                 singular  -
    3   scheme                          http_types.Scheme                                     singular  -
    4   authority                       string                                                singular  -
    5   path                            string                                                singular  -
    6   headers                         http_types.Headers                                    singular  -
tap.TapEvent.Http.ResponseInit
    1   id                              tap.TapEvent.Http.StreamId                            singular  -
    2   since_request_init              google.protobuf.Duration                              singular  -
    3   http_status                     uint32                                                singular  -
    4   headers                         http_types.Headers                                    singular  -
tap.TapEvent.Http.ResponseEnd
    1   id                              tap.TapEvent.Http.StreamId                            singular  -
    2   since_request_init              google.protobuf.Duration                              singular  -
    3   since_response_init             google.protobuf.Duration                              singular  -
    4   response_bytes                  uint64                                                singular  -
    5   eos                             tap.Eos                                               singular  -
    6   trailers                        http_types.Headers                                    singular  -

# net
net.IPAddress
    1   ipv4                            fixed32                                               singular  ip
    2   ipv6                            net.IPv6                                              singular  ip
net.IPNetwork
    1   ip                              net.IPAddress                                         singular  -
    2   prefix_len                      uint32                                                singular  -
net.IPv6
    1   first                           fixed64                                               singular  -
    2   last                            fixed64                                               singular  -
net.TcpAddress
    1   ip                              net.IPAddress                                         singular  -
    2   port                            uint32                                                singular  -

# meta
meta.Metadata
    1   default                         string                                                singular  kind
    2   resource                        meta.Resource                                         singular  kind
meta.Resource
    1   group                           string                                                singular  -
    2   kind                            string                                                singular  -
    3   name                            string                                                singular  -
    4   namespace                       string                                                singular  -
    5   section                         string                                                singular  -
    6   port                            uint32                                                singular  -

# http_types
http_types.HttpMethod
    1   registered                      http_types.HttpMethod.Registered                      singular  type
    2   unregistered                    string                                                singular  type
http_types.Scheme
    1   registered                      http_types.Scheme.Registered                          singular  type
    2   unregistered                    string                                                singular  type
http_types.Headers
    1   headers                         http_types.Headers.Header                             repeated  -
http_types.Headers.Header
    1   name                            string                                                singular  -
    2   value                           bytes                                                 singular  -

# http_route
http_route.HostMatch
    1   exact                           string                                                singular  match
    2   suffix                          http_route.HostMatch.Suffix                           singular  match
http_route.HostMatch.Suffix
    1   reverse_labels                  string                                                repeated  -
http_route.HttpRouteMatch
    1   path                            http_route.PathMatch                                  singular  -
    2   headers                         http_route.HeaderMatch                                repeated  -
    3   query_params                    http_route.QueryParamMatch                            repeated  -
    4   method                          http_types.HttpMethod                                 singular  -
http_route.PathMatch
    1   exact                           string                                                singular  kind
    2   prefix                          string                                                singular  kind
    3   regex                           string                                                singular  kind
http_route.HeaderMatch
    1   name                            string                                                singular  -
    2   exact                           bytes                                                 singular  value
    3   regex                           string                                                singular  value
http_route.QueryParamMatch
    1   name                            string                                                singular  -
    2   exact                           string                                                singular  value
    3   regex                           string                                                singular  value
http_route.RequestHeaderModifier
    1   add                             http_types.Headers                                    singular  -
    2   set                             http_types.Headers                                    singular  -
    3   remove                          string                                                repeated  -
http_route.ResponseHeaderModifier
    1   add                             http_types.Headers                                    singular  -
    2   set                             http_types.Headers                                    singular  -
    3   remove                          string                                                repeated  -
http_route.RequestRedirect
    1   scheme                          http_types.Scheme                                     singular  -
    2   host                            string                                                singular  -
    3   path                            http_route.PathModifier                               singular  -
    4   port                            uint32                                                singular  -
    5   status                          uint32                                                singular  -
http_route.PathModifier
    1   full                            string                                                singular  replace
    2   prefix                          string                                                singular  replace
http_route.HttpFailureInjector
    1   status                          uint32                                                singular  -
    2   message                         string                                                singular  -
    3   ratio                           http_route.Ratio                                      singular  -
http_route.Ratio
    1   numerator                       uint32                                                singular  -
    2   denominator                     uint32                                                singular  -
http_route.Timeouts
    1   response                        google.protobuf.Duration                              singular  -
    2   request                         google.protobuf.Duration                              singular  -
    3   idle                            google.protobuf.Duration                              singular  -

# grpc_route
grpc_route.GrpcRouteMatch
    1   rpc                             grpc_route.GrpcRpcMatch                               singular  -
    2   headers                         http_route.HeaderMatch                                repeated  -
grpc_route.GrpcRpcMatch
    1   service                         string                                                singular  -
    2   method                          string                                                singular  -
grpc_route.GrpcFailureInjector
    1   code                            uint32                                                singular  -
    2   message                         string                                                singular  -
    3   ratio                           http_route.Ratio                                      singular  -

# opaque_route
opaque_route.Invalid
    1   message                         string                                                singular  -
opaque_route.Forbidden

# tls_route
tls_route.SniMatch
    1   exact                           string                                                singular  match
    2   suffix                          tls_route.SniMatch.Suffix                             singular  match
tls_route.SniMatch.Suffix
    1   reverse_labels                  string                                                repeated  -

# transport (proxy.md section 6.1; not part of linkerd2-proxy-api)
transport.l5d.io.Header
    1   port              int32                                   singular  -
    2   name              string                                  singular  -
    3   session_protocol  transport.l5d.io.SessionProtocol        singular  -
transport.l5d.io.SessionProtocol
    1   http1             transport.l5d.io.SessionProtocol.Http1  singular  kind
    2   http2             transport.l5d.io.SessionProtocol.Http2  singular  kind
transport.l5d.io.SessionProtocol.Http1
transport.l5d.io.SessionProtocol.Http2
"""

# From proxy-api.md section 1: messages per package, not counting map entries.
MESSAGES_PER_PACKAGE = {
    "destination": 29, "identity": 2, "inbound": 27, "outbound": 62, "tap": 21, "net": 4,
    "meta": 2, "http_types": 4, "http_route": 13, "grpc_route": 3, "opaque_route": 2, "tls_route": 2,
}
TOP_LEVEL_MESSAGES = 74
MAP_FIELDS = 7

ENUMS = {
    "tap.TapEvent.ProxyDirection": {"UNKNOWN": 0, "INBOUND": 1, "OUTBOUND": 2},
    "http_types.HttpMethod.Registered": {
        "GET": 0, "POST": 1, "PUT": 2, "DELETE": 3, "PATCH": 4,
        "OPTIONS": 5, "CONNECT": 6, "HEAD": 7, "TRACE": 8,
    },
    "http_types.Scheme.Registered": {"HTTP": 0, "HTTPS": 1},
}

# message -> (reserved numbers, reserved names); every other message reserves nothing.
RESERVED = {
    "destination.TlsIdentity": ({2}, {"k8s_pod_identity"}),
    "inbound.ProxyProtocol.Detect": ({2}, set()),
    "inbound.ProxyProtocol.Http1": ({1}, set()),
    "inbound.ProxyProtocol.Http2": ({1}, set()),
    "inbound.ProxyProtocol.Grpc": ({1}, set()),
    "outbound.OpaqueRoute": ({4}, set()),
    "outbound.OpaqueRoute.RouteBackend": ({2}, set()),
    "outbound.TlsRoute": ({4}, set()),
    "outbound.TlsRoute.RouteBackend": ({2}, set()),
}

_DURATION = "google/protobuf/duration.proto"
# file -> (package, imported files)
FILES = {
    "destination.proto": (
        "io.linkerd.proxy.destination",
        {_DURATION, "http_types.proto", "meta.proto", "net.proto"},
    ),
    # Upstream imports a vendored copy at google/protobuf/timestamp/timestamp.proto;
    # the standard file declares the same google.protobuf.Timestamp.
    "identity.proto": ("io.linkerd.proxy.identity", {"google/protobuf/timestamp.proto"}),
    "inbound.proto": (
        "io.linkerd.proxy.inbound",
        {_DURATION, "grpc_route.proto", "http_route.proto", "meta.proto", "net.proto"},
    ),
    "outbound.proto": (
        "io.linkerd.proxy.outbound",
        {
            _DURATION, "net.proto", "destination.proto", "meta.proto", "grpc_route.proto",
            "opaque_route.proto", "tls_route.proto", "http_route.proto",
        },
    ),
    "tap.proto": ("io.linkerd.proxy.tap", {_DURATION, "http_types.proto", "net.proto"}),
    "net.proto": ("io.linkerd.proxy.net", set()),
    "meta.proto": ("io.linkerd.proxy.meta", set()),
    "http_types.proto": ("io.linkerd.proxy.http_types", set()),
    "http_route.proto": ("io.linkerd.proxy.http_route", {_DURATION, "http_types.proto"}),
    "grpc_route.proto": ("io.linkerd.proxy.grpc_route", {"http_route.proto"}),
    "opaque_route.proto": ("io.linkerd.proxy.opaque_route", set()),
    "tls_route.proto": ("io.linkerd.proxy.tls_route", set()),
    "transport.proto": ("transport.l5d.io", set()),
}

Row = tuple[str, int, str, str, str]  # field name, number, type, label, oneof


def _full(name: str) -> str:
    return name if name.startswith(("google.", "transport.")) else f"io.linkerd.proxy.{name}"


def _parse_table() -> dict[str, set[Row]]:
    expected: dict[str, set[Row]] = {}
    message = ""
    for line in TABLE.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not line.startswith(" "):
            message = _full(line)
            assert message not in expected, f"{message} listed twice"
            expected[message] = set()
            continue
        number, name, type_, label, oneof = line.split()
        # Scalars and maps have no dot; message and enum names do.
        expected[message].add((name, int(number), _full(type_) if "." in type_ else type_, label, oneof))
    return expected


EXPECTED = _parse_table()
_SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def _walk(message: Descriptor) -> Iterator[Descriptor]:
    yield message
    for nested in message.nested_types:
        if not nested.GetOptions().map_entry:
            yield from _walk(nested)


def _files() -> list[FileDescriptor]:
    modules = [importlib.import_module(f"tether.api.{name.removesuffix('.proto')}_pb2") for name in FILES]
    return [m.DESCRIPTOR for m in modules]


def _messages() -> dict[str, Descriptor]:
    return {d.full_name: d for f in _files() for top in f.message_types_by_name.values() for d in _walk(top)}


def _type(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.full_name
    if field.enum_type is not None:
        return field.enum_type.full_name
    return _SCALARS[field.type]


def _row(field: FieldDescriptor) -> Row:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        type_ = f"map<{_type(entry.fields_by_name['key'])},{_type(entry.fields_by_name['value'])}>"
        label = "map"
    else:
        type_, label = _type(field), "repeated" if field.is_repeated else "singular"
    # A proto3 `optional` would show up here as a synthetic oneof and fail the match.
    oneof = field.containing_oneof.name if field.containing_oneof is not None else "-"
    return (field.name, field.number, type_, label, oneof)


def test_the_message_set_matches_the_table() -> None:
    actual = set(_messages())
    assert sorted(actual - set(EXPECTED)) == [], "messages generated but not in the table"
    assert sorted(set(EXPECTED) - actual) == [], "messages in the table but not generated"


@pytest.mark.parametrize("message", sorted(EXPECTED))
def test_fields_match_the_table(message: str) -> None:
    descriptor = _messages().get(message)
    assert descriptor is not None, f"{message} is not generated"
    actual = {_row(f) for f in descriptor.fields}
    assert sorted(actual - EXPECTED[message]) == [], "fields not in the table"
    assert sorted(EXPECTED[message] - actual) == [], "fields in the table but not generated"


def test_message_counts_match_upstream() -> None:
    per_package: dict[str, int] = {}
    for name in _messages():
        if name.startswith("io.linkerd.proxy."):
            package = name.split(".")[3]
            per_package[package] = per_package.get(package, 0) + 1
    assert per_package == MESSAGES_PER_PACKAGE
    linkerd = [f for f in _files() if f.package.startswith("io.linkerd.proxy.")]
    assert sum(len(f.message_types_by_name) for f in linkerd) == TOP_LEVEL_MESSAGES
    maps = [r for rows in EXPECTED.values() for r in rows if r[3] == "map"]
    assert len(maps) == MAP_FIELDS


def test_enums_match_upstream() -> None:
    actual = {}
    for f in _files():
        enums = list(f.enum_types_by_name.values())
        enums += [e for top in f.message_types_by_name.values() for m in _walk(top) for e in m.enum_types]
        actual.update({e.full_name: {v.name: v.number for v in e.values} for e in enums})
    assert actual == {_full(name): values for name, values in ENUMS.items()}


def test_reserved_numbers_and_names_match_upstream() -> None:
    actual = {}
    for name, descriptor in _messages().items():
        proto = DescriptorProto()
        descriptor.CopyToProto(proto)
        numbers = {n for r in proto.reserved_range for n in range(r.start, r.end)}
        if numbers or proto.reserved_name:
            actual[name] = (numbers, set(proto.reserved_name))
    assert actual == {_full(name): value for name, value in RESERVED.items()}


def test_files_have_upstream_packages_and_imports() -> None:
    actual = {f.name: (f.package, {d.name for d in f.dependencies}) for f in _files()}
    assert actual == FILES


def test_every_message_is_reachable_from_an_rpc_or_the_transport_header() -> None:
    """So the table above covers what the RPCs exchange and everything inside it."""
    rpcs = [rpc for f in _files() for service in f.services_by_name.values() for rpc in service.methods]
    roots = [m for rpc in rpcs for m in (rpc.input_type, rpc.output_type)]
    roots.append(_messages()["transport.l5d.io.Header"])
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        message = pending.pop()
        if message.full_name not in seen:
            seen.add(message.full_name)
            pending.extend(f.message_type for f in message.fields if f.message_type is not None)
    assert sorted(set(_messages()) - seen) == []
