"""The proxy's sans-IO protocol code: bytes in, typed events out, no sockets.

Each module here is a pure parser or state machine in the shape of h11/h2: it is
fed bytes with ``receive_data(data)`` (``b""`` means EOF) and answers
``NEED_DATA``, a typed event, or a typed error saying whose fault it was
(``common``). Nothing here imports asyncio, uvloop, socket or ssl; the proxy's
I/O layers own the sockets, the timers and the buffers, and call in here.

- ``common``: the ``NEED_DATA`` sentinel and the Local/Remote error split.
- ``client_hello``: incremental TLS ClientHello parser (SNI, ALPN).
- ``request_line``: Linkerd's "does this start like an HTTP/1 request" rule.
- ``detect``: protocol detection on a new connection (TLS, HTTP/1, HTTP/2, opaque).
- ``transport_header``: the opaque-transport header codec (``transport.l5d.io/v1``).
- ``http1``: an HTTP/1.1 connection for either role (framing, keep-alive, upgrades).
- ``http2``: one end of an HTTP/2 connection (h2's state machine, with per-stream
  send buffers flushed within the windows and GOAWAY reported without closing).
"""
