"""One benchmark run: start the backend and every variant, measure them interleaved, return the raw results.

Order of a run:
  1. nginx, then every variant's proxies, all running side by side (idle ones
     cost nothing); a request through each checks the path (gRPC: a call by
     grpcio); idle RSS is read.
  2. Warm-up: a short run of each variant's load generator (not recorded).
  3. Maximum throughput: ``rounds`` rounds, each running the closed-loop load
     through every variant (wrk for HTTP/1, h2load for HTTP/2 and gRPC), the
     variant order rotated per round.
  4. The high rate: ``high_fraction`` of the lowest median maximum throughput
     of the HTTP/1 variants, lowered in steps until a short open-loop probe of
     every HTTP/1 variant sustains it.
  5. Generator check: the open-loop generator against nginx alone at twice
     the high rate, to show it has headroom.
  6. Latency (HTTP/1 variants: the open-loop generator speaks HTTP/1.1):
     ``rounds`` rounds; in each, for each rate, every variant in a rotated
     order, so drift of the machine hits all of them alike.
  7. Each variant's fairness checks (TLS version, connection reuse, protocol).
  8. Connection churn: wrk with ``Connection: close`` through each proxied HTTP/1
     variant in a few segments, the proxies' RSS read after each.
  9. Profiles of each Tether variant at maximum load (py-spy), then its Python
     calls per request (``callcount``), both after every measurement.

During every measurement the harness samples each proxy's RSS and takes CPU
time deltas of the proxies, the backend and the load generator, and of the
whole machine (what is left is other load: a noise indicator).
"""

from __future__ import annotations

import datetime as dt
import functools
import http.client
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.dataplane import openloop
from bench.dataplane.backend import (BODY_SIZE, GRPC_PATH, GRPC_REQUEST, GRPC_REQUEST_MESSAGE,
                                    GRPC_RESPONSE_MESSAGE, start_backend)
from bench.dataplane.closedloop import (H2Load, h2load_argv, h2load_binary, parse_h2load, parse_wrk, wrk_argv,
                                        wrk_binary)
from bench.dataplane.pki import issue_mesh_certs
from bench.dataplane.procs import Pinning, StartError, Supervisor
from bench.dataplane.procstat import MachineTimes, cpu_seconds, rss_bytes
from bench.dataplane.variants import VARIANTS, Context, Variant

REPO = Path(__file__).resolve().parents[2]
HIGH = "high"


@dataclass
class Options:
    variants: list[str]
    rounds: int = 3
    throughput_seconds: float = 5.0
    latency_seconds: float = 5.0
    min_samples: int = 1000  # a low rate runs long enough to collect this many latencies
    rates: list[str] = field(default_factory=lambda: ["100", "250", "1000", HIGH])
    high_rate: float | None = None  # fixed instead of derived from the throughput phase
    high_fraction: float = 0.75
    wrk_connections: int = 32
    # h2load (HTTP/2 and gRPC loads): connections, and streams in flight on each (8 x 4: as many requests in
    # flight as wrk's 32 connections).
    h2_connections: int = 8
    h2_streams: int = 4
    openloop_connections: int = 32
    warmup_seconds: float = 1.0
    nice: int = -10
    pin: bool = True
    # A measurement during which processes outside the benchmark kept more than this many CPUs busy
    # is run once more, and the quieter of the two kept.
    retry_other_load: float = 0.5
    # Seconds of py-spy sampling of each Tether proxy under maximum load, after the measurements (0: none).
    profile_seconds: float = 8.0
    # Requests per Tether proxy in the call-count phase (0: no call count).
    callcount_requests: int = 2000
    # Seconds of connection churn (wrk, a new connection per request) through each proxied HTTP/1 variant, in
    # ``churn_segments`` parts with the proxies' RSS read after each (0: no churn phase).
    churn_seconds: float = 12.0
    churn_segments: int = 3
    log: Callable[[str], None] = print

    def latency_duration(self, rate: float) -> float:
        return max(self.latency_seconds, self.min_samples / rate)

    def estimate_seconds(self) -> float:
        n = len(self.variants)
        n1 = sum(1 for v in self.variants if VARIANTS[v].load == "http1")
        per_round = n * (max(1, round(self.throughput_seconds)) + 0.6)
        for r in self.rates:
            rate = float(r) if r != HIGH else 5000.0
            per_round += n1 * (self.latency_duration(rate) + 0.8)
        probes = n1 * (min(2.0, self.latency_seconds) + 0.8) * 1.5
        profiled = sum(1 for v in self.variants if v.startswith("tether")) * (self.profile_seconds + 8)
        churned = (n1 - ("direct" in self.variants)) * (self.churn_seconds + self.churn_segments)
        return (10 + n * (self.warmup_seconds + 2) + self.rounds * per_round + probes + self.latency_seconds + 2
                + profiled + churned)


def rotated(items: Sequence[str], k: int) -> list[str]:
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def choose_high_rate(max_rps: dict[str, float], fraction: float) -> float:
    """``fraction`` of the lowest maximum throughput, rounded down to two significant digits."""
    lowest = min(max_rps.values())
    target = max(1.0, lowest * fraction)
    digits = len(str(int(target))) - 2
    step = 10 ** max(digits, 0)
    return float(max(step, int(target // step) * step))


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass
class _Sample:
    """CPU and RSS of the system under test while one load runs."""

    pids: dict[str, int]
    rss_peak: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._read()

    def _read(self) -> None:
        for role, pid in self.pids.items():
            self.rss_peak[role] = max(self.rss_peak.get(role, 0), rss_bytes(pid))

    def run(self, load: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
        cpu0 = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        machine0 = MachineTimes.read()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.monotonic()
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            result = load()
        finally:
            self._stop.set()
            thread.join()
        self._read()
        wall = time.monotonic() - wall0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        machine1 = MachineTimes.read()
        cpu = {role: cpu_seconds(pid) - cpu0[role] for role, pid in self.pids.items()}
        loadgen = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        ours = sum(cpu.values()) + loadgen
        other = max(0.0, (machine1.busy - machine0.busy) - ours)
        return result, {"cpu": cpu, "rss_peak": dict(self.rss_peak), "loadgen_cpu": loadgen,
                        "other_load_cores": other / wall if wall else 0.0, "wall": wall}


def measure_quietly(
    pids: dict[str, int], load: Callable[[], Any], retry_above: float
) -> tuple[Any, dict[str, Any]]:
    """Run ``load`` while sampling ``pids``; once more if other load disturbed it; keep the quieter run."""
    result, sample = _Sample(pids).run(load)
    if sample["other_load_cores"] > retry_above:
        again, again_sample = _Sample(pids).run(load)
        again_sample["retried"] = True
        if again_sample["other_load_cores"] < sample["other_load_cores"]:
            return again, again_sample
        sample["retried"] = True
    return result, sample


class Harness:
    def __init__(self, opts: Options, sup: Supervisor) -> None:
        self.opts = opts
        self.sup = sup
        self.pinning = Pinning.plan(opts.pin)
        self.variants: dict[str, Variant] = {}
        self.contexts: dict[str, Context] = {}
        self.backend_pid = 0
        self.results: dict[str, Any] = {}
        self.loads: dict[str, H2Load] = {}
        wrk = wrk_binary()
        if wrk is None:
            raise StartError("wrk not found: run dev/bench-setup.sh (Debian package wrk)")
        self.wrk_bin = wrk
        h2load = h2load_binary()
        if h2load is None and any(VARIANTS[v].load != "http1" for v in opts.variants):
            raise StartError("h2load not found: run dev/bench-setup.sh (Debian package nghttp2-client)")
        self.h2load_bin = h2load

    # -- load generators ------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def _run_load(self, name: str, argv: list[str], timeout: float) -> str:
        """Run a load generator on the load CPU; its output (stdout and stderr) is returned."""
        proc = self.sup.start(name, argv, cpus=self.pinning.load, nice=self.opts.nice,
                              stdout=subprocess.PIPE, cwd=REPO, env=self._child_env())
        try:
            out, _ = proc.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.sup.stop(proc)
            raise RuntimeError(f"{name} did not finish within {timeout:.0f}s") from None
        self.sup.stop(proc)
        text = out.decode(errors="replace") if out else ""
        if proc.popen.returncode != 0:
            raise RuntimeError(f"{name} exited with {proc.popen.returncode}:\n{text[-2000:]}")
        return text

    def wrk(self, entry: tuple[str, int], seconds: float) -> dict[str, Any]:
        argv = wrk_argv(self.wrk_bin, entry[0], entry[1], self.opts.wrk_connections, seconds)
        r = parse_wrk(self._run_load("wrk", argv, timeout=seconds + 30))
        return {"requests": r.requests, "seconds": r.seconds, "rps": r.rps, "errors": r.errors}

    def h2load(self, entry: tuple[str, int], load: str, seconds: float) -> dict[str, Any]:
        assert self.h2load_bin is not None
        argv = h2load_argv(self.h2load_bin, entry[0], entry[1], self.loads[load], self.opts.h2_connections,
                           self.opts.h2_streams, duration=seconds)
        r = parse_h2load(self._run_load("h2load", argv, timeout=seconds + 30))
        return {"requests": r.requests, "seconds": r.seconds, "rps": r.rps, "errors": r.errors}

    def closed_loop(self, name: str, seconds: float) -> dict[str, Any]:
        """The variant's load as fast as it goes (wrk for HTTP/1, h2load for HTTP/2 and gRPC)."""
        variant = self.variants[name]
        if variant.load == "http1":
            return self.wrk(variant.entry, seconds)
        return self.h2load(variant.entry, variant.load, seconds)

    def openloop(self, entry: tuple[str, int], rate: float, seconds: float) -> dict[str, Any]:
        argv = [sys.executable, "-m", "bench.dataplane.openloop", entry[0], str(entry[1]), "--rate", str(rate),
                "--duration", str(seconds), "--connections", str(self.opts.openloop_connections)]
        out = self._run_load("openloop", argv, timeout=seconds + 60)
        return json.loads(out.strip().splitlines()[-1])

    # -- phases ---------------------------------------------------------------

    def start(self) -> None:
        opts = self.opts
        certs = issue_mesh_certs(self.sup.tempdir("pki"))
        backend_proc, backend = start_backend(self.sup, self.pinning, opts.nice)
        self.backend_pid = backend_proc.pid
        self.backend = backend
        loads = self.sup.tempdir("loads")
        (loads / "grpc-request.bin").write_bytes(GRPC_REQUEST)
        self.loads = {"h2": H2Load("/"), "grpc": H2Load(GRPC_PATH, loads / "grpc-request.bin", GRPC_HEADERS)}
        for name in opts.variants:
            variant = VARIANTS[name]()
            ctx = Context(self.sup.tempdir(name), backend.http1 if variant.load == "http1" else backend.h2c, certs)
            variant.start(ctx, self.sup, self.pinning, opts.nice)
            self.variants[name] = variant
            self.contexts[name] = ctx
            self.check_path(name)
        time.sleep(1.0)
        self.results["variants"] = {
            name: {
                "description": v.description,
                "load": v.load,
                "version": v.version(),
                "roles": list(v.procs),
                "compare_to": list(v.compare_to),
                "idle_rss": {role: rss_bytes(p.pid) for role, p in v.procs.items()},
            }
            for name, v in self.variants.items()
        }
        opts.log("started: " + ", ".join(
            f"{n} ({', '.join(f'{r} pid {p.pid}' for r, p in v.procs.items()) or 'nginx only'})"
            for n, v in self.variants.items()))

    def _pids(self, name: str) -> dict[str, int]:
        pids = {role: p.pid for role, p in self.variants[name].procs.items()}
        pids["backend"] = self.backend_pid
        return pids

    def throughput(self) -> None:
        opts = self.opts
        for name in self.variants:
            self.closed_loop(name, opts.warmup_seconds)
        rows = []
        for rnd in range(opts.rounds):
            for name in rotated(list(self.variants), rnd):
                load, sample = measure_quietly(
                    self._pids(name), functools.partial(self.closed_loop, name, opts.throughput_seconds),
                    opts.retry_other_load)
                rows.append({"variant": name, "round": rnd, **load, **sample})
                opts.log(f"  throughput round {rnd + 1}/{opts.rounds} {name:12s} {load['rps']:9.0f} req/s"
                         f"{'  errors ' + str(load['errors']) if load['errors'] else ''}{_noise(sample)}")
        self.results["throughput"] = rows

    def profile(self) -> None:
        """py-spy on each Tether proxy while wrk drives it at its maximum: where the time goes (measured last,
        so the sampling cannot disturb the figures above)."""
        from bench.dataplane import profile

        why = profile.available()
        names = [n for n in self.variants if n.startswith("tether")]
        if not names or self.opts.profile_seconds <= 0:
            return
        if why is not None:
            self.opts.log(f"no profile: {why}")
            return
        out: dict[str, Any] = {}
        for name in names:
            seconds = self.opts.profile_seconds
            variant = self.variants[name]
            pids = {role: p.pid for role, p in variant.procs.items() if role in ("client", "server")}
            running = profile.start(pids, seconds, self.sup.tempdir(f"profile-{name}"))
            load = self.closed_loop(name, seconds + 1.0)
            folded = profile.finish(running, timeout=seconds + 30)
            out[name] = {"rps": load["rps"], "roles": {role: profile.summarize(text) for role, text in folded.items()}}
            self.opts.log(f"  profiled {name} at {load['rps']:.0f} req/s: " + ", ".join(
                f"{role} {r['busy_samples']} busy samples" for role, r in out[name]["roles"].items()))
        self.results["profiles"] = out

    def callcount(self) -> None:
        """Python calls per request in each Tether proxy: count (``callcount``) while h2load sends a fixed
        number of requests through the variant, after every measurement (counting slows the proxy)."""
        from bench.dataplane import callcount

        n = self.opts.callcount_requests
        names = [name for name in self.variants if name.startswith("tether")]
        if not names or n <= 0 or self.h2load_bin is None:
            if names and n > 0:
                self.opts.log("no call count: h2load not installed (Debian package nghttp2-client)")
            return
        out: dict[str, Any] = {}
        for name in names:
            variant = self.variants[name]
            assert variant.plan_ is not None
            dirs = {role: Path(d) for role, d in variant.plan_.meta.get("calls", {}).items()}
            if not dirs:
                continue
            for d in dirs.values():
                for f in (callcount.ENABLED, callcount.RESULT):
                    (d / f).unlink(missing_ok=True)
            try:
                for role, d in dirs.items():
                    os.kill(variant.procs[role].pid, signal.SIGUSR1)
                for role, d in dirs.items():
                    _wait_for_file(d / callcount.ENABLED, f"{name}/{role} did not start counting")
                load = self.loads.get(variant.load, H2Load("/"))
                h1 = variant.load == "http1"
                argv = h2load_argv(self.h2load_bin, *variant.entry, load, 4, 1 if h1 else self.opts.h2_streams,
                                   requests=n, h1=h1)
                r = parse_h2load(self._run_load("h2load", argv, timeout=120))
            finally:
                for role in dirs:
                    os.kill(variant.procs[role].pid, signal.SIGUSR2)
            roles = {}
            for role, d in dirs.items():
                _wait_for_file(d / callcount.RESULT, f"{name}/{role} wrote no call count")
                counted = json.loads((d / callcount.RESULT).read_text())
                counted["requests"] = r.requests
                roles[role] = counted
            out[name] = {"requests": r.requests, "errors": r.errors, "roles": roles}
            self.opts.log(f"  calls per request, {name}: " + ", ".join(
                f"{role} {c['python_calls'] / max(r.requests, 1):.0f} Python + "
                f"{c['builtin_calls'] / max(r.requests, 1):.0f} builtin" for role, c in roles.items()))
        self.results["callcounts"] = out

    def choose_high(self) -> float:
        """The highest rate every variant sustains: start from a fraction of the lowest maximum
        throughput, probe each variant (slowest first) open loop, step down 20 % until all sustain it."""
        opts = self.opts
        if opts.high_rate:
            self.results["high_rate"] = opts.high_rate
            return opts.high_rate
        by_variant: dict[str, list[float]] = {}
        for row in self.results["throughput"]:
            if self.variants[row["variant"]].load == "http1":
                by_variant.setdefault(row["variant"], []).append(row["rps"])
        if not by_variant:
            self.results["high_rate"] = None
            return 0.0
        max_rps = {k: median(v) for k, v in by_variant.items()}
        candidate = choose_high_rate(max_rps, opts.high_fraction)
        probes = []
        order = sorted(max_rps, key=max_rps.__getitem__)
        seconds = min(2.0, opts.latency_seconds)
        for _attempt in range(6):
            failed = None
            for name in order:
                summary = self.openloop(self.variants[name].entry, candidate, seconds)
                probes.append({"variant": name, "rate": candidate, "sustained": summary["sustained"],
                               "p99_us": summary["latency_us"]["p99"], "end_backlog": summary["end_backlog"]})
                if not summary["sustained"]:
                    failed = name
                    break
            if failed is None:
                break
            opts.log(f"  {failed} does not sustain {candidate:.0f} req/s; trying lower")
            candidate = choose_high_rate({"x": candidate}, 0.8)
        self.results["high_rate"] = candidate
        self.results["high_probes"] = probes
        return candidate

    def generator_check(self, high: float) -> None:
        """The generator alone against nginx at twice the highest rate: does it keep its schedule?"""
        if not high:
            return
        rate = 2 * high
        summary = self.openloop(self.backend.http1, rate, self.opts.latency_seconds)
        self.results["generator_check"] = summary
        self.opts.log(f"  generator check: {rate:.0f} req/s against nginx alone: achieved "
                      f"{summary['achieved_rate']:.0f}, lag p99 {summary['gen_lag_us']['p99']:.0f} us, "
                      f"{'OVERLOADED' if summary['generator_overloaded'] else 'ok'}")

    def latency(self, rates: list[float]) -> None:
        opts = self.opts
        rows = []
        http1 = [name for name, v in self.variants.items() if v.load == "http1"]
        for rnd in range(opts.rounds if http1 else 0):
            for i, rate in enumerate(rates):
                seconds = opts.latency_duration(rate)
                for name in rotated(http1, rnd + i):
                    summary, sample = measure_quietly(
                        self._pids(name), functools.partial(self.openloop, self.variants[name].entry, rate, seconds),
                        opts.retry_other_load)
                    rows.append({"variant": name, "round": rnd, "rate": rate, "summary": summary, **sample})
                    lat = summary["latency_us"]
                    flags = ("" if summary["sustained"] else "  NOT SUSTAINED") + \
                            ("  generator overloaded" if summary["generator_overloaded"] else "") + _noise(sample)
                    opts.log(f"  latency round {rnd + 1}/{opts.rounds} {rate:7.0f}/s {name:12s} "
                             f"p50 {lat['p50']:8.0f}  p99 {lat['p99']:8.0f}  max {lat['max']:8.0f} us{flags}")
        self.results["latency"] = rows

    def check_path(self, name: str) -> None:
        """One request (or call) through the variant as its load sends them, or the run stops here."""
        variant = self.variants[name]
        if variant.load == "http1":
            check_path(name, variant.entry)
        elif variant.load == "grpc":
            check_grpc(name, variant.entry)
        else:
            assert self.h2load_bin is not None
            check_h2(name, variant.entry, self.h2load_bin)

    def churn(self) -> None:
        """RSS under connection churn: wrk with ``Connection: close`` (every request a new client connection)
        through each proxied HTTP/1 variant, the proxies' RSS read before and after each segment. Memory a
        closed connection leaves behind (garbage waiting for a collection that comes rarely) shows as growth."""
        opts = self.opts
        names = [n for n, v in self.variants.items() if v.load == "http1" and v.procs]
        if opts.churn_seconds <= 0 or not names:
            return
        out: dict[str, Any] = {}
        seconds = opts.churn_seconds / max(1, opts.churn_segments)
        for name in names:
            variant = self.variants[name]
            pids = {role: p.pid for role, p in variant.procs.items()}
            before = {role: rss_bytes(pid) for role, pid in pids.items()}
            segments = []
            for _ in range(max(1, opts.churn_segments)):
                argv = wrk_argv(self.wrk_bin, *variant.entry, opts.wrk_connections, seconds,
                                headers=("Connection: close",))
                r = parse_wrk(self._run_load("wrk", argv, timeout=seconds + 30))
                segments.append({"requests": r.requests, "rps": r.rps, "errors": r.errors,
                                 "rss": {role: rss_bytes(pid) for role, pid in pids.items()}})
            out[name] = {"rss_before": before, "segments": segments}
            opts.log(f"  churn {name}: {sum(s['requests'] for s in segments)} connections; RSS MB " + ", ".join(
                f"{role} {before[role] / 2**20:.1f} -> " + " -> ".join(f"{s['rss'][role] / 2**20:.1f}"
                                                                     for s in segments) for role in pids))
        self.results["churn"] = out

    def verify(self) -> None:
        for name, v in self.variants.items():
            checks = v.verify(self.contexts[name])
            self.results["variants"][name]["checks"] = [asdict(c) for c in checks]
            for c in checks:
                self.opts.log(f"  check {name}: [{'ok' if c.ok else 'FAILED'}] {c.what}: {c.detail}")


def _noise(sample: dict[str, Any]) -> str:
    other = sample["other_load_cores"]
    return (f"  (other load {other:.2f} CPUs{', retried' if sample.get('retried') else ''})"
            if other > 0.2 or sample.get("retried") else "")


GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")


def _wait_for_file(path: Path, what: str, timeout: float = 10.0) -> None:
    """A proxy answers a signal by writing a file; the handler runs on its event loop's next turn."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:.0f} s ({path})")
        time.sleep(0.02)


def check_grpc(name: str, entry: tuple[str, int]) -> None:
    """One unary call through the variant by a real gRPC client (grpcio): it checks the framing, the
    content-type and the ``grpc-status`` trailer; the answer must be the backend's message."""
    import grpc

    with grpc.insecure_channel(f"{entry[0]}:{entry[1]}") as channel:
        call = channel.unary_unary(GRPC_PATH, request_serializer=None, response_deserializer=None)
        try:
            answer = call(GRPC_REQUEST_MESSAGE, timeout=10)
        except grpc.RpcError as e:
            raise StartError(f"{name}: gRPC call through {entry[0]}:{entry[1]} failed: {e.code().name} "
                             f"{e.details()}") from e
    if answer != GRPC_RESPONSE_MESSAGE:
        raise StartError(f"{name}: gRPC call answered {answer!r}, want the backend's {GRPC_RESPONSE_MESSAGE!r}")


def check_h2(name: str, entry: tuple[str, int], h2load: Path) -> None:
    """Four HTTP/2 requests on one h2c connection through the variant: all 2xx with the 1 KiB body."""
    argv = h2load_argv(h2load, entry[0], entry[1], H2Load("/"), 1, 4, requests=4)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    try:
        r = parse_h2load(out)
    except ValueError as e:
        raise StartError(f"{name}: HTTP/2 requests through {entry[0]}:{entry[1]} failed: {e}") from e
    if r.requests != 4 or r.errors or r.data_bytes != 4 * BODY_SIZE:
        raise StartError(f"{name}: {r.requests} of 4 HTTP/2 requests succeeded ({r.errors} errors, "
                         f"{r.data_bytes} bytes of body, want {4 * BODY_SIZE})\n{out[-1500:]}")


def check_path(name: str, entry: tuple[str, int]) -> None:
    """One request through the variant: 200 with the 1 KiB body, or the run stops here."""
    conn = http.client.HTTPConnection(*entry, timeout=10)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        body = resp.read()
    except OSError as e:
        raise StartError(f"{name}: request through {entry[0]}:{entry[1]} failed: {e}") from e
    finally:
        conn.close()
    if resp.status != 200 or len(body) != BODY_SIZE:
        raise StartError(f"{name}: got status {resp.status} with {len(body)} bytes, want 200 with {BODY_SIZE}")


def machine_meta(opts: Options, pinning: Pinning) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pinning": pinning.describe(),
        "nice": opts.nice,
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "options": {k: v for k, v in asdict(opts).items() if k != "log"},
        "wrk": subprocess.run([str(wrk_binary()), "-v"], capture_output=True, text=True,
                              check=False).stdout.split("\n")[0] if wrk_binary() else "",
        "openloop": openloop.__doc__.splitlines()[0] if openloop.__doc__ else "",
        "h2load": subprocess.run([str(h2load_binary()), "--version"], capture_output=True, text=True,
                                 check=False).stdout.strip() if h2load_binary() else "",
    }


def run(opts: Options) -> dict[str, Any]:
    """Run the whole benchmark; returns the raw results (report.py turns them into Markdown and plots)."""
    unknown = [v for v in opts.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    old_affinity = os.sched_getaffinity(0)
    with Supervisor() as sup:
        h = Harness(opts, sup)
        h.results["meta"] = machine_meta(opts, h.pinning)
        if h.pinning.load:
            os.sched_setaffinity(0, h.pinning.load)
        try:
            t0 = time.monotonic()
            opts.log(f"variants: {', '.join(opts.variants)}; {h.pinning.describe()}; "
                     f"about {opts.estimate_seconds() / 60:.1f} min")
            h.start()
            opts.log("maximum throughput (closed loop: wrk for HTTP/1.1, h2load for HTTP/2 and gRPC)")
            h.throughput()
            high = h.choose_high()
            opts.log(f"high rate: {high:.0f} req/s" if high else "no HTTP/1 variant: no latency runs")
            h.generator_check(high)
            rates = sorted({high if r == HIGH else float(r) for r in opts.rates} - {0.0}) if high else []
            h.results["rates"] = rates
            opts.log("latency at fixed rates (open loop)")
            h.latency(rates)
            h.verify()
            opts.log("RSS under connection churn (a new connection per request)")
            h.churn()
            opts.log("profile (py-spy, at maximum throughput)")
            h.profile()
            opts.log(f"Python calls per request ({opts.callcount_requests} requests through each Tether variant)")
            h.callcount()
            h.results["meta"]["seconds"] = time.monotonic() - t0
            h.results["meta"]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
        finally:
            os.sched_setaffinity(0, old_affinity)
    return h.results
