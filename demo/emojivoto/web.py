"""The web front end: an HTTP/1.1 server over the emoji and voting gRPC services.

    python -m emojivoto.web [--port 8080] [--emoji emoji-svc.emojivoto:8080]
                            [--voting voting-svc.emojivoto:8080]
    (env WEB_PORT, EMOJISVC_HOST, VOTINGSVC_HOST)

| route | answer |
|---|---|
| ``GET /`` | a small HTML page that lists the emoji, votes and shows the leaderboard |
| ``GET /api/list`` | the emoji (emoji ``ListAll``) |
| ``GET|POST /api/vote?choice=:joy:`` | emoji ``FindByShortcode``, then voting ``Vote``: 200; 400 for an
  unknown choice; 500 when the vote fails |
| ``GET /api/leaderboard`` | voting ``Results`` with each emoji's character |

A back end that fails answers 500 (503 when unreachable, 504 past its deadline).
``WebApp`` is the routing without the HTTP server, so tests call it directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from emojivoto import rpc


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, value: object) -> Response:
        return cls(status, json.dumps(value, ensure_ascii=False).encode())


def _failed(err: rpc.RpcError, what: str) -> Response:
    code = err.code() if hasattr(err, "code") else None
    status = {rpc.StatusCode.UNAVAILABLE: 503, rpc.StatusCode.DEADLINE_EXCEEDED: 504}.get(code, 500)
    detail = err.details() if hasattr(err, "details") else str(err)
    return Response.json(status, {"error": f"{what}: {getattr(code, 'name', code)}: {detail}"})


class WebApp:
    def __init__(self, emoji: rpc.EmojiClient, voting: rpc.VotingClient) -> None:
        self.emoji = emoji
        self.voting = voting

    def handle(self, method: str, target: str) -> Response:
        url = urlsplit(target)
        route = {"/": self.index, "/index.html": self.index, "/api/list": self.list,
                 "/api/vote": self.vote, "/api/leaderboard": self.leaderboard}.get(url.path)
        if route is None:
            return Response.json(404, {"error": f"no route for {url.path}"})
        allowed = ("GET", "POST") if url.path == "/api/vote" else ("GET",)
        if method not in allowed:
            return Response.json(405, {"error": f"{method} not allowed on {url.path}"})
        return route(parse_qs(url.query))

    def index(self, query: dict[str, list[str]]) -> Response:
        return Response(200, INDEX_HTML.encode(), "text/html; charset=utf-8")

    def list(self, query: dict[str, list[str]]) -> Response:
        try:
            return Response.json(200, self.emoji.list_all())
        except rpc.RpcError as err:
            return _failed(err, "emoji ListAll")

    def vote(self, query: dict[str, list[str]]) -> Response:
        choice = (query.get("choice") or [""])[0]
        if not choice:
            return Response.json(400, {"error": "missing ?choice="})
        try:
            emoji = self.emoji.find(choice)
        except rpc.RpcError as err:
            return _failed(err, "emoji FindByShortcode")
        if emoji is None:
            return Response.json(400, {"error": f"unknown choice {choice}"})
        try:
            self.voting.vote(choice)
        except rpc.RpcError as err:
            return _failed(err, "voting Vote")
        return Response.json(200, {"voted": emoji})

    def leaderboard(self, query: dict[str, list[str]]) -> Response:
        try:
            results = self.voting.results()
            chars = {e["shortcode"]: e["unicode"] for e in self.emoji.list_all()}
        except rpc.RpcError as err:
            return _failed(err, "leaderboard")
        return Response.json(200, [{**r, "unicode": chars.get(r["shortcode"], "?")} for r in results])


def make_server(app: WebApp, host: str, port: int) -> ThreadingHTTPServer:
    """A threading HTTP/1.1 server (keep-alive) serving ``app``; ``serve_forever`` runs it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "emojivoto-web"
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            response = app.handle(self.command, self.path)
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            if response.status >= 500:
                self.log_message("%s %s -> %d %s", self.command, self.path, response.status,
                                 response.body.decode(errors="replace"))

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve  # noqa: N815 - http.server's names

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass  # only failures are logged (above), so the log stays readable under load

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            sys.stderr.write("web: " + format % args + "\n")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="web", description="emojivoto's web front end")
    parser.add_argument("--port", type=int, default=int(os.environ.get("WEB_PORT", "8080")))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--emoji", default=os.environ.get("EMOJISVC_HOST", "emoji-svc.emojivoto:8080"))
    parser.add_argument("--voting", default=os.environ.get("VOTINGSVC_HOST", "voting-svc.emojivoto:8080"))
    args = parser.parse_args(argv)
    app = WebApp(rpc.EmojiClient(args.emoji), rpc.VotingClient(args.voting))
    server = make_server(app, args.host, args.port)
    print(f"web: HTTP on {args.host}:{server.server_port}; emoji at {args.emoji}, voting at {args.voting}",
          flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rpc.wait_for_signal()
    server.shutdown()


INDEX_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>Emojivoto on Tether</title>
<style>
body { font-family: sans-serif; max-width: 46em; margin: 2em auto; }
#emoji button { font-size: 2em; margin: .1em; border: none; background: none; cursor: pointer; }
#status { min-height: 1.5em; }
</style></head>
<body>
<h1>Emojivoto</h1>
<p>Vote for your favourite emoji. (Voting for the doughnut fails on purpose.)</p>
<div id="emoji"></div>
<p id="status"></p>
<h2>Leaderboard</h2>
<ol id="leaderboard"></ol>
<script>
async function load() {
  const list = await (await fetch('/api/list')).json();
  const box = document.getElementById('emoji');
  for (const e of list) {
    const b = document.createElement('button');
    b.textContent = e.unicode; b.title = e.shortcode;
    b.onclick = async () => {
      const r = await fetch('/api/vote?choice=' + encodeURIComponent(e.shortcode));
      document.getElementById('status').textContent =
        r.ok ? 'Voted for ' + e.unicode : 'Vote failed (' + r.status + ')';
      board();
    };
    box.appendChild(b);
  }
  board();
}
async function board() {
  const rows = await (await fetch('/api/leaderboard')).json();
  document.getElementById('leaderboard').innerHTML =
    rows.slice(0, 10).map(r => '<li>' + r.unicode + ' ' + r.votes + '</li>').join('');
}
load();
</script>
</body></html>
"""


if __name__ == "__main__":
    main()
