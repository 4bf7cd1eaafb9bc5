"""A small async client for the Kubernetes API: raw JSON in and out, typed errors, lazy connection.

The watch (``tether.platform.kubernetes.watch``) and the TokenReview verifier
(``tether.platform.kubernetes.tokens``) call ``KubeClient``; nothing else here knows
HTTP.  Configuration and authentication come from ``kubernetes_asyncio``'s loaders:
in-cluster (the pod's service-account token, refreshed as the kubelet rotates it)
or a kubeconfig file (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``),
with its context.  Objects stay plain JSON mappings, as the platform seam hands them on;
no generated models are built.

The HTTP session belongs to the event loop that opened it: ``open`` (or the first
request) must run on the loop that will use the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

log = logging.getLogger(__name__)

JSON = dict[str, Any]

JSON_TYPE = "application/json"
# What client-go's metadata client asks for (Linkerd's metadata informers use it), less the protobuf
# alternatives: objects as ``meta.k8s.io/v1`` PartialObjectMetadata, their metadata only, else whole
# (a server that cannot convert answers with the plain JSON the last choice allows).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How to reach the API server.

    ``kubeconfig`` None with ``in_cluster`` None means: in-cluster when running in a pod
    (``KUBERNETES_SERVICE_HOST`` set and a service-account token mounted), else the
    default kubeconfig.  ``context`` picks a kubeconfig context (default: the current one).
    """

    kubeconfig: Path | None = None
    context: str | None = None
    in_cluster: bool | None = None
    request_timeout: float = 30.0  # seconds, for every request but watches
    connect_timeout: float = 10.0


class KubeError(Exception):
    """Talking to the API server failed."""


class ConfigError(KubeError):
    """No usable cluster configuration (no kubeconfig, not in a pod, bad context)."""


class ApiUnreachable(KubeError):
    """The connection failed or timed out, or the server went away mid-response."""


class ApiError(KubeError):
    """The server answered with an error status (``status`` is the HTTP code, ``reason`` Kubernetes' reason)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, status_object: Mapping[str, Any], http_status: int | None = None) -> ApiError:
        """From a ``Status`` object (an error body, or the object of a watch ``ERROR`` event)."""
        code = status_object.get("code")
        status = code if isinstance(code, int) else (http_status or 500)
        reason = str(status_object.get("reason") or "")
        message = str(status_object.get("message") or "")
        return ResourceGone(status, reason, message) if status == 410 else cls(status, reason, message)


class ResourceGone(ApiError):
    """410 Gone: the resource version asked for is older than the server's history (or a continue token expired)."""


class StreamRefused(ApiError):
    """A streaming POST answered with an error status; ``headers`` and ``body`` are kept whole, since an aggregated
    API (the tap APIService) says why in its own format. ``reason`` and ``message`` are a Kubernetes ``Status``'s,
    when the body is one."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str], body: bytes) -> None:
        message = ""
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("kind") == "Status":
                message = str(doc.get("message") or "")
                reason = str(doc.get("reason") or reason)
        except ValueError:
            pass
        super().__init__(status, reason, message)
        self.headers = headers
        self.body = body


async def load_configuration(settings: ClientSettings) -> k8s_client.Configuration:
    """The ``kubernetes_asyncio`` configuration ``settings`` select; ``ConfigError`` when there is none."""
    configuration = k8s_client.Configuration()
    try:
        if settings.kubeconfig is None and settings.in_cluster is not False:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
                log.info("using the in-cluster Kubernetes configuration")
                return configuration
            except k8s_config.ConfigException:
                if settings.in_cluster:
                    raise
        config_file = str(settings.kubeconfig) if settings.kubeconfig is not None else None
        await k8s_config.load_kube_config(
            config_file=config_file, context=settings.context, client_configuration=configuration,
            persist_config=False,
        )
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"no usable Kubernetes configuration: {exc}") from None
    log.info("using Kubernetes API server %s", configuration.host)
    return configuration


class KubeClient:
    """Raw JSON requests to one API server; opened lazily on the running loop, closed by ``close``."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        self.settings = settings or ClientSettings()
        self._api: k8s_client.ApiClient | None = None
        self._opening: asyncio.Lock | None = None

    async def open(self) -> None:
        if self._api is not None:
            return
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._api is None:
                configuration = await load_configuration(self.settings)
                self._api = k8s_client.ApiClient(configuration)
                self._api.user_agent = "tether"

    async def close(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            await api.close()

    @property
    def host(self) -> str | None:
        return self._api.configuration.host if self._api is not None else None

    async def get(self, path: str, params: Mapping[str, Any] | None = None, *, accept: str = JSON_TYPE) -> JSON:
        """A GET answered with JSON; ``accept`` may ask for another representation (``METADATA_LIST``)."""
        return await self._json("GET", path, params, None, accept=accept)

    async def get_text(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        """A GET answered with text, e.g. a pod's ``/metrics`` through the ``pods/proxy`` subresource."""
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout, sock_connect=self.settings.connect_timeout)
        response = await self._request("GET", path, params, None, timeout, accept="text/plain, */*")
        try:
            await _raise_for_status(response)
            try:
                return await response.text()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError) as exc:
                raise ApiUnreachable(f"GET {path}: {_describe(exc)}") from None
        finally:
            response.release()

    async def post(self, path: str, body: Mapping[str, Any]) -> JSON:
        return await self._json("POST", path, None, body)

    async def merge_patch(self, path: str, body: Mapping[str, Any], *, field_manager: str | None = None) -> JSON:
        """A JSON merge patch (RFC 7386: lists are replaced whole); a ``metadata.resourceVersion`` in it is a
        precondition; ``field_manager`` names the writer in the object's ``managedFields``."""
        params = None if field_manager is None else {"fieldManager": field_manager}
        return await self._json("PATCH", path, params, body, content_type="application/merge-patch+json")

    async def delete(self, path: str) -> JSON:
        return await self._json("DELETE", path, None, None)

    async def stream(
        self, path: str, params: Mapping[str, Any], *, read_timeout: float, accept: str = JSON_TYPE
    ) -> AsyncIterator[JSON]:
        """The JSON lines of a streaming GET (a watch, its objects as ``accept`` asks); ends when the server ends it.

        ``read_timeout`` bounds the silence between two lines (bookmarks keep a healthy
        watch talking).  A broken connection raises ``ApiUnreachable``, an error status
        ``ApiError``.
        """
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.settings.connect_timeout, sock_connect=self.settings.connect_timeout,
            sock_read=read_timeout,
        )
        response = await self._request("GET", path, params, None, timeout, accept=accept)
        try:
            await _raise_for_status(response)
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    raise ApiUnreachable(f"watch {path}: {_describe(exc)}") from None
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ApiUnreachable(f"watch {path}: not a JSON line: {line[:80]!r}") from None
                if isinstance(event, dict):
                    yield event
        finally:
            response.close()  # an unfinished stream cannot go back to the pool

    async def post_stream(self, path: str, body: bytes, *, content_type: str) -> AsyncIterator[bytes]:
        """The answer to a POST of ``body``, chunk by chunk as it arrives, until the server ends it (an aggregated
        API's stream, e.g. the tap APIService's frames). An error status raises ``StreamRefused``."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.settings.connect_timeout,
                                        sock_connect=self.settings.connect_timeout)
        response = await self._request("POST", path, None, body, timeout, accept=content_type,
                                       content_type=content_type)
        try:
            if not 200 <= response.status < 300:
                try:
                    data = await response.read()
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    data = b""
                raise StreamRefused(response.status, response.reason or "", dict(response.headers), data)
            while True:
                try:
                    chunk = await response.content.readany()
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    raise ApiUnreachable(f"POST {path}: {_describe(exc)}") from None
                if not chunk:
                    return
                yield chunk
        finally:
            response.close()  # an unfinished stream cannot go back to the pool

    async def _json(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, *,
        content_type: str = JSON_TYPE, accept: str = JSON_TYPE,
    ) -> JSON:
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout, sock_connect=self.settings.connect_timeout)
        response = await self._request(method, path, params, body, timeout, accept=accept, content_type=content_type)
        try:
            await _raise_for_status(response)
            try:
                data = await response.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise ApiUnreachable(f"{method} {path}: {_describe(exc)}") from None
            except ValueError:
                raise ApiError(response.status, "BadResponse", "the response is not JSON") from None
        finally:
            response.release()
        if not isinstance(data, dict):
            raise ApiError(response.status, "BadResponse", "the response is not a JSON object")
        return data

    async def _request(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, timeout: aiohttp.ClientTimeout,
        accept: str = JSON_TYPE, content_type: str = JSON_TYPE,
    ) -> aiohttp.ClientResponse:
        await self.open()
        assert self._api is not None
        query = [(k, _param(v)) for k, v in (params or {}).items() if v is not None]
        try:
            return await self._api.call_api(
                path, method, query_params=query, body=body,
                header_params={"Accept": accept, "Content-Type": content_type},
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ApiUnreachable(f"{method} {path}: {_describe(exc)}") from None


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if 200 <= response.status < 300:
        return
    try:
        body = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        raise ApiError.from_status(body, response.status)
    error = ApiError(response.status, response.reason or "", "")
    raise ResourceGone(error.status, error.reason, "") if response.status == 410 else error


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
