"""kmock set-ups shared by the Kubernetes tests: an emulated API server, kubeconfigs pointing at it.

``emulated_api`` runs kmock's ``KubernetesEmulator`` on the test's own event loop;
``ThreadedApi`` runs one on a loop in a thread of its own, for code under test that
blocks its caller's loop while it waits for the API (the synchronous token seam).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from tether.platform.kubernetes.client import ClientSettings

T = TypeVar("T")

PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
NAMESPACES = kmock.resource("", "v1", "namespaces")
TOKEN_REVIEWS = kmock.resource("authentication.k8s.io", "v1", "tokenreviews")


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus the cluster-scoped Namespace collection it cannot parse (kmock 0.8).

    kmock reads ``/api/v1/namespaces/<x>`` as "namespace x", so a request for the
    Namespace collection itself fails inside kmock before any reaction can answer.
    Those two requests (list and watch) are answered here from ``namespaces``, as a
    recorded API response would: the list as the API server shapes it (held while
    ``namespace_gate`` is clear), the watch held open, streaming what `put_namespace`
    changes (``kubectl annotate ns``) to every watch open at the time.
    """

    namespaces: list[dict[str, Any]]

    async def __call__(self, raw_request: Any) -> Any:
        if raw_request.path.rstrip("/") != "/api/v1/namespaces" or raw_request.method != "GET":
            return await super().__call__(raw_request)
        from aiohttp import web

        self.namespace_requests.append(dict(raw_request.query))
        if raw_request.query.get("watch") != "true":
            await self.namespace_gate.wait()
            return web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                      "metadata": {"resourceVersion": "1"}, "items": self.namespaces})
        response = web.StreamResponse()
        await response.prepare(raw_request)
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.namespace_watches.append(events)
        try:
            while True:  # cancelled when the client goes away
                event = await events.get()
                await response.write((json.dumps(event) + "\n").encode())
        finally:
            self.namespace_watches.remove(events)

    def put_namespace(self, namespace: dict[str, Any]) -> None:
        """Create or replace a Namespace and tell the open watches (a new resourceVersion each time)."""
        self.namespace_version += 1
        namespace = {**namespace, "metadata": {**namespace["metadata"], "resourceVersion": str(self.namespace_version)}}
        name = namespace["metadata"]["name"]
        existed = any(ns["metadata"]["name"] == name for ns in self.namespaces)
        self.namespaces[:] = [ns for ns in self.namespaces if ns["metadata"]["name"] != name] + [namespace]
        for events in self.namespace_watches:
            events.put_nowait({"type": "MODIFIED" if existed else "ADDED", "object": namespace})


def new_emulator() -> Emulator:
    api = Emulator()
    api.namespaces = []
    api.namespace_requests = []
    api.namespace_watches = []
    api.namespace_version = 1
    api.namespace_gate = asyncio.Event()
    api.namespace_gate.set()
    return api


def write_kubeconfig(path: Path, server: str, token: str = "test-token") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": server.rstrip("/")}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
        "current-context": "kmock",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def emulated_api(
    tmp_path: Path, cls: type[kmock.KubernetesScaffold] = kmock.KubernetesEmulator, **server: Any
) -> AsyncIterator[tuple[Any, kmock.Server, ClientSettings]]:
    """kmock on a local port and a kubeconfig for it.

    ``cls`` is kmock's stateful ``KubernetesEmulator`` by default; the stateless
    ``KubernetesScaffold`` suits TokenReviews (the emulator stores every created
    object by name, and TokenReviews have none).
    """
    async with (new_emulator() if cls is kmock.KubernetesEmulator else cls()) as api, kmock.Server(api, **server) as srv:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(srv.url))
        yield api, srv, ClientSettings(kubeconfig=kubeconfig)


def pod(name: str, namespace: str = "default", version: str | None = None, **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if version is not None:
        metadata["resourceVersion"] = version
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, **extra}


def listing(version: str, *items: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": version}
    if token:
        metadata["continue"] = token
    return {"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": list(items)}


def status(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}


async def hold() -> None:
    """A watch stream's tail that stays open (the test ends it by closing the watch)."""
    await asyncio.sleep(3600)


async def take(events: AsyncIterator[T], count: int, timeout: float = 10.0) -> list[T]:
    out = []
    for _ in range(count):
        out.append(await asyncio.wait_for(anext(events), timeout))
    return out


class ThreadedApi:
    """A kmock emulator on its own loop thread; ``call`` runs a coroutine function there."""

    def __init__(self, tmp_path: Path, cls: type[kmock.KubernetesScaffold] = kmock.KubernetesEmulator) -> None:
        self._tmp_path = tmp_path
        self._cls = cls
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kmock", daemon=True)
        self._stack = contextlib.AsyncExitStack()
        self.api: kmock.KubernetesEmulator
        self.server: kmock.Server
        self.settings: ClientSettings

    def __enter__(self) -> ThreadedApi:
        self._thread.start()
        self.call(self._start)
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._stack.aclose)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self.api, self.server, self.settings = await self._stack.enter_async_context(emulated_api(self._tmp_path, self._cls))

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)


async def watching(api: kmock.KubernetesEmulator, count: int = 1, timeout: float = 10.0) -> None:
    """Wait until ``count`` watch requests reached kmock, and a moment more for the stream to subscribe.

    kmock's emulator keeps no history by resource version: a change made before the
    watch request arrives would be folded into the watch's initial replay.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while len(api["watch"]) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"fewer than {count} watch requests arrived")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)


API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


class FakeAuthenticator:
    """Answers TokenReviews as an API server's service-account authenticator does, for known tokens.

    ``tokens`` maps a token to (username, its audiences, pod name).  A review naming
    audiences the token lacks fails with the API server's "token audiences ... is
    invalid" error; a review naming none checks against the API server's own audience.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, tuple[str, list[str], str]] = {}

    def add(self, token: str, username: str, audiences: list[str], pod: str = "") -> None:
        self.tokens[token] = (username, audiences, pod)

    def __call__(self, request: Any) -> dict[str, Any]:
        spec = (request.data or {}).get("spec") or {}
        wanted = spec.get("audiences") or [API_AUDIENCE]
        known = self.tokens.get(spec.get("token", ""))
        review: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                  "metadata": {"creationTimestamp": None}, "spec": spec}
        if known is None:
            review["status"] = {"user": {}, "error": "[invalid bearer token, service account token is not valid]"}
            return review
        username, audiences, pod = known
        common = [a for a in wanted if a in audiences]
        if not common:
            review["status"] = {"user": {}, "error": f"[invalid bearer token, token audiences {audiences} is invalid "
                                                    f"for the target audiences {wanted}]"}
            return review
        user: dict[str, Any] = {"username": username, "uid": "0000", "groups": ["system:serviceaccounts"]}
        if pod:
            user["extra"] = {"authentication.kubernetes.io/pod-name": [pod],
                             "authentication.kubernetes.io/pod-uid": ["1111"]}
        review["status"] = {"authenticated": True, "user": user, "audiences": common}
        return review
