"""The request-level proxy: HTTP/1 requests and HTTP/2 streams routed one by one (proxy.md §7, §9.2).

- ``commands``: what the HTTP layer asks the driver to do (read and write the
  client's connection, check a pooled upstream connection out and in, tunnel
  after a protocol switch).
- ``layer``: the HTTP/1 layer itself, a generator over those commands, for
  both directions; it parses with ``tether.proxy.protocol.http1``.
- ``h2``: the HTTP/2 layer: every stream of a connection routed on its own,
  multiplexed upstream; it speaks HTTP/2 with ``tether.proxy.protocol.http2``.
- ``errors``: the responses the proxy synthesizes (502/503/504..., gRPC statuses).
- ``metrics``: ``request_total``, ``response_total``, ``response_latency_ms``.
- ``pool``: the driver's per-endpoint pool of idle upstream connections.
"""
