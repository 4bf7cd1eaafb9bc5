"""The demo's apps without the mesh: emoji and voting as real gRPC servers on loopback, web over them, the bot."""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from emojivoto import rpc, vote_bot
from emojivoto.emoji import EMOJI, EmojiService
from emojivoto.voting import VotingService
from emojivoto.web import WebApp, make_server


@dataclass
class Backends:
    emoji: rpc.EmojiClient
    voting: rpc.VotingClient


@pytest.fixture
def backends() -> Iterator[Backends]:
    emoji_server, emoji_port = rpc.serve("127.0.0.1:0", EmojiService().handler())
    voting_server, voting_port = rpc.serve("127.0.0.1:0", VotingService().handler())
    clients = Backends(rpc.EmojiClient(f"127.0.0.1:{emoji_port}"), rpc.VotingClient(f"localhost:{voting_port}"))
    yield clients
    clients.emoji.close()
    clients.voting.close()
    emoji_server.stop(None)
    voting_server.stop(None)


@pytest.fixture
def web(backends: Backends) -> Iterator[str]:
    server = make_server(WebApp(backends.emoji, backends.voting), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_emoji_over_grpc(backends: Backends) -> None:
    listed = backends.emoji.list_all()
    assert len(listed) == len(EMOJI) and listed[0] == {"shortcode": ":joy:", "unicode": "😂"}
    assert backends.emoji.find(":doughnut:") == {"shortcode": ":doughnut:", "unicode": "🍩"}
    assert backends.emoji.find(":nope:") is None


def test_voting_over_grpc_fails_the_doughnut(backends: Backends) -> None:
    for choice in (":joy:", ":joy:", ":ghost:"):
        backends.voting.vote(choice)
    with pytest.raises(rpc.RpcError) as failed:
        backends.voting.vote(":doughnut:")
    assert failed.value.code() == rpc.StatusCode.UNKNOWN
    with pytest.raises(rpc.RpcError) as empty:
        backends.voting.vote("")
    assert empty.value.code() == rpc.StatusCode.INVALID_ARGUMENT
    assert backends.voting.results() == [{"shortcode": ":joy:", "votes": 2}, {"shortcode": ":ghost:", "votes": 1}]


def test_web_routes(backends: Backends) -> None:
    app = WebApp(backends.emoji, backends.voting)
    listed = app.handle("GET", "/api/list")
    assert listed.status == 200 and len(json.loads(listed.body)) == len(EMOJI)
    voted = app.handle("GET", "/api/vote?choice=%3Ajoy%3A")
    assert voted.status == 200 and json.loads(voted.body)["voted"]["unicode"] == "😂"
    assert app.handle("POST", "/api/vote?choice=:joy:").status == 200
    doughnut = app.handle("GET", "/api/vote?choice=:doughnut:")
    assert doughnut.status == 500 and "UNKNOWN" in json.loads(doughnut.body)["error"]
    assert app.handle("GET", "/api/vote?choice=:nope:").status == 400
    assert app.handle("GET", "/api/vote").status == 400
    board = app.handle("GET", "/api/leaderboard")
    assert json.loads(board.body) == [{"shortcode": ":joy:", "votes": 2, "unicode": "😂"}]
    index = app.handle("GET", "/")
    assert index.status == 200 and index.content_type.startswith("text/html") and b"Emojivoto" in index.body
    assert app.handle("GET", "/nope").status == 404
    assert app.handle("DELETE", "/api/list").status == 405


def test_web_answers_503_when_a_back_end_is_down() -> None:
    emoji = rpc.EmojiClient("127.0.0.1:1", deadline=1.0)
    voting = rpc.VotingClient("127.0.0.1:1", deadline=1.0)
    try:
        response = WebApp(emoji, voting).handle("GET", "/api/list")
    finally:
        emoji.close()
        voting.close()
    assert response.status in (503, 504)
    assert "emoji ListAll" in json.loads(response.body)["error"]


def test_web_over_http_and_the_vote_bot(web: str) -> None:
    with urllib.request.urlopen(f"http://{web}/api/list", timeout=5) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/json"
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(f"http://{web}/api/vote?choice=:doughnut:", timeout=5)
    assert failed.value.code == 500

    host, port = web.split(":")
    bot = vote_bot.Bot(host, int(port))
    sent: list[int] = []
    lines: list[str] = []

    def stop() -> bool:
        sent.append(1)
        return len(sent) > 60

    tally = vote_bot.run(bot, rate=1000.0, doughnut_share=0.3, report_every=0.0, rng=random.Random(7), stop=stop,
                         out=lines.append)
    bot.close()
    assert sum(tally.values()) == 60
    assert tally["ok"] > 30 and tally["500"] > 0 and set(tally) <= {"ok", "500"}
    assert lines and lines[0].startswith("vote-bot: 1 requests in")
    with urllib.request.urlopen(f"http://{web}/api/leaderboard", timeout=5) as r:
        board = json.loads(r.read())
    # 60 requests are 29 rounds of list + vote, and the leaderboard after rounds 10 and 20.
    lists, boards = 29, 2
    assert sum(entry["votes"] for entry in board) == tally["ok"] - lists - boards


def test_vote_bot_plan_and_pacing() -> None:
    plan = vote_bot.plan(random.Random(1), [":joy:", ":doughnut:", ":ghost:"], doughnut_share=0.0)
    targets = [next(plan) for _ in range(21)]
    assert targets[0] == "/api/list" and targets[1].startswith("/api/vote?choice=")
    assert "doughnut" not in "".join(targets)
    assert targets[20] == "/api/leaderboard"  # after the tenth round

    clock = [0.0]
    slept: list[float] = []

    class Instant:
        def get(self, target: str) -> tuple[int, bytes]:
            clock[0] += 0.01
            return 200, b"[]"

        def choices(self) -> list[str]:
            return [":joy:"]

    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] > 10

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    vote_bot.run(Instant(), rate=4.0, doughnut_share=0.0, report_every=100.0, rng=random.Random(1), stop=stop,
                 clock=lambda: clock[0], sleep=sleep, out=lambda line: None)
    assert len(slept) == 10 and all(s == pytest.approx(0.24) for s in slept)
    assert clock[0] == pytest.approx(2.5)  # ten requests at 4/s
