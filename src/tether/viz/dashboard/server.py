"""The dashboard's HTTP server: the page, its static files and the JSON views, read-only.

Every request is checked first:

- its ``Host`` header must match the enforced-host pattern (by default
  loopback names only, with any port), as Linkerd's web checks
  ``-enforced-host``: a page on another site that rebinds its DNS name to
  127.0.0.1 sends its own name as ``Host`` and gets 400, not the mesh's data;
- only ``GET`` and ``HEAD`` are served (405 otherwise): nothing here changes
  state;
- answers carry ``X-Frame-Options: DENY``, ``X-Content-Type-Options:
  nosniff`` and a Content-Security-Policy allowing only this origin.

Callers: ``tether viz dashboard`` (foreground) and tests.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from tether.viz.dashboard.views import Views

DEFAULT_ENFORCED_HOST = r"^(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8")}
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> bytes:
    return (resources.files("tether.viz.dashboard") / "static" / name).read_bytes()


def host_denied(host: str, pattern: re.Pattern[str]) -> str:
    """Linkerd web's answer to a Host it does not serve."""
    return (f"It appears that you are trying to reach this service with a host of '{html.escape(host)}'.\n"
            f"This does not match /{pattern.pattern}/ and has been denied for security reasons.\n"
            "Start `tether viz dashboard --enforced-host REGEX` to serve another name.\n")


class Dashboard:
    def __init__(self, views: Views, host: str, port: int, enforced_host: str = DEFAULT_ENFORCED_HOST) -> None:
        self.views = views
        self.enforced_host = re.compile(enforced_host)
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "tether-viz"
            sys_version = ""

            def _send(self, status: int, body: bytes, content_type: str, head: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in SECURITY_HEADERS.items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _serve(self, head: bool) -> None:
                host = self.headers.get("Host", "")
                if not dashboard.enforced_host.match(host):
                    self._send(400, host_denied(host, dashboard.enforced_host).encode(), "text/plain; charset=utf-8",
                               head)
                    return
                url = urllib.parse.urlsplit(self.path)
                if url.path in STATIC:
                    name, content_type = STATIC[url.path]
                    self._send(200, _static(name), content_type, head)
                    return
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
                if url.path == "/api/tap" and not head:
                    self._tap(query)
                    return
                status, doc = dashboard.views.answer(url.path, query)
                self._send(status, json.dumps(doc).encode(), "application/json", head)

            def _tap(self, query: dict[str, str]) -> None:
                """Server-sent events of the live tap, until the page closes the stream."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                for key, value in SECURITY_HEADERS.items():
                    self.send_header(key, value)
                self.end_headers()

                async def stream() -> None:
                    async for item in dashboard.views.tap_events(query):
                        kind = "failure" if "error" in item else "message"
                        self.wfile.write(f"event: {kind}\ndata: {json.dumps(item)}\n\n".encode())
                        self.wfile.flush()

                async def until_closed() -> None:
                    # The page sends nothing more: the socket turns readable when it closes the stream.
                    # Without this a closed page would be noticed only at the next event's write, and
                    # its taps of idle pods would stay open.
                    closed = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    loop.add_reader(self.connection.fileno(), closed.set)
                    try:
                        await closed.wait()
                    finally:
                        loop.remove_reader(self.connection.fileno())

                async def tap() -> None:
                    tasks = [asyncio.create_task(stream()), asyncio.create_task(until_closed())]
                    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    for task in done:
                        task.result()

                try:
                    asyncio.run(tap())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the page went away

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self._serve(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(head=True)

            def _refuse(self) -> None:
                self.send_response(405)
                self.send_header("Allow", "GET, HEAD")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.address = self.server.server_address

    @property
    def url(self) -> str:
        host, port = self.address[0], self.address[1]
        return f"http://{'localhost' if host in ('127.0.0.1', '::1') else host}:{port}/"

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.2)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="viz-dashboard", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
