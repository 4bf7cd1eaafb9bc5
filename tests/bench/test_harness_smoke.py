"""The data-plane benchmark harness starts, measures a tiny run and stops everything; its pure pieces compute right.

Benchmarks never run in the suite: this only checks that the harness works, in seconds. Tests that need
nginx or wrk (Debian packages from dev/setup.sh and dev/bench-setup.sh) skip without them; nothing here
needs Envoy, HAProxy or matplotlib.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import ssl
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.dataplane import openloop, report, runner  # noqa: E402
from bench.dataplane.backend import nginx_binary, start_backend  # noqa: E402
from bench.dataplane import callcount  # noqa: E402
from bench.dataplane.backend import GRPC_RESPONSE, GRPC_RESPONSE_MESSAGE, grpc_frame  # noqa: E402
from bench.dataplane.closedloop import H2Load, h2load_argv, h2load_binary, parse_h2load, parse_wrk, wrk_argv, wrk_binary  # noqa: E402
from bench.dataplane.pki import issue_mesh_certs  # noqa: E402
from bench.dataplane.procs import Pinning, Supervisor, stop_process  # noqa: E402
from bench.dataplane.procstat import MachineTimes, cpu_seconds, parse_stat_cpu, peak_rss_bytes, rss_bytes  # noqa: E402
from bench.dataplane.report import proxy_roles  # noqa: E402
from bench.dataplane.variants import VARIANTS, Context  # noqa: E402
from bench.dataplane.variants.envoy import envoy_configs  # noqa: E402
from bench.dataplane.variants.haproxy import haproxy_configs  # noqa: E402

needs_nginx = pytest.mark.skipif(nginx_binary() is None, reason="nginx not installed (dev/setup.sh)")
needs_wrk = pytest.mark.skipif(wrk_binary() is None, reason="wrk not installed (dev/bench-setup.sh)")
needs_h2load = pytest.mark.skipif(h2load_binary() is None, reason="h2load not installed (nghttp2-client, dev/setup.sh)")


# -- the open-loop generator's pure pieces ---------------------------------------------------


def test_parse_head_waits_for_the_whole_head_then_gives_status_and_length() -> None:
    head = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 1024\r\n\r\n"
    assert openloop.parse_head(head[:20]) is None
    assert openloop.parse_head(head) == (200, len(head) + 1024)
    assert openloop.parse_head(b"HTTP/1.1 503 Busy\r\ncontent-length:3\r\n\r\nabc") == (503, 42)


@pytest.mark.parametrize("bad", [b"SSH-2.0-x\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])
def test_parse_head_rejects_what_it_cannot_frame(bad: bytes) -> None:
    with pytest.raises(ValueError):
        openloop.parse_head(bad)


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 1001))
    assert openloop.percentile(values, 50) == 500
    assert openloop.percentile(values, 99.9) == 999
    assert openloop.percentile(values, 100) == 1000
    assert openloop.percentile([], 50) == 0.0


def test_summary_judges_sustained_and_overload() -> None:
    ok = openloop.summarize(100, 1.0, 4, 100, 100, 0, [0.001] * 100, [0.000001] * 100, 0, 0, 1)
    assert ok.sustained and not ok.generator_overloaded
    assert ok.latency_us["p99"] == pytest.approx(1000) and ok.achieved_rate == 100
    saturated = openloop.summarize(100, 1.0, 4, 100, 100, 0, [0.5] * 100, [0.0] * 100, 90, 60, 60)
    assert not saturated.sustained
    late = openloop.summarize(100, 1.0, 4, 100, 90, 0, [0.001] * 90, [0.001] * 90, 0, 10, 14)
    assert late.generator_overloaded and not late.sustained
    assert json.loads(ok.to_json())["scheduled"] == 100


# -- harness arithmetic ----------------------------------------------------------------------


def test_high_rate_is_a_fraction_of_the_slowest_rounded_down() -> None:
    assert runner.choose_high_rate({"direct": 90000, "envoy": 7304, "haproxy": 15000}, 0.75) == 5400
    assert runner.choose_high_rate({"a": 120}, 0.75) == 90
    assert runner.choose_high_rate({"a": 1}, 0.5) == 1


def test_rotation_interleaves_every_variant_first_once() -> None:
    names = ["direct", "envoy", "haproxy"]
    firsts = {runner.rotated(names, k)[0] for k in range(3)}
    assert firsts == set(names)
    assert sorted(runner.rotated(names, 5)) == sorted(names)


def test_parse_wrk() -> None:
    out = """Running 5s test @ http://127.0.0.1:1/
  1 threads and 32 connections
  97555 requests in 3.04s, 109.88MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  32088.72
"""
    r = parse_wrk(out)
    assert (r.requests, r.seconds, r.errors) == (97555, 3.04, 7)
    assert r.rps == pytest.approx(97555 / 3.04)


def test_parse_h2load_counts_only_2xx_as_done() -> None:
    out = """finished in 2.00s, 4000.00 req/s, 277.60KB/s
requests: 8011 total, 8024 started, 8011 done, 8000 succeeded, 11 failed, 11 errored, 0 timeout
status codes: 7990 2xx, 0 3xx, 10 4xx, 0 5xx
traffic: 555.20KB (568528) total, 375.00KB (384000) headers (space savings 51.02%), 39.06KB (40000) data
"""
    r = parse_h2load(out)
    assert (r.requests, r.seconds, r.errors, r.data_bytes) == (7990, 2.0, 32, 40000)
    with pytest.raises(ValueError):
        parse_h2load("h2load: could not connect")


def test_h2load_argv_for_grpc_and_http1(tmp_path: Path) -> None:
    grpc_load = H2Load("/bench.Echo/Ping", tmp_path / "req.bin", ("content-type: application/grpc", "te: trailers"))
    argv = h2load_argv(Path("/usr/bin/h2load"), "127.0.0.1", 8080, grpc_load, 8, 4, duration=5)
    assert argv[-1] == "http://127.0.0.1:8080/bench.Echo/Ping"
    assert "-c8" in argv and "-m4" in argv and "-D5" in argv
    assert argv[argv.index("-d") + 1] == str(tmp_path / "req.bin")
    assert argv.count("-H") == 2
    h1 = h2load_argv(Path("h2load"), "h", 1, H2Load(), 4, 4, requests=100, h1=True)
    assert "--h1" in h1 and "-m1" in h1 and "-n100" in h1


def test_grpc_frame_is_length_prefixed() -> None:
    assert grpc_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert GRPC_RESPONSE[5:] == GRPC_RESPONSE_MESSAGE and GRPC_RESPONSE_MESSAGE[0] == 0x0A  # field 1, a string


def test_callcount_summary_splits_python_and_builtin_calls() -> None:
    import cProfile

    def leaf() -> int:
        return len("abc")

    def work() -> None:
        for _ in range(10):
            leaf()

    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    s = callcount.summarize(profiler.getstats())
    assert s["python_calls"] >= 11 and s["builtin_calls"] >= 10
    assert s["top"][0][1] == 10 and "leaf" in s["top"][0][0]


def test_callcount_counts_between_signals_in_a_uvloop_process(tmp_path: Path) -> None:
    """The wrapper runs a module as __main__; SIGUSR1/SIGUSR2 reach it while uvloop waits, as in an idle proxy."""
    import signal
    import subprocess
    import time

    rounds = tmp_path / "rounds"
    (tmp_path / "busy.py").write_text(
        "import asyncio, pathlib, uvloop\n"
        "def tick(): return 1\n"
        "async def main():\n"
        "    n = 0\n"
        "    while True:\n"
        "        for _ in range(100): tick()\n"
        "        n += 1\n"
        f"        pathlib.Path({str(rounds)!r}).write_text(str(n))\n"
        "        await asyncio.sleep(0.01)\n"
        "uvloop.run(main())\n")
    env = {**os.environ, callcount.ENV: str(tmp_path / "calls"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-m", "bench.dataplane.callcount", "busy"], env=env)

    def until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not done():
            assert proc.poll() is None and time.monotonic() < deadline, "the process did not get there"
            time.sleep(0.02)

    def rounds_done() -> int:
        try:
            return int(rounds.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    try:
        until(lambda: rounds_done() > 0)  # its loop runs: the handlers were installed before the module
        proc.send_signal(signal.SIGUSR1)
        until((tmp_path / "calls" / callcount.ENABLED).exists)
        counted_from = rounds_done()
        until(lambda: rounds_done() >= counted_from + 3)  # two whole rounds while counting
        proc.send_signal(signal.SIGUSR2)
        until((tmp_path / "calls" / callcount.RESULT).exists)
    finally:
        proc.kill()
        proc.wait()
    counted = json.loads((tmp_path / "calls" / callcount.RESULT).read_text())
    ticks = {name: n for name, n in counted["top"] if name.startswith("tick ")}
    assert sum(ticks.values()) >= 200 and counted["python_calls"] >= 200 and counted["builtin_calls"] > 0


def test_gc_stats_count_each_generations_passes(tmp_path: Path) -> None:
    stats = callcount._GcStats(tmp_path)
    for gen, freed in ((0, 3), (0, 4), (2, 10)):
        stats("start", {"generation": gen, "collected": 0})
        stats("stop", {"generation": gen, "collected": freed})
    stats.write()
    written = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    passes = {int(gen): entry for gen, entry in written["passes"].items()}
    assert [passes[g][0] for g in (0, 1, 2)] == [2, 0, 1] and [passes[g][3] for g in (0, 1, 2)] == [7, 0, 10]
    assert passes[0][1] >= passes[0][2] >= 0 and written["thresholds"] == list(gc.get_threshold())
    slowest = written["slowest"]  # every pass here, the longest first, each with its generation
    assert sorted(row[1] for row in slowest) == [0, 0, 2] and [row[2] for row in slowest] == sorted(
        (row[2] for row in slowest), reverse=True)


def test_proc_readings() -> None:
    line = "123 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0"
    assert parse_stat_cpu(line) == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))
    assert rss_bytes(os.getpid()) > 1_000_000 and cpu_seconds(os.getpid()) > 0
    assert rss_bytes(2**22 + 12345) == 0
    assert peak_rss_bytes(os.getpid()) >= rss_bytes(os.getpid()) and peak_rss_bytes(2**22 + 12345) == 0
    t = MachineTimes.parse("cpu  100 0 50 800 50 7 9 0 0 0")
    assert t.busy * os.sysconf("SC_CLK_TCK") == pytest.approx(150)


def test_stop_process_terminates_and_kills_what_ignores_sigterm() -> None:
    import signal
    import subprocess

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stop_process(polite, 30)
    assert polite.returncode == -signal.SIGTERM
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
                                 "time.sleep(600)"], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    stop_process(stubborn, 0.2)
    assert stubborn.returncode == -signal.SIGKILL
    stop_process(stubborn, 0.2)  # already gone: nothing to do


# -- certificates and proxy configs ----------------------------------------------------------


def _ctx(tmp_path: Path) -> Context:
    return Context(tmp_path, ("127.0.0.1", 8080), issue_mesh_certs(tmp_path / "pki"))


def test_mesh_certs_carry_mtls_between_the_two_identities(tmp_path: Path) -> None:
    certs = issue_mesh_certs(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    server_ctx.load_cert_chain(certs.server.chain, certs.server.key)
    server_ctx.load_verify_locations(certs.anchor)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_cert_chain(certs.client.chain, certs.client.key)
    client_ctx.load_verify_locations(certs.anchor)
    a, b = socket.socketpair()
    seen: dict[str, object] = {}

    def serve() -> None:
        with server_ctx.wrap_socket(a, server_side=True) as tls:
            seen["peer"] = tls.getpeercert()
            seen["version"] = tls.version()

    t = threading.Thread(target=serve)
    t.start()
    with client_ctx.wrap_socket(b, server_hostname=certs.server.name) as tls:
        assert tls.version() == "TLSv1.3"
    t.join(5)
    for leaf in (certs.client, certs.server):
        key = x509.load_pem_x509_certificate(leaf.chain.read_bytes()).public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    sans = dict(seen["peer"]["subjectAltName"])  # type: ignore[index]
    assert sans["DNS"] == certs.client.name and certs.client.name.startswith("bench-client.bench.serviceaccount.")
    assert seen["version"] == "TLSv1.3"


def test_envoy_configs_are_fair(tmp_path: Path) -> None:
    client, server = envoy_configs(_ctx(tmp_path), 1001, 1002, (1003, 1004))
    text = json.dumps([client, server])
    assert '"generate_request_id": false' in text and "access_log" not in text
    assert text.count('"tls_minimum_protocol_version": "TLSv1_3"') == 2
    assert '"suppress_envoy_headers": true' in text
    limits = client["static_resources"]["clusters"][0]["circuit_breakers"]["thresholds"][0]
    assert min(v for k, v in limits.items() if k.startswith("max_")) >= 1_000_000
    tls = server["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True


def test_haproxy_configs_are_fair(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    client, server = haproxy_configs(ctx, "http", 1001, 1002)
    for cfg in (client, server):
        assert "nbthread 1" in cfg and "ssl-min-ver TLSv1.3" in cfg and "mode http" in cfg
        assert "http-reuse always" in cfg and "pool-purge-delay 1h" in cfg and "log " not in cfg
    assert "verify required" in server and ctx.certs.client.name in server
    tcp_client, _ = haproxy_configs(ctx, "tcp", 1001, 1002)
    assert "mode tcp" in tcp_client and "http-reuse" not in tcp_client


def test_envoy_h2_configs_speak_http2_on_every_hop(tmp_path: Path) -> None:
    client, server = envoy_configs(_ctx(tmp_path), 1001, 1002, (1003, 1004), h2=True)
    for cfg in (client, server):
        hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        assert hcm["codec_type"] == "HTTP2"
        opts = cfg["static_resources"]["clusters"][0]["typed_extension_protocol_options"]
        assert "http2_protocol_options" in json.dumps(opts)
    text = json.dumps([client, server])
    assert text.count('"alpn_protocols": ["h2"]') == 2


def test_haproxy_h2_configs_speak_http2_on_every_hop(tmp_path: Path) -> None:
    client, server = haproxy_configs(_ctx(tmp_path), "http", 1001, 1002, h2=True)
    assert "bind 127.0.0.1:1001 proto h2" in client and "alpn h2" in client
    assert "alpn h2" in server and server.rstrip().endswith("proto h2 pool-purge-delay 1h")
    with pytest.raises(AssertionError):
        haproxy_configs(_ctx(tmp_path), "tcp", 1001, 1002, h2=True)


def test_variants_are_registered_with_names_and_descriptions() -> None:
    assert {"direct", "envoy", "haproxy", "haproxy-tcp"} <= set(VARIANTS)
    for load in ("h2", "grpc"):
        assert {f"direct-{load}", f"envoy-{load}", f"haproxy-{load}", f"tether-{load}"} <= set(VARIANTS)
    for name, cls in VARIANTS.items():
        assert cls.name == name and cls.description
        assert all(other in VARIANTS for other in cls.compare_to)
        # ratios compare like with like
        assert all(VARIANTS[other].load == cls.load for other in cls.compare_to)


# -- report -------------------------------------------------------------------------------------


def _fake_results() -> dict:
    def lat(base: float) -> dict:
        return {"latency_us": {"p50": base, "p90": base * 2, "p99": base * 4, "p99.9": base * 8, "max": base * 9},
                "gen_lag_us": {"p50": 1, "p99": 20, "max": 30}, "sustained": True, "generator_overloaded": False,
                "completed": 500, "sent": 500, "connections": 32}

    variants = {
        "direct": {"description": "d", "roles": [], "compare_to": [], "idle_rss": {}},
        "envoy": {"description": "e", "roles": ["server", "client"], "compare_to": ["haproxy"],
                  "idle_rss": {"client": 70 << 20, "server": 69 << 20},
                  "checks": [{"what": "TLS 1.3", "ok": True, "detail": "yes"}]},
        "haproxy": {"description": "h", "roles": ["server", "client"], "compare_to": [],
                    "idle_rss": {"client": 20 << 20, "server": 15 << 20}},
    }
    thr = []
    latency = []
    for name, rps, base, cpu in (("direct", 90000, 100, 0), ("envoy", 7000, 500, 0.5), ("haproxy", 15000, 300, 0.4)):
        roles = variants[name]["roles"]
        thr.append({"variant": name, "round": 0, "rps": rps, "requests": rps * 5, "seconds": 5, "errors": 0,
                    "cpu": {r: cpu for r in roles}, "rss_peak": {r: 30 << 20 for r in roles},
                    "other_load_cores": 0.01})
        for rate in (100.0, 5000.0):
            latency.append({"variant": name, "round": 0, "rate": rate, "summary": lat(base),
                            "cpu": {r: cpu / 10 for r in roles}, "rss_peak": {}, "other_load_cores": 0.0})
    return {"meta": {"started": "now", "options": {"rounds": 1, "high_fraction": 0.75}}, "variants": variants,
            "throughput": thr, "latency": latency, "rates": [100.0, 5000.0], "high_rate": 5000.0}


def test_report_shows_call_counts_per_request() -> None:
    res = _fake_results()
    counted = {"python_calls": 290_000, "builtin_calls": 500_000, "requests": 1000,
               "top": [["Codec.feed (tether/proxy/x.py:1)", 4000]]}
    res["callcounts"] = {"tether-http": {"requests": 1000, "errors": 0,
                                         "roles": {"client": counted, "server": counted}}}
    text = report.render(res)
    assert "| tether-http | client | 1,000 | 290.0 | 500.0 |" in text
    assert "| `Codec.feed (tether/proxy/x.py:1)` | 4.00 |" in text


def test_report_shows_rss_under_connection_churn() -> None:
    res = _fake_results()
    segment = {"requests": 3000, "rps": 1000.0, "errors": 0}
    res["churn"] = {"envoy": {"rss_before": {"client": 40 << 20, "server": 30 << 20},
                              "segments": [{**segment, "rss": {"client": (41 + i) << 20, "server": 30 << 20}}
                                           for i in range(3)]}}
    text = report.render(res)
    assert "## RSS under connection churn" in text
    assert "| envoy | client | 40.0 | 41.0 → 42.0 → 43.0 | 9,000 | 1,000 |" in text


def test_churn_load_asks_for_a_new_connection_per_request() -> None:
    argv = wrk_argv(Path("/usr/bin/wrk"), "127.0.0.1", 80, 32, 4.0, headers=("Connection: close",))
    assert argv[argv.index("-H") + 1] == "Connection: close" and argv[-1] == "http://127.0.0.1:80/"


def test_report_renders_absolute_added_and_ratio_figures() -> None:
    res = _fake_results()
    text = report.render(res, ["latency.png"])
    assert "## Maximum throughput" in text and "| envoy | HTTP/1.1 | 7,000 |" in text
    assert "## Added latency over direct" in text and "+400" in text  # envoy p50 500 - direct 100
    assert "| envoy / haproxy | 0.47 |" in text
    assert "✅ **envoy**: TLS 1.3" in text and "![latency.png](latency.png)" in text
    m = report.summary_metrics(res, "envoy")
    assert m["cpu_per_1k_max"] == pytest.approx(2 * 0.5 / 35000 * 1000)
    assert m["rss_load_max"] == 30 << 20


# -- the real thing, tiny ----------------------------------------------------------------------


@needs_nginx
def test_openloop_against_nginx_and_everything_stops(tmp_path: Path) -> None:
    with Supervisor() as sup:
        proc, backend = start_backend(sup, Pinning(None, None), nice=0)
        host, port = backend.http1
        s = openloop.run(host, port, rate=200, duration=0.3, connections=4)
        workdirs = list(sup.tmpdirs)
    assert s.scheduled == 60 and s.completed == 60 and s.errors == 0 and s.sustained
    assert 0 < s.latency_us["p50"] < 100_000
    assert proc.popen.poll() is not None
    assert not any(d.exists() for d in workdirs)


@needs_nginx
@needs_wrk
def test_tiny_run_of_the_direct_variant() -> None:
    opts = runner.Options(variants=["direct"], rounds=1, throughput_seconds=1, latency_seconds=0.3, min_samples=10,
                          rates=["100", runner.HIGH], high_rate=300, warmup_seconds=1, nice=0, pin=False,
                          log=lambda line: None)
    res = runner.run(opts)
    (thr,) = res["throughput"]
    assert thr["rps"] > 100 and thr["errors"] == 0
    assert [r["rate"] for r in res["latency"]] == [100.0, 300.0]
    assert all(r["summary"]["completed"] == r["summary"]["scheduled"] for r in res["latency"])
    assert res["generator_check"]["target_rate"] == 600
    assert "| direct |" in report.render(res)


@needs_nginx
@needs_h2load
def test_tiny_run_of_the_http2_and_grpc_baselines() -> None:
    """h2load through nginx's h2c port; a grpcio client checked the gRPC path before the run (check_grpc)."""
    opts = runner.Options(variants=["direct-h2", "direct-grpc"], rounds=1, throughput_seconds=1, warmup_seconds=1,
                          nice=0, pin=False, log=lambda line: None)
    res = runner.run(opts)
    rows = {r["variant"]: r for r in res["throughput"]}
    assert set(rows) == {"direct-h2", "direct-grpc"}
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in rows.values())
    assert res["latency"] == [] and res["high_rate"] is None  # the open-loop generator speaks HTTP/1.1 only
    text = report.render(res)
    assert "| direct-grpc | gRPC unary |" in text and "## Latency" not in text


@needs_nginx
def test_grpc_check_fails_on_a_path_that_is_not_grpc() -> None:
    with Supervisor() as sup:
        _, backend = start_backend(sup, Pinning(None, None), nice=0)
        runner.check_grpc("direct-grpc", backend.h2c)  # the backend's answer, through a real gRPC client
        with pytest.raises(runner.StartError, match="gRPC call"):
            runner.check_grpc("http1-port", backend.http1)


def test_profile_summary_leaves_idle_out_and_names_areas() -> None:
    from bench.dataplane import profile

    folded = "\n".join([
        "main;run;epoll_wait (libc.so.6) 50",  # a waiting thread: not work
        "main;run;Http1Connection._read_head (tether/proxy/codec/http1.py:358) 30",
        "main;run;write (libc.so.6) 20",
        "main;run;_forward (tether/proxy/core/http1_proxy.py:200) 10",
        "main;run;SSLObject.read (ssl.py:921) 40",
        "garbage line",
    ])
    s = profile.summarize(folded)
    assert (s["busy_samples"], s["idle_samples"]) == (100, 50)
    assert s["areas"] == {"TLS": 0.4, "HTTP/1 codec": 0.3, "syscalls": 0.2, "HTTP layer": 0.1}
    assert s["top"][0] == ["SSLObject.read (ssl.py:921)", 0.4]
    res = {"profiles": {"tether-http": {"rps": 1234.0, "roles": {"client": s, "server": s}}}}
    text = "\n".join(report.profile_section(res))
    assert "### tether-http (1,234 req/s while sampled)" in text
    assert "| TLS | 40.0 % | 40.0 % |" in text


def _tiny_tether_run(variant: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One short round of a Tether variant at 100 req/s (no profile, no call count): its requests went through
    without an error and its own checks passed; its results and those checks."""
    opts = runner.Options(variants=[variant], rounds=1, throughput_seconds=1, latency_seconds=0.3,
                          min_samples=10, rates=["100"], warmup_seconds=1, nice=0, pin=False, profile_seconds=0,
                          callcount_requests=0, log=lambda line: None)
    res = runner.run(opts)
    (thr,) = res["throughput"]
    assert thr["requests"] > 0 and thr["errors"] == 0
    checks = res["variants"][variant]["checks"]
    assert checks and all(c["ok"] for c in checks), checks
    return res, checks


@needs_nginx
@needs_wrk
def test_tiny_run_of_the_tether_http_variant() -> None:
    """The Tether variants start their own control plane and store: a request through the pair reaches nginx.

    Once the bench's store lacked the server's EndpointSlice and every request answered 504; only this catches it.
    The destination hints the server h2, so the HTTP/1 load went between the proxies over HTTP/2 (l5d-orig-proto),
    on one connection.
    """
    _, checks = _tiny_tether_run("tether-http")
    assert "(session_protocol http1: 0, http2: 1)" in _seen_by_server(checks)


@needs_nginx
@needs_wrk
def test_tiny_run_of_the_tether_http_variant_without_the_upgrade() -> None:
    """tether-http-h1: the destination does not hint h2, and HTTP/1 stays HTTP/1 between the proxies."""
    _, checks = _tiny_tether_run("tether-http-h1")
    assert "http2: 0)" in _seen_by_server(checks) and "(session_protocol http1: 0," not in _seen_by_server(checks)


def _seen_by_server(checks: list[dict[str, Any]]) -> str:
    """The detail of the check on what the server proxy saw of the client's connections."""
    return next(c["detail"] for c in checks if c["what"].startswith("server proxy saw the client identity"))


@needs_nginx
@needs_wrk
def test_tiny_run_of_the_tether_http_policy_variant() -> None:
    """With a policy controller: every request through the pair is authorized by the AuthorizationPolicy on the
    HTTPRoute (the variant's own check reads the server proxy's inbound_http_authz_allow_total)."""
    _, checks = _tiny_tether_run("tether-http-policy")
    assert any("AuthorizationPolicy" in c["what"] for c in checks)


@needs_nginx
@needs_wrk
def test_tiny_run_of_the_tether_http_tapped_variant() -> None:
    """A tap open on both proxies (the tap controller's loop, as the tap identity): the watcher received events,
    and its process is not counted as a proxy."""
    res, checks = _tiny_tether_run("tether-http-tapped")
    tap = [c for c in checks if "tap stayed open" in c["what"]]
    assert tap and int(tap[0]["detail"].split()[0]) > 0, tap
    assert "tap-watch" not in proxy_roles(res, "tether-http-tapped")


def test_ratio_over_an_added_latency_not_above_zero_is_left_out() -> None:
    assert report._ratio(-1234.0, -420.0) == "–"  # both under direct's tail: noise, not 2.94
    assert report._ratio(500.0, 0.0) == "–"
    assert report._ratio(300.0, 600.0) == "0.50"
