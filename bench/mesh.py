"""The data-plane benchmark: ``./run bench mesh [-- OPTIONS]`` (``--help`` lists them).

Installs what it needs (dev/bench-setup.sh), starts nginx and every variant's
proxies, measures maximum throughput (HTTP/1, HTTP/2 and gRPC), latency at fixed
rates (HTTP/1), proxy memory and CPU, the Tether proxies' Python calls per
request, and writes bench/results/<timestamp>/report.md with PNG plots
(bench/results/latest points at the newest). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="./run bench mesh --", description="Data-plane benchmark: direct, Envoy, "
                                 "HAProxy (and Tether) on the same loopback request path.")
    ap.add_argument("--quick", action="store_true", help="one short round (about a minute) instead of three")
    ap.add_argument("--variants", default="all",
                    help="comma-separated variants to run (default: every one that is available); see --list")
    ap.add_argument("--list", action="store_true", help="list the variants and whether they can run here")
    ap.add_argument("--rounds", type=int, help="rounds of every measurement (default 3, quick 1)")
    ap.add_argument("--throughput-seconds", type=float, help="seconds per wrk run (default 5, quick 2)")
    ap.add_argument("--latency-seconds", type=float, help="seconds per open-loop run (default 5, quick 2)")
    ap.add_argument("--rates", help="comma-separated req/s for the latency runs; 'high' = derived "
                                    "(default 100,250,1000,high)")
    ap.add_argument("--high-rate", type=float, help="use this req/s as the high rate instead of deriving it")
    ap.add_argument("--high-fraction", type=float, default=0.75,
                    help="high rate = this fraction of the lowest maximum throughput (default 0.75)")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    ap.add_argument("--openloop-connections", type=int, default=32, help="open-loop connections (default 32)")
    ap.add_argument("--nice", type=int, default=-10, help="priority of everything measured (default -10)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin load and proxies to separate CPUs")
    ap.add_argument("--retry-other-load", type=float, metavar="CPUS",
                    help="run a measurement again when other processes kept more CPUs than this busy "
                         "(default 0.5; quick: never)")
    ap.add_argument("--profile-seconds", type=float,
                    help="seconds of py-spy sampling per Tether proxy at maximum load, last (default 8, quick 4; "
                         "0: no profile)")
    ap.add_argument("--h2-connections", type=int, default=8,
                    help="h2load connections for the HTTP/2 and gRPC variants (default 8)")
    ap.add_argument("--h2-streams", type=int, default=4,
                    help="requests in flight on each h2load connection (default 4: 32 in all, as wrk's)")
    ap.add_argument("--callcount-requests", type=int,
                    help="requests sent through each Tether variant while its proxies count Python calls, last "
                         "(default 2000, quick 500; 0: no count)")
    ap.add_argument("--churn-seconds", type=float,
                    help="seconds of connection churn (a new connection per request) through each proxied HTTP/1 "
                         "variant, the proxies' RSS read in between (default 12, quick 6; 0: none)")
    ap.add_argument("--no-setup", action="store_true", help="skip dev/bench-setup.sh")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory (default bench/results)")
    ap.add_argument("--report-only", type=Path, metavar="DIR",
                    help="rebuild report.md and plots from DIR/results.json, measure nothing")
    return ap


def setup() -> None:
    script = REPO / "dev" / "bench-setup.sh"
    subprocess.run(["bash", str(script)], cwd=REPO, check=True)


def write_outputs(results: dict, directory: Path) -> Path:
    """results.json, the plots and report.md into ``directory``; returns the report's path."""
    from bench.dataplane.plots import write_plots
    from bench.dataplane.report import render

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=1))
    try:
        plots = write_plots(results, directory)
    except ImportError as e:  # matplotlib missing: the report still stands
        print(f"no plots: {e}", file=sys.stderr)
        plots = []
    report = directory / "report.md"
    report.write_text(render(results, plots))
    return report


def _link_latest(directory: Path) -> None:
    latest = directory.parent / "latest"
    tmp = directory.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(directory.name)
    os.replace(tmp, latest)


def run(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    if args.report_only:
        results = json.loads((args.report_only / "results.json").read_text())
        print(write_outputs(results, args.report_only))
        return
    if not args.no_setup:
        setup()

    from bench.dataplane import runner
    from bench.dataplane.variants import VARIANTS

    if args.list:
        for name, cls in VARIANTS.items():
            why = cls.available()
            print(f"{name:14s} {'available' if why is None else 'unavailable: ' + why}\n{'':14s} {cls.description}")
        return
    if args.variants == "all":
        variants = []
        for name, cls in VARIANTS.items():
            why = cls.available()
            if why is None:
                variants.append(name)
            else:
                print(f"skipping {name}: {why}")
    else:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            sys.exit(f"unknown variant(s): {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        missing = [f"{v}: {why}" for v in variants if (why := VARIANTS[v].available())]
        if missing:
            sys.exit("cannot run " + "; ".join(missing))

    opts = runner.Options(variants=variants, high_rate=args.high_rate, high_fraction=args.high_fraction,
                          wrk_connections=args.connections, openloop_connections=args.openloop_connections,
                          h2_connections=args.h2_connections, h2_streams=args.h2_streams,
                          nice=args.nice, pin=not args.no_pin)
    if args.quick:
        opts.rounds, opts.throughput_seconds, opts.latency_seconds, opts.min_samples = 1, 2.0, 2.0, 200
        opts.warmup_seconds = 1.0
        opts.retry_other_load = float("inf")
        opts.profile_seconds = 4.0
        opts.callcount_requests = 500
        opts.churn_seconds = 6.0
    if args.profile_seconds is not None:
        opts.profile_seconds = args.profile_seconds
    if args.churn_seconds is not None:
        opts.churn_seconds = args.churn_seconds
    if args.callcount_requests is not None:
        opts.callcount_requests = args.callcount_requests
    if args.retry_other_load is not None:
        opts.retry_other_load = args.retry_other_load
    if args.rounds:
        opts.rounds = args.rounds
    if args.throughput_seconds:
        opts.throughput_seconds = args.throughput_seconds
    if args.latency_seconds:
        opts.latency_seconds = args.latency_seconds
    if args.rates:
        opts.rates = [r.strip() for r in args.rates.split(",") if r.strip()]

    def log(line: str) -> None:
        print(line, flush=True)

    opts.log = log
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        results = runner.run(opts)
    except KeyboardInterrupt:
        print("interrupted: every process stopped, temp dirs removed", file=sys.stderr)
        raise SystemExit(130) from None
    directory = args.out / stamp
    report = write_outputs(results, directory)
    _link_latest(directory)
    print()
    print(report.read_text())
    print(f"report: {report}")
