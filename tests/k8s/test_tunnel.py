"""The port-forward tunnel's WebSocket framing, against a stand-in API server that speaks it.

kmock has no port-forward, so this mock of the API server (an aiohttp WebSocket
endpoint at ``pods/NAME/portforward``) plays the kubelet's side of
``v4.channel.k8s.io`` as Kubernetes documents it: the port number (two bytes,
little-endian) as the first message of the data and error channels, then data
on channel 0 and errors on channel 1.  It echoes data upper-cased, so the test
sees bytes go through the loopback forward, the tunnel and back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web

from tether.platform.kubernetes.client import ClientSettings
from tether.platform.kubernetes.portforward import PortForwardError, forwarded
from tether.platform.kubernetes.tunnel import PROTOCOL, open_tunnel

from .kube_helpers import write_kubeconfig


@asynccontextmanager
async def api_server(tmp_path: Path, seen: list[dict[str, str]]) -> AsyncIterator[ClientSettings]:
    async def portforward(request: web.Request) -> web.StreamResponse:
        pod = request.match_info["pod"]
        seen.append({"pod": pod, "ports": request.query.get("ports", ""),
                     "authorization": request.headers.get("Authorization", "")})
        if pod == "forbidden":
            return web.Response(status=403, text="pods/portforward is forbidden")
        ws = web.WebSocketResponse(protocols=(PROTOCOL,))
        await ws.prepare(request)
        seen[-1]["protocol"] = ws.ws_protocol or ""
        port = int(request.query["ports"]).to_bytes(2, "little")
        await ws.send_bytes(b"\x00" + port)
        await ws.send_bytes(b"\x01" + port)
        if pod == "nothing-listens":
            await ws.send_bytes(b"\x01an error occurred forwarding 8086 -> 8086: connection refused")
            await ws.close()
            return ws
        async for message in ws:
            if message.type is WSMsgType.BINARY and message.data[:1] == b"\x00":
                await ws.send_bytes(b"\x00" + message.data[1:].upper())
        return ws

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/portforward", portforward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield ClientSettings(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"))
    finally:
        await runner.cleanup()


async def test_bytes_go_through_the_forward_and_the_tunnel_and_back(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    async with api_server(tmp_path, seen) as settings:
        async with forwarded(lambda: open_tunnel(settings, "linkerd", "linkerd-destination-1", 8086)) as forward:
            host, port = forward.addr.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"hello")
            await writer.drain()
            assert await reader.readexactly(5) == b"HELLO"  # the port frames were not taken for data
            writer.write(b"again")
            assert await reader.readexactly(5) == b"AGAIN"
            writer.close()
        assert seen == [{"pod": "linkerd-destination-1", "ports": "8086", "authorization": "Bearer test-token",
                         "protocol": PROTOCOL}]
        assert forward.failures == []


async def test_an_error_channel_message_and_a_refusal_are_port_forward_errors(tmp_path: Path) -> None:
    async with api_server(tmp_path, []) as settings:
        tunnel = await open_tunnel(settings, "linkerd", "nothing-listens", 8086)
        with pytest.raises(PortForwardError, match="connection refused"):
            await tunnel.read()
        await tunnel.close()
        with pytest.raises(PortForwardError, match="403"):
            await open_tunnel(settings, "linkerd", "forbidden", 8086)

        async with forwarded(lambda: open_tunnel(settings, "linkerd", "forbidden", 8086)) as forward:
            host, port = forward.addr.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            assert await reader.read() == b""  # the local connection is closed ...
            writer.close()
        assert [str(f) for f in forward.failures] == [  # ... and the forward says why
            "port-forward to pod linkerd/forbidden:8086: the API server answered 403 "
            "(the kubeconfig's user needs get and create on pods/portforward)"]
