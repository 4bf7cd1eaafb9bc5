"""One port-forward stream through the API server: a WebSocket to ``pods/NAME/portforward?ports=PORT``.

Kubernetes' WebSocket port-forward protocol (subprotocol ``v4.channel.k8s.io``):
every binary message starts with a channel byte — channel 0 carries the port's
data, channel 1 its errors — and the server's first message on each channel is
the port number (two bytes, little-endian), not data.  Data the client sends is
prefixed with channel 0.  An error-channel message (e.g. nothing listens on the
port in the pod) ends the stream as ``PortForwardError``.

This module is the only part of the forward that kmock cannot exercise (it
speaks neither SPDY nor this WebSocket protocol); ``portforward`` takes any
``Tunnel`` and is tested with a loopback stand-in, this framing against a mock
API server that speaks it (``tests/k8s/test_tunnel.py``) — not yet against a
real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from tether.platform.kubernetes.client import ApiUnreachable, ClientSettings, load_configuration
from tether.platform.kubernetes.portforward import PortForwardError

_DATA, _ERROR = 0, 1
PROTOCOL = "v4.channel.k8s.io"


class WebSocketTunnel:
    """A ``portforward.Tunnel`` over one WebSocket; opened by ``open_tunnel``."""

    def __init__(self, api: Any, ws: aiohttp.ClientWebSocketResponse, where: str) -> None:
        self._api = api
        self._ws = ws
        self._where = where
        self._port_seen = {_DATA: False, _ERROR: False}

    async def read(self) -> bytes:
        while True:
            message = await self._ws.receive()
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return b""
            if message.type is aiohttp.WSMsgType.ERROR:
                raise ApiUnreachable(f"port-forward to {self._where}: {self._ws.exception()}")
            if message.type is not aiohttp.WSMsgType.BINARY or not message.data:
                continue
            channel, payload = message.data[0], message.data[1:]
            if channel not in self._port_seen:
                continue
            if not self._port_seen[channel]:
                self._port_seen[channel] = True  # the first message of a channel is its port number
                payload = payload[2:]
            if channel == _ERROR and payload:
                raise PortForwardError(f"port-forward to {self._where}: {payload.decode(errors='replace')}")
            if channel == _DATA and payload:
                return bytes(payload)

    async def write(self, data: bytes) -> None:
        await self._ws.send_bytes(bytes([_DATA]) + data)

    async def close(self) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
            await self._ws.close()
        await self._api.close()


async def open_tunnel(settings: ClientSettings, namespace: str, pod: str, port: int) -> WebSocketTunnel:
    """A WebSocket port-forward to ``port`` of ``namespace/pod`` with the kubeconfig's credentials."""
    from kubernetes_asyncio.stream import WsApiClient

    where = f"pod {namespace}/{pod}:{port}"
    api = WsApiClient(await load_configuration(settings))
    try:
        connecting = await api.call_api(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/portforward", "GET", query_params=[("ports", str(port))],
            header_params={"sec-websocket-protocol": PROTOCOL}, auth_settings=["BearerToken"],
            _preload_content=False,
        )
        ws = await connecting
    except aiohttp.WSServerHandshakeError as exc:
        await api.close()
        hint = " (the kubeconfig's user needs get and create on pods/portforward)" if exc.status == 403 else ""
        raise PortForwardError(f"port-forward to {where}: the API server answered {exc.status}{hint}") from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        await api.close()
        raise ApiUnreachable(f"port-forward to {where}: {exc or type(exc).__name__}") from None
    return WebSocketTunnel(api, ws, where)
