"""The voting service: ``Vote`` and ``Results`` over gRPC.

    python -m emojivoto.voting [--port 8080] [--fail :doughnut:]     (env GRPC_PORT, FAILING_CHOICE)

A vote for the failing choice (``:doughnut:`` by default, as in Buoyant's
emojivoto) is answered with gRPC status UNKNOWN, so the mesh has failures to show.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections import Counter

from emojivoto import rpc

FAILING_CHOICE = ":doughnut:"


class VotingService:
    def __init__(self, failing_choice: str = FAILING_CHOICE) -> None:
        self.failing_choice = failing_choice
        self._votes: Counter[str] = Counter()
        self._lock = threading.Lock()

    def vote(self, request: rpc.Message, context: rpc.Context) -> rpc.Message:
        shortcode = str(request.get("shortcode", ""))
        if not shortcode:
            context.abort(rpc.StatusCode.INVALID_ARGUMENT, "no shortcode")
        if shortcode == self.failing_choice:
            context.abort(rpc.StatusCode.UNKNOWN, f"ERROR: cannot vote for {shortcode}")
        with self._lock:
            self._votes[shortcode] += 1
        return {}

    def results(self, request: rpc.Message, context: rpc.Context) -> rpc.Message:
        with self._lock:
            ranked = sorted(self._votes.items(), key=lambda item: (-item[1], item[0]))
        return {"results": [{"shortcode": code, "votes": n} for code, n in ranked]}

    def handler(self) -> rpc.Handler:
        return rpc.service_handler(rpc.VOTING_SERVICE, {"Vote": self.vote, "Results": self.results})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="voting", description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRPC_PORT", "8080")))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--fail", default=os.environ.get("FAILING_CHOICE", FAILING_CHOICE),
                        help="the choice whose votes fail")
    args = parser.parse_args(argv)
    server, port = rpc.serve(f"{args.host}:{args.port}", VotingService(args.fail).handler())
    print(f"voting: gRPC {rpc.VOTING_SERVICE} on {args.host}:{port}; votes for {args.fail} fail", flush=True)
    rpc.wait_for_signal()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
