"""The client side of the tap APIService: ``viz tap``, ``top`` and ``profile --tap`` on Kubernetes.

As ``linkerd viz tap`` does, the request (a ``TapByResourceRequest``, protobuf)
is POSTed to the API server at the path it names
(``tap_apiservice.expected_path``: ``/apis/tap.linkerd.io/v1alpha1/watch/namespaces/<ns>/<type>s/<name>/tap``),
with the user's own credentials from the kubeconfig; the API server's
aggregator hands it to the tap server, which checks the user with a
SubjectAccessReview.  The answer is a stream of ``TapEvent``s in Linkerd's
``protohttp`` frames (``tap_apiservice.read_frames``).

A refusal says why: the tap server's (its ``linkerd-error`` header, and the
framed ``ApiError``: a user without the RBAC, no tappable pod, a body that does
not match the path), else the API server's (``Status``; a 404 or 503 there
means the APIService is not installed or its server is not available).

Callers: the ``tether viz`` CLI and the dashboard with ``--platform kubernetes``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from google.protobuf.message import DecodeError

from tether.api import tap_pb2, viz_tap_pb2
from tether.platform.kubernetes.client import ClientSettings, KubeClient, KubeError, StreamRefused
from tether.viz import tap_apiservice as rules


class TapApiError(Exception):
    """The tap could not start or broke; the message names the path and the reason."""


def refusal(path: str, err: StreamRefused) -> str:
    """Why a POST of a tap was refused, in the words of whoever refused it."""
    if rules.ERROR_HEADER in {k.lower() for k in err.headers}:
        frames = rules.read_frames(bytearray(err.body))
        try:
            return rules.error_message(frames[0]) if frames else next(
                v for k, v in err.headers.items() if k.lower() == rules.ERROR_HEADER)
        except ValueError:  # not an ApiError frame: the header's status text is all there is
            return next(v for k, v in err.headers.items() if k.lower() == rules.ERROR_HEADER)
    hint = ""
    if err.status in (404, 503):
        hint = (f" (is viz's tap APIService v1alpha1.{rules.GROUP} installed and available? "
                f"`kubectl get apiservice v1alpha1.{rules.GROUP}`)")
    return f"the Kubernetes API refused POST {path}: {err}{hint}"


async def events(settings: ClientSettings, request: viz_tap_pb2.TapByResourceRequest
                 ) -> AsyncIterator[tap_pb2.TapEvent]:
    """Each event of the tap as it arrives, until the server ends the stream (or the caller stops reading)."""
    path = rules.expected_path(request)
    client = KubeClient(settings)
    buffer = bytearray()
    try:
        async for chunk in client.post_stream(path, request.SerializeToString(), content_type=rules.CONTENT_TYPE):
            buffer += chunk
            for message in rules.read_frames(buffer):
                try:
                    event = tap_pb2.TapEvent.FromString(message)
                except DecodeError:
                    raise TapApiError(f"POST {path}: the answer is not a stream of tap events") from None
                yield event
    except StreamRefused as err:
        raise TapApiError(refusal(path, err)) from None
    except KubeError as err:
        raise TapApiError(f"cannot tap through the Kubernetes API (POST {path}): {err}") from None
    finally:
        await client.close()


async def stream(settings: ClientSettings, request: viz_tap_pb2.TapByResourceRequest,
                 show: Callable[[tap_pb2.TapEvent], None]) -> None:
    """Each event of the tap, to ``show``, until the server ends the stream (or the caller is cancelled)."""
    async for event in events(settings, request):
        show(event)
