"""Two tapped "pods" for tap's tests: Pod objects at 127.0.0.2 and 127.0.0.3, each a real proxy tap server.

Each presents its pod's identity from a throwaway PKI; ``TapLab`` runs them
and a ``TapController`` (presenting the tap identity) and its gRPC server on
one event loop in a thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc

from tether.api import viz_tap_pb2_grpc
from tether.proxy.core.tap import INBOUND, TapRequest, Taps
from tether.proxy.io.tap_server import TapServer
from tether.viz.metrics_api import Mesh
from tether.viz.tap import TapController, TapCredentials, TapService
from viz.pkilab import Pki, server_context
from viz.promlab import Objects, deployment, free_port, meshed_pod

NS = "emojivoto"
TAP_ENV = {"name": "LINKERD2_PROXY_TAP_SVC_NAME",
           "value": "tap.linkerd-viz.serviceaccount.identity.linkerd.cluster.local"}


def _tappable(name: str, ip: str) -> dict[str, Any]:
    pod = meshed_pod(name, NS, "web", 4191, ip=ip, service_account="web")
    pod["spec"]["initContainers"][1]["env"] = [TAP_ENV]
    return pod


def _objects() -> Objects:
    plain = meshed_pod("emoji-5d8f7c9b4-aaaaa", NS, "emoji", 4191, ip="127.0.0.4")
    unmeshed = meshed_pod("voting-5d8f7c9b4-bbbbb", NS, "voting", 4191, ip="127.0.0.5")
    del unmeshed["metadata"]["labels"]["linkerd.io/control-plane-ns"]
    disabled = _tappable("emoji-5d8f7c9b4-ccccc", "127.0.0.6")
    disabled["metadata"]["labels"]["app"] = "emoji"
    disabled["metadata"]["labels"]["linkerd.io/proxy-deployment"] = "emoji"
    disabled["metadata"]["ownerReferences"][0]["name"] = "emoji-5d8f7c9b4"
    disabled["metadata"]["annotations"] = {"viz.linkerd.io/disable-tap": "true"}
    return Objects([deployment("web", NS), deployment("emoji", NS), deployment("voting", NS),
                    _tappable("web-5d8f7c9b4-abcde", "127.0.0.2"), _tappable("web-5d8f7c9b4-fghij", "127.0.0.3"),
                    plain, unmeshed, disabled])


class TapLab:
    """Two tapped "pods" and the controller's gRPC server, on one event loop in a thread."""

    def __init__(self) -> None:
        self.pki = Pki()
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.taps = {ip: Taps(base=i) for i, ip in enumerate(("127.0.0.2", "127.0.0.3"), 1)}
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        _, key, chain = self.pki.leaf("web", NS)
        tap_id, tap_key, tap_chain = self.pki.leaf("tap", "linkerd-viz")
        self.proxies = []
        for ip, taps in self.taps.items():
            server = TapServer(taps, tap_id, lambda: server_context(key, chain, self.pki.anchors_pem))
            await server.start(ip, self.port)
            self.proxies.append(server)
        self.controller = controller = TapController(_objects(), Mesh(), TapCredentials(tap_key, tap_chain, self.pki.anchors_pem),
                                   tap_port=self.port)
        self.grpc = grpc.aio.server()
        viz_tap_pb2_grpc.add_TapServicer_to_server(TapService(controller), self.grpc)
        self.address = f"127.0.0.1:{self.grpc.add_insecure_port('127.0.0.1:0')}"
        await self.grpc.start()

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def serve_requests(self, paths: list[str]) -> None:
        """Once both pods have a tap open, each "serves" the paths (as its HTTP layer would report them)."""
        for proxy in self.proxies:
            await proxy.wait_for_taps(1)
        now = self.loop.time()
        for ip, taps in self.taps.items():
            for path in paths:
                stream = taps.begin(TapRequest(INBOUND, ("10.0.0.1", 5000), (ip, 8080), "GET", "http",
                                               "web.emojivoto.svc.cluster.local:80", path,
                                               source_labels={"tls": "true"}), now)
                if stream is not None:
                    stream.response_init(200, [], now + 0.001)
                    stream.response_end(now + 0.002, response_bytes=3)

    @staticmethod
    async def until_no_taps(proxy: TapServer) -> None:
        """Until ``proxy`` has no tap open (its clients went away)."""
        await proxy.wait_for_no_taps()

    def close(self) -> None:
        async def stop() -> None:
            await self.grpc.stop(0)
            for proxy in self.proxies:
                await proxy.stop()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


