"""``python -m bench.dataplane.tap_watch``: keep a tap open on proxies, as ``tether viz tap`` does, counting events.

Each target is ``IDENTITY@HOST:PORT`` (the proxy's identity and its tap server's address). The watcher
presents the tap identity's certificate and asks each proxy for every request (an empty match) through
the tap controller's own loop (``tether.viz.tap.TapController.observe``): one-second windows of at most
``--limit`` requests each. ``--limit 100`` is what ``viz tap`` asks of a single pod by default
(``--max-rps 100``); a limit above the request rate takes every request.

It writes ``events=<n>`` to ``--count-file`` every second, so the harness can check the tap was served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path

from tether.api import tap_pb2
from tether.viz.tap import TapController, TapCredentials, TapTarget


def _target(text: str) -> tuple[str, str, int]:
    identity, _, address = text.partition("@")
    host, _, port = address.rpartition(":")
    if not identity or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"target {text!r}: expected IDENTITY@HOST:PORT")
    return identity, host, int(port)


async def _watch(target: tuple[str, str, int], credentials: TapCredentials, limit: int, counts: list[int],
                 slot: int) -> None:
    identity, host, port = target
    controller = TapController(None, None, credentials, tap_port=port)  # type: ignore[arg-type] - no resolving
    pod = TapTarget(namespace="bench", name=identity.split(".", 1)[0], ip=host, identity=identity)
    async for _ in controller.observe([pod], tap_pb2.ObserveRequest(limit=limit)):
        counts[slot] += 1


async def _main(args: argparse.Namespace) -> None:
    credentials = TapCredentials(key_pem=args.key.read_bytes(), chain_pem=args.cert.read_bytes(),
                                 anchors_pem=args.anchors.read_bytes())
    counts = [0] * len(args.targets)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(_watch(t, credentials, args.limit, counts, i)) for i, t in enumerate(args.targets)]
    try:
        while not stop.is_set():
            args.count_file.write_text(f"events={sum(counts)}\n")
            for task in tasks:
                if task.done():  # a proxy refused or went away: say so and stop
                    task.result()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        args.count_file.write_text(f"events={sum(counts)}\n")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.dataplane.tap_watch", description=__doc__.splitlines()[0])
    ap.add_argument("--anchors", type=Path, required=True, help="the trust anchors (PEM)")
    ap.add_argument("--cert", type=Path, required=True, help="the tap identity's chain (PEM)")
    ap.add_argument("--key", type=Path, required=True, help="its key (PEM)")
    ap.add_argument("--limit", type=int, required=True, help="requests per one-second window and proxy")
    ap.add_argument("--count-file", type=Path, required=True)
    ap.add_argument("targets", nargs="+", type=_target, metavar="IDENTITY@HOST:PORT")
    asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
