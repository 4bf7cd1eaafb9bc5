"""The tap APIService's HTTPS server: the API server's proxied tap requests, authorized, streamed from the tap controller.

It is meant to run on 8089 behind the ``v1alpha1.tap.linkerd.io``
APIService (not yet started by any command: the tap server's Deployment on
Kubernetes, which also needs the tap identity's credentials, is still to
come).  TLS 1.2+ with the
tap server's certificate; the client must present a certificate signed by
the front-proxy CA of ``kube-system/extension-apiserver-authentication`` --
required, not only checked when given as Linkerd's is: the user headers are
believed from the API server alone.  Then, for ``POST <route>/tap``:

1. the certificate's names against ``requestheader-allowed-names`` and the user from the headers (401);
2. a SubjectAccessReview to the API server for ``watch`` on ``<type>s/tap`` (403 naming the user);
3. the body, a ``TapByResourceRequest``, must name the path's resource (400);
4. the controller's plan (its objects are read off the loop): a resource with no tappable pod is 404
   naming each pod and why, with Linkerd's ``linkerd-error`` header;
5. the events, each framed as Linkerd's protohttp does, until the client goes away.

``GET /apis``, ``/apis/tap.linkerd.io`` and ``/apis/tap.linkerd.io/v1alpha1``
answer the discovery documents the API server and ``kubectl api-resources``
ask for.

Callers: ``tether.cli.viz``; tests.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web

from tether.api import viz_tap_pb2
from tether.platform.kubernetes.client import KubeClient, KubeError
from tether.viz import tap_apiservice as rules
from tether.viz.tap import TapController, TapError

log = logging.getLogger(__name__)

DEFAULT_PORT = 8089
MAX_BODY = 1024 * 1024
_GROUP_VERSION = {"groupVersion": f"{rules.GROUP}/{rules.VERSION}", "version": rules.VERSION}
_GROUP = {"name": rules.GROUP, "versions": [_GROUP_VERSION], "preferredVersion": _GROUP_VERSION}


def tls_context(cert: Path, key: Path, client_ca_pem: str) -> ssl.SSLContext:
    """Serve ``cert``; require a client certificate signed by ``client_ca_pem`` (the front-proxy CA)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=client_ca_pem)
    return context


async def load_auth(kube: KubeClient) -> rules.RequestHeaderAuth:
    """The front-proxy settings; `KubeError` or `ValueError` naming the ConfigMap when unusable."""
    return rules.RequestHeaderAuth.from_configmap(await kube.get(rules.CONFIGMAP))


def _peer_names(request: web.Request) -> list[str]:
    cert = request.transport.get_extra_info("peercert") if request.transport else None
    if not cert:
        return []
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names + [value for _, value in cert.get("subjectAltName", ())]


def _error(err: rules.ApiServiceError | TapError, status: int) -> web.Response:
    """Linkerd's protohttp error: the status text in ``linkerd-error``, the message framed in the body."""
    return web.Response(status=status, body=rules.error_body(str(err)), content_type=rules.CONTENT_TYPE,
                        headers={rules.ERROR_HEADER: HTTPStatus(status).phrase})


_TAP_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400}


class TapApiService:
    def __init__(self, kube: KubeClient, auth: rules.RequestHeaderAuth, controller: TapController) -> None:
        self._kube = kube
        self._auth = auth
        self._controller = controller

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/apis", self._json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [_GROUP]}))
        app.router.add_get(f"/apis/{rules.GROUP}", self._json({"kind": "APIGroup", "apiVersion": "v1", **_GROUP}))
        app.router.add_get(f"/apis/{rules.GROUP}/{rules.VERSION}", self._json(_resource_list()))
        app.router.add_post("/{tail:.*}", self._tap)
        return app

    @staticmethod
    def _json(doc: dict[str, Any]) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(doc)
        return handler

    async def _authorize(self, request: web.Request) -> rules.Route:
        route = rules.parse_route(request.path)
        user = self._auth.user(_peer_names(request), request.headers)
        try:
            answer = await self._kube.post("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                           rules.access_review(route, user))
        except KubeError as err:
            raise rules.Forbidden(f"tap authorization failed: the SubjectAccessReview failed: {err}") from None
        rules.review_verdict(route, user, answer)
        log.info("tap of %s/%s in %s by %s", route.resource, route.name, route.namespace, user.name)
        return route

    async def _tap(self, request: web.Request) -> web.StreamResponse:
        try:
            await self._authorize(request)
            tap_request = viz_tap_pb2.TapByResourceRequest()
            try:
                tap_request.ParseFromString(await request.read())
            except Exception as err:  # protobuf's DecodeError; the body is the caller's
                raise rules.ApiServiceError(f"the body is not a TapByResourceRequest: {err}") from None
            if rules.expected_path(tap_request) != request.path:
                raise rules.ApiServiceError(f"tap request body did not match APIServer URL: "
                                            f"{rules.expected_path(tap_request)!r} != {request.path!r}")
            pods, observe = await asyncio.to_thread(self._controller.plan, tap_request)
        except rules.ApiServiceError as err:
            log.info("refused %s: %s", request.path, err)
            return _error(err, err.status)
        except TapError as err:
            return _error(err, _TAP_STATUS.get(err.code.name, 500))
        try:
            peers = await asyncio.to_thread(self._controller.peers)
        except Exception as err:  # noqa: BLE001 - the labels only add to the events: tap without them
            log.warning("tap of %s: events carry no pod labels (the pods could not be listed: %s)", request.path, err)
            peers = {}
        response = web.StreamResponse(headers={"Content-Type": rules.CONTENT_TYPE})
        await response.prepare(request)
        try:
            async for event in self._controller.observe(pods, observe, peers):
                await response.write(rules.frame(event.SerializeToString()))
        except TapError as err:  # a pod failed mid-stream: the status is sent; say why in the stream
            log.warning("tap of %s ended: %s", request.path, err)
            await response.write(rules.error_body(str(err)))
        except ConnectionResetError:
            pass  # the client went away between events: its taps close with the generator
        return response


def _resource_list() -> dict[str, Any]:
    resources = []
    for plural, namespaced in [("namespaces", False), *((r, True) for r in rules.RESOURCES)]:
        resources.append({"name": plural, "singularName": "", "namespaced": namespaced, "kind": "Tap",
                          "verbs": ["watch"]})
        resources.append({"name": f"{plural}/tap", "singularName": "", "namespaced": namespaced, "kind": "Tap",
                          "verbs": ["watch"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{rules.GROUP}/{rules.VERSION}",
            "resources": resources}


async def serve(service: TapApiService, tls: ssl.SSLContext, host: str, port: int) -> web.AppRunner:
    """Start listening; the caller cleans the returned runner up."""
    # A client that goes away cancels its handler, which closes the pods' taps (nothing else would
    # notice: the handler only writes when a pod reports).
    runner = web.AppRunner(service.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    return runner
