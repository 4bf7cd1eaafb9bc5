"""The emoji service: ``ListAll`` and ``FindByShortcode`` over gRPC.

    python -m emojivoto.emoji [--port 8080]        (env GRPC_PORT)
"""

from __future__ import annotations

import argparse
import os

from emojivoto import rpc

# (shortcode, emoji); the order is the order ListAll returns.
EMOJI = (
    (":joy:", "😂"), (":sunglasses:", "😎"), (":doughnut:", "🍩"), (":stuck_out_tongue_winking_eye:", "😜"),
    (":money_mouth_face:", "🤑"), (":flushed:", "😳"), (":mask:", "😷"), (":nerd_face:", "🤓"),
    (":ghost:", "👻"), (":skull_and_crossbones:", "☠️"), (":heart_eyes_cat:", "😻"), (":hear_no_evil:", "🙉"),
    (":see_no_evil:", "🙈"), (":speak_no_evil:", "🙊"), (":boy:", "👦"), (":girl:", "👧"),
    (":man:", "👨"), (":woman:", "👩"), (":older_man:", "👴"), (":policeman:", "👮"),
    (":guardsman:", "💂"), (":construction_worker:", "👷"), (":santa:", "🎅"), (":princess:", "👸"),
    (":cat:", "🐱"), (":dog:", "🐶"), (":unicorn_face:", "🦄"), (":rainbow:", "🌈"),
    (":pizza:", "🍕"), (":taco:", "🌮"), (":burrito:", "🌯"), (":tada:", "🎉"),
    (":rocket:", "🚀"), (":100:", "💯"), (":crown:", "👑"), (":trophy:", "🏆"),
)


class EmojiService:
    def __init__(self, emoji: tuple[tuple[str, str], ...] = EMOJI) -> None:
        self._list = [{"shortcode": code, "unicode": char} for code, char in emoji]
        self._by_code = {e["shortcode"]: e for e in self._list}

    def list_all(self, request: rpc.Message, context: rpc.Context) -> rpc.Message:
        return {"list": self._list}

    def find_by_shortcode(self, request: rpc.Message, context: rpc.Context) -> rpc.Message:
        return {"emoji": self._by_code.get(str(request.get("shortcode", "")))}

    def handler(self) -> rpc.Handler:
        return rpc.service_handler(rpc.EMOJI_SERVICE, {"ListAll": self.list_all,
                                                       "FindByShortcode": self.find_by_shortcode})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="emoji", description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRPC_PORT", "8080")))
    parser.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args(argv)
    server, port = rpc.serve(f"{args.host}:{args.port}", EmojiService().handler())
    print(f"emoji: gRPC {rpc.EMOJI_SERVICE} on {args.host}:{port}", flush=True)
    rpc.wait_for_signal()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
