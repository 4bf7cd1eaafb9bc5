"""The vote bot: calls web at a steady rate, as a crowd of voters would.

    python -m emojivoto.vote_bot [--web web-svc.emojivoto:80] [--rate 4] [--doughnut-share 0.15]
    (env WEB_HOST, VOTE_RATE, DOUGHNUT_SHARE)

Each round lists the emoji (``GET /api/list``) and votes for one
(``GET /api/vote?choice=``): the doughnut with probability ``--doughnut-share``
(that vote fails with 500), otherwise a random other emoji; every tenth round
also reads the leaderboard.  ``--rate`` is requests per second, spread evenly.
It keeps one HTTP/1.1 connection open (reconnecting after errors) and prints a
tally every ``--report`` seconds:

    vote-bot: 20 requests in 5.0s: 17 ok, 3 failed (500: 3)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from urllib.parse import quote

FALLBACK_CHOICES = (":joy:", ":sunglasses:", ":nerd_face:", ":ghost:", ":rocket:", ":tada:", ":unicorn_face:")
DOUGHNUT = ":doughnut:"


def plan(rng: random.Random, choices: list[str], doughnut_share: float) -> Iterator[str]:
    """The request targets, round after round, forever."""
    others = [c for c in choices if c != DOUGHNUT] or list(FALLBACK_CHOICES)
    round_ = 0
    while True:
        round_ += 1
        yield "/api/list"
        choice = DOUGHNUT if rng.random() < doughnut_share else rng.choice(others)
        yield f"/api/vote?choice={quote(choice)}"
        if round_ % 10 == 0:
            yield "/api/leaderboard"


class Bot:
    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: http.client.HTTPConnection | None = None

    def get(self, target: str) -> tuple[int, bytes]:
        """One request; status 0 means no answer (the error is in the body)."""
        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._conn.request("GET", target)
            response = self._conn.getresponse()
            body = response.read()
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return response.status, body
        except (OSError, http.client.HTTPException) as err:
            self.close()
            return 0, f"{type(err).__name__}: {err}".encode()

    def choices(self) -> list[str]:
        status, body = self.get("/api/list")
        if status == 200:
            try:
                return [e["shortcode"] for e in json.loads(body)]
            except (ValueError, KeyError, TypeError):
                pass
        return list(FALLBACK_CHOICES)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def run(bot: Bot, rate: float, doughnut_share: float, report_every: float, *, rng: random.Random,
        stop: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep, out: Callable[[str], None] = print) -> Counter[str]:
    """Send requests at ``rate`` per second until ``stop()``; returns the tally by outcome."""
    total: Counter[str] = Counter()
    window: Counter[str] = Counter()
    targets = plan(rng, bot.choices(), doughnut_share)
    interval = 1.0 / rate
    next_at = clock()
    reported_at = clock()
    while not stop():
        status, body = bot.get(next(targets))
        outcome = "ok" if 200 <= status < 400 else ("error" if status == 0 else str(status))
        total[outcome] += 1
        window[outcome] += 1
        if status == 0 and window[outcome] == 1:
            out(f"vote-bot: no answer from web: {body.decode(errors='replace')}")
        now = clock()
        if now - reported_at >= report_every:
            out(_tally(window, now - reported_at))
            window.clear()
            reported_at = now
        next_at += interval
        if next_at > now:
            sleep(next_at - now)
        else:
            next_at = now  # behind schedule: do not burst to catch up
    return total


def _tally(counts: Counter[str], seconds: float) -> str:
    n = sum(counts.values())
    failed = n - counts["ok"]
    detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if k != "ok")
    return f"vote-bot: {n} requests in {seconds:.1f}s: {counts['ok']} ok, {failed} failed" + (
        f" ({detail})" if detail else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vote-bot", description="emojivoto's traffic generator")
    parser.add_argument("--web", default=os.environ.get("WEB_HOST", "web-svc.emojivoto:80"), help="host:port of web")
    parser.add_argument("--rate", type=float, default=float(os.environ.get("VOTE_RATE", "4")),
                        help="requests per second")
    parser.add_argument("--doughnut-share", type=float, default=float(os.environ.get("DOUGHNUT_SHARE", "0.15")))
    parser.add_argument("--report", type=float, default=5.0, help="seconds between tallies")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    host, _, port = args.web.rpartition(":")
    if not host:
        host, port = args.web, "80"
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(f"vote-bot: calling http://{host}:{port} at {args.rate:g} requests/s", flush=True)
    bot = Bot(host, int(port))
    try:
        run(bot, args.rate, args.doughnut_share, args.report, rng=random.Random(), stop=lambda: bool(stopping),
            out=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        pass
    finally:
        bot.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
