"""HTTP/2 on the admin port: what a meshed client's proxy speaks to it, as linkerd2-proxy's admin server serves.

A meshed Prometheus scrapes a pod's admin port through its own proxy, which
(the destination hinting HTTP/2 for every meshed endpoint) carries its
HTTP/1 requests over HTTP/2 inside mesh TLS with ``l5d-orig-proto``; a
client may also speak HTTP/2 with prior knowledge. linkerd2-proxy's admin
server serves both (``linkerd/app/admin/src/stack.rs``: HTTP detection, or
HTTP/2 when a meshed connection sends nothing within the detect timeout),
answering in HTTP/2 without downgrading: the client's proxy turns the
response back into HTTP/1.

``Http2Server`` is fed the connection's bytes and writes to its transport
(``codec.http2.H2Endpoint``: framing, HPACK, flow control), adding what it
writes to the connection's transport metric counts. Its SETTINGS are
``params``: the inbound server's (``LINKERD2_PROXY_INBOUND_SERVER_HTTP2_*``),
as linkerd2-proxy's admin server takes them. Each request is
read whole (its body at most ``MAX_BODY``: beyond, the stream is reset with
``REFUSED_STREAM``), handed to ``answer`` (``io.admin``: the port's policy,
then the endpoint) as the HTTP/1 server hands its requests, and answered in
one go; a body larger than the client's windows waits in the codec and goes
out as they reopen.

Caller: ``io.admin``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tether.proxy.codec import http2_events as h2e
from tether.proxy.codec.http2 import DEFAULT_PARAMS, H2Endpoint, H2ProtocolError, Headers, Http2Params
from tether.proxy.core.metrics import Counted

log = logging.getLogger(__name__)

# (method, :path, headers with host from :authority, body) -> (status, headers, body), headers lower-case.
Answer = Callable[[str, str, dict[str, str], bytes], tuple[int, list[tuple[str, str]], bytes]]


class Http2Server:
    """One HTTP/2 connection on the admin port."""

    def __init__(self, transport: asyncio.Transport, answer: Answer, max_body: int, counted: Counted,
                 params: Http2Params = DEFAULT_PARAMS) -> None:
        self._transport = transport
        self._counted = counted  # the connection's transport metric counts: what is written adds to tx
        self._answer = answer
        self._max_body = max_body
        self._h2 = H2Endpoint(client=False, params=params)
        self._requests: dict[int, tuple[Headers, bytearray]] = {}
        self._h2.initiate()
        self._send()

    def received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except H2ProtocolError as exc:
            log.debug("admin: HTTP/2 connection error: %s", exc)
            self._send()
            self._transport.close()
            return
        for event in events:
            if isinstance(event, h2e.RequestReceived):
                self._requests[event.stream_id] = (event.headers, bytearray())
                if event.stream_ended is not None:
                    self._respond(event.stream_id)
            elif isinstance(event, h2e.DataReceived):
                self._h2.ack(event.stream_id, event.flow_controlled_length)
                request = self._requests.get(event.stream_id)
                if request is not None:
                    request[1].extend(event.data)
                    if len(request[1]) > self._max_body:
                        del self._requests[event.stream_id]
                        self._h2.reset(event.stream_id, h2e.ErrorCodes.REFUSED_STREAM)
                    elif event.stream_ended is not None:
                        self._respond(event.stream_id)
            elif isinstance(event, h2e.TrailersReceived):
                if event.stream_id in self._requests:
                    self._respond(event.stream_id)
            elif isinstance(event, h2e.StreamReset):
                self._requests.pop(event.stream_id, None)
            elif isinstance(event, h2e.GoAway):
                self._h2.goaway()
        self._h2.flush()
        self._send()

    def _respond(self, stream_id: int) -> None:
        headers, body = self._requests.pop(stream_id)
        pseudo = {name: value for name, value in headers if name[:1] == b":"}
        fields: dict[str, str] = {}
        for name, value in headers:
            if name[:1] != b":":
                key, text = name.decode("latin-1"), value.decode("latin-1")
                fields[key] = f"{fields[key]}, {text}" if key in fields else text
        if b":authority" in pseudo:
            fields.setdefault("host", pseudo[b":authority"].decode("latin-1"))
        status, extra, payload = self._answer(pseudo.get(b":method", b"GET").decode("latin-1"),
                                              pseudo.get(b":path", b"/").decode("latin-1"), fields, bytes(body))
        response = [(b":status", str(status).encode()), (b"content-length", str(len(payload)).encode()),
                    *((name.encode("latin-1"), value.encode("latin-1")) for name, value in extra)]
        if not payload:
            self._h2.send_headers(stream_id, response, end_stream=True)
            return
        self._h2.send_headers(stream_id, response)
        self._h2.queue_data(stream_id, payload)
        self._h2.queue_end(stream_id)

    def _send(self) -> None:
        out = self._h2.data_to_send()
        if out and not self._transport.is_closing():
            self._transport.write(out)
            self._counted.tx += len(out)

    def closed(self) -> None:
        """The client closed its side: nothing more will come."""
        self._requests.clear()
        self._transport.close()
