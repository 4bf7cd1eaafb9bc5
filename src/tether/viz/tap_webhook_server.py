"""The tap injector's process on Kubernetes: an HTTPS admission webhook applying `tap_admission`.

``tether viz tap-injector`` runs it in the viz namespace behind the
``tap-injector`` Service (443 -> 8443) that the ``linkerd-tap-injector-webhook-config``
MutatingWebhookConfiguration names.  A POST on any path is an AdmissionReview;
the pod's namespace is read from the API server (GET, with the pod's service
account, which may only read namespaces) for ``viz.linkerd.io/disable-tap``.
``GET /ready`` and ``/live`` answer 200 for the probes.  TLS 1.2+ with the
certificate and key of its Secret, loaded at start.

Callers: ``tether.cli.viz``; tests.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from aiohttp import web

from tether.platform.kubernetes.client import KubeClient, KubeError
from tether.viz import tap_admission

log = logging.getLogger(__name__)

DEFAULT_PORT = 8443
MAX_BODY = 10 * 1024 * 1024


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context from PEM files; raises `OSError`/`ssl.SSLError` for unusable ones."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class TapInjectorWebhook:
    def __init__(self, kube: KubeClient, identity: str) -> None:
        """``identity``: the tap server's, which the patched proxies will serve tap to."""
        self._kube = kube
        self._identity = identity

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/ready", self._ok)
        app.router.add_get("/live", self._ok)
        app.router.add_post("/{tail:.*}", self._review)
        return app

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _namespace_annotations(self, namespace: str) -> tuple[dict[str, str] | None, str]:
        try:
            ns = await self._kube.get(f"/api/v1/namespaces/{namespace}")
        except KubeError as exc:
            return None, str(exc)
        return dict((ns.get("metadata") or {}).get("annotations") or {}), ""

    async def _review(self, request: web.Request) -> web.Response:
        try:
            review = tap_admission.parse(await request.read())
        except tap_admission.MalformedReview as exc:
            return web.Response(status=400, text=f"{exc}\n")
        annotations, error = await self._namespace_annotations(review.namespace)
        body, what = tap_admission.answer(review, annotations, self._identity, error)
        log.info("%s", what)
        return web.json_response(body)


async def serve(webhook: TapInjectorWebhook, tls: ssl.SSLContext, host: str, port: int) -> web.AppRunner:
    """Start listening; the caller cleans the returned runner up."""
    runner = web.AppRunner(webhook.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    return runner
