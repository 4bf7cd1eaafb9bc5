"""From raw results (results.json) to the Markdown report: medians, added latency, ratios.

Everything here is pure (a dict in, text out) so the report can be rebuilt
from a saved results.json (``./run bench mesh -- --report-only DIR``) and is
tested without running anything.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

from bench.dataplane.runner import median

PCTS = ("p50", "p90", "p99", "p99.9", "max")
PROXY_ROLES = ("client", "server")
MB = 1024 * 1024


# -- aggregation --------------------------------------------------------------


def variant_names(res: dict[str, Any]) -> list[str]:
    return list(res.get("variants", {}))


def load_of(res: dict[str, Any], variant: str) -> str:
    return str(res["variants"][variant].get("load", "http1"))


def baseline_of(res: dict[str, Any], variant: str) -> str | None:
    """The proxy-less variant of the same load (direct, direct-h2, direct-grpc), if it ran."""
    load = load_of(res, variant)
    for name, v in res.get("variants", {}).items():
        if not v.get("roles") and v.get("load", "http1") == load:
            return name
    return None


LOAD_LABELS = {"http1": "HTTP/1.1", "h2": "HTTP/2", "grpc": "gRPC unary"}


def max_throughput(res: dict[str, Any], variant: str) -> list[float]:
    return [r["rps"] for r in res.get("throughput", []) if r["variant"] == variant]


def latency_rows(res: dict[str, Any], variant: str, rate: float) -> list[dict[str, Any]]:
    return [r for r in res.get("latency", []) if r["variant"] == variant and r["rate"] == rate]


def latency_median(res: dict[str, Any], variant: str, rate: float) -> dict[str, float]:
    rows = latency_rows(res, variant, rate)
    return {p: median([r["summary"]["latency_us"][p] for r in rows]) for p in PCTS}


def added_latency(res: dict[str, Any], variant: str, rate: float, baseline: str = "direct") -> dict[str, float]:
    if baseline not in res.get("variants", {}):
        return {p: math.nan for p in PCTS}
    mine, base = latency_median(res, variant, rate), latency_median(res, baseline, rate)
    return {p: mine[p] - base[p] for p in PCTS}


def proxy_roles(res: dict[str, Any], variant: str) -> list[str]:
    return [r for r in res["variants"][variant].get("roles", []) if r in PROXY_ROLES]


def _requests(row: dict[str, Any]) -> float:
    if "requests" in row:
        return float(row["requests"])
    s = row["summary"]
    return float(s["sent"] + s["connections"])  # the warm-up request on each connection went through too


def cpu_per_1k(rows: Iterable[dict[str, Any]], roles: list[str]) -> dict[str, float]:
    """Median over rows of CPU seconds per 1,000 requests, per role and in total."""
    rows = list(rows)
    out: dict[str, float] = {}
    for role in roles:
        out[role] = median([r["cpu"].get(role, 0.0) / _requests(r) * 1000 for r in rows if _requests(r)])
    out["total"] = median([sum(r["cpu"].get(role, 0.0) for role in roles) / _requests(r) * 1000
                           for r in rows if _requests(r)]) if roles else math.nan
    return out


def rss_under_load(res: dict[str, Any], variant: str) -> dict[str, float]:
    """Median over the maximum-throughput rounds of each proxy's peak RSS, in bytes."""
    rows = [r for r in res.get("throughput", []) if r["variant"] == variant]
    return {role: median([r["rss_peak"].get(role, 0) for r in rows]) for role in proxy_roles(res, variant)}


def summary_metrics(res: dict[str, Any], variant: str) -> dict[str, float]:
    """One number per headline metric, for ratios and targets."""
    roles = proxy_roles(res, variant)
    m: dict[str, float] = {"max_rps": median(max_throughput(res, variant))}
    for rate in res.get("rates", []):
        m[f"added_p99@{rate:g}"] = added_latency(res, variant, rate)["p99"]
    thr = [r for r in res.get("throughput", []) if r["variant"] == variant]
    m["cpu_per_1k_max"] = cpu_per_1k(thr, roles)["total"] if roles else math.nan
    high = res.get("high_rate")
    if high is not None:
        m["cpu_per_1k_high"] = cpu_per_1k(latency_rows(res, variant, high), roles)["total"] if roles else math.nan
    rss = rss_under_load(res, variant)
    m["rss_load_max"] = max(rss.values()) if rss else math.nan
    return m


def ratio_pairs(res: dict[str, Any]) -> list[tuple[str, str]]:
    names = variant_names(res)
    return [(a, b) for a in names for b in res["variants"][a].get("compare_to", []) if b in names]


# -- formatting -----------------------------------------------------------------


def _n(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def _signed(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:+,.0f}"


def _ratio(a: float, b: float) -> str:
    """``a / b``; "–" when ``b`` is not above zero: an added latency at or below direct's (the run's noise at that
    percentile) divides into nothing readable (two negatives made 2.94 of a tail 1.2 ms under Envoy's)."""
    if any(math.isnan(v) for v in (a, b)) or b <= 0:
        return "–"
    return f"{a / b:.2f}"


def _mb(x: float) -> str:
    return _n(x / MB, 1)


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = [header, sep, *rows]
    return ["| " + " | ".join(cells) + " |" for cells in lines]


def _per_proxy(results: dict[str, Any], key: str) -> Iterator[tuple[str, dict[str, Any], str, Any]]:
    """(variant, its result, proxy, what ``result[key]`` holds for that proxy) for each proxy of each variant."""
    for name, result in results.items():
        for role, of_role in result[key].items():
            yield name, result, role, of_role


def _rate(rate: float, high: float | None) -> str:
    return f"{rate:,.0f} req/s" + (" (high)" if high is not None and rate == high else "")


def render(res: dict[str, Any], plots: Iterable[str] = ()) -> str:
    meta = res.get("meta", {})
    opts = meta.get("options", {})
    names = variant_names(res)
    rates: list[float] = res.get("rates", [])
    high = res.get("high_rate")
    out: list[str] = [f"# Data-plane benchmark, {meta.get('started', '')}", ""]
    out += [
        "Each variant carries requests from a load generator to the same nginx backend (1 KiB body, status "
        "200; gRPC: a unary call answered with one 66-byte message and grpc-status 0): HTTP/1.1, HTTP/2 or "
        "gRPC over h2c as its load says; the proxied variants pass through a client-side and a server-side proxy with mTLS "
        "(TLS 1.3, ECDSA P-256) between them. All variants ran side by side and were measured in turn, "
        "interleaved and in rotated order, so drift of the machine hits all alike. Figures are medians over "
        f"{opts.get('rounds', '?')} round(s); latencies are in microseconds.",
        "",
        "## Setup",
        "",
    ]
    versions = "; ".join(f"{n}: {res['variants'][n].get('version') or '?'}" for n in names)
    measured = res.get("throughput", []) + res.get("latency", [])
    other = [r.get("other_load_cores", 0.0) for r in measured]
    retried = sum(1 for r in measured if r.get("retried"))
    setup_rows = [
        ["machine", f"{meta.get('cpu_model', '?')}, {meta.get('cpus', '?')} CPUs, Linux {meta.get('kernel', '?')}"],
        ["pinned", meta.get("pinning", "?")],
        ["priority", f"nice {meta.get('nice', 0)} for the proxies, the backend and the load generators"],
        ["software", f"{versions}; {meta.get('wrk', 'wrk')}; {meta.get('h2load') or 'no h2load'}; "
                     f"Python {meta.get('python', '?')}"],
        ["maximum throughput", f"HTTP/1.1: wrk, 1 thread, {opts.get('wrk_connections', '?')} keep-alive "
                               f"connections; HTTP/2 and gRPC: h2load, 1 thread, {opts.get('h2_connections', '?')} "
                               f"connections × {opts.get('h2_streams', '?')} streams in flight; "
                               f"{opts.get('throughput_seconds', '?')} s per run"],
        ["latency", f"open loop (bench/dataplane/openloop.py): steady schedule, "
                    f"{opts.get('openloop_connections', '?')} keep-alive connections, latency from the scheduled "
                    f"send time; {opts.get('latency_seconds', '?')} s per run, longer at low rates to collect "
                    f"{opts.get('min_samples', '?')} samples"],
        ["rates", ", ".join(_rate(r, high) for r in rates) + (
            "; high = the highest rate every variant sustained in short open-loop probes, starting at "
            f"{opts.get('high_fraction', 0):.0%} of the lowest maximum throughput and stepping down by 20 %"
            if res.get("high_probes") else "; high rate given on the command line" if high else "")],
        ["other load on the machine", f"load average {' '.join(meta.get('loadavg_before', []))} before, "
                                      f"{' '.join(meta.get('loadavg_after', []))} after; during measurements a "
                                      f"median of {median(other) if other else math.nan:.2f} CPUs busy with "
                                      f"processes not in the benchmark (max {max(other, default=0):.2f}); "
                                      f"{retried} of {len(measured)} measurements run twice because of it"],
        ["duration", f"{meta.get('seconds', 0) / 60:.1f} min"],
    ]
    out += _table(["", ""], [[a, b] for a, b in setup_rows], "ll") + [""]
    out += ["Variants:", ""] + [f"- **{n}**: {res['variants'][n]['description']}" for n in names] + [""]

    # Throughput
    out += ["## Maximum throughput (closed loop)", "",
            "HTTP/1.1: wrk; HTTP/2 and gRPC unary: h2load over h2c (prior knowledge) to the first proxy. "
            "'/ direct' divides by the proxy-less variant of the same load.", ""]
    rows = []
    for n in names:
        v = max_throughput(res, n)
        base = baseline_of(res, n)
        base_rps = median(max_throughput(res, base)) if base else math.nan
        errs = sum(r["errors"] for r in res.get("throughput", []) if r["variant"] == n)
        rows.append([n, LOAD_LABELS.get(load_of(res, n), load_of(res, n)), _n(median(v)),
                     f"{_n(min(v, default=math.nan))} – {_n(max(v, default=math.nan))}",
                     _ratio(median(v), base_rps), str(errs)])
    out += _table(["variant", "load", "req/s", "range over rounds", "/ direct", "errors"], rows, "llrrrr") + [""]

    # Latency (the open-loop generator speaks HTTP/1.1: only those variants have latency rows)
    timed = [n for n in names if any(r["variant"] == n for r in res.get("latency", []))]
    if rates and timed:
        out += ["## Latency at fixed rates (open loop, µs)", ""]
    for rate in rates if timed else []:
        out += [f"### {_rate(rate, high)}", ""]
        rows = []
        for n in timed:
            med = latency_median(res, n, rate)
            lr = latency_rows(res, n, rate)
            sustained = sum(1 for r in lr if r["summary"]["sustained"])
            samples = median([r["summary"]["completed"] for r in lr])
            lag = median([r["summary"]["gen_lag_us"]["p99"] for r in lr])
            rows.append([n] + [_n(med[p]) for p in PCTS] + [f"{sustained}/{len(lr)}", _n(samples), _n(lag)])
        out += _table(["variant", *PCTS, "sustained", "samples/run", "generator lag p99"], rows) + [""]
    if "direct" in timed:
        out += ["## Added latency over direct (µs)", "",
                "The variant's median percentile minus direct's at the same rate.", ""]
        rows = []
        for n in timed:
            if n == "direct":
                continue
            for rate in rates:
                add = added_latency(res, n, rate)
                rows.append([n, _rate(rate, high)] + [_signed(add[p]) for p in PCTS[:-1]])
        out += _table(["variant", "rate", "+p50", "+p90", "+p99", "+p99.9"], rows, "llrrrr") + [""]

    # Resources
    proxied = [n for n in names if proxy_roles(res, n)]
    if proxied:
        out += ["## Proxy memory and CPU", "",
                "RSS from /proc/<pid>/status (VmRSS): idle = after start and one request; under load = peak "
                "during the maximum-throughput runs (median over rounds). CPU = utime + stime deltas from "
                "/proc/<pid>/stat per 1,000 requests, client + server proxy.", ""]
        rows = []
        for n in proxied:
            roles = proxy_roles(res, n)
            idle = res["variants"][n].get("idle_rss", {})
            load = rss_under_load(res, n)
            cpu_max = cpu_per_1k([r for r in res.get("throughput", []) if r["variant"] == n], roles)
            cpu_high = cpu_per_1k(latency_rows(res, n, high), roles) if high else {}
            rows.append([
                n,
                " / ".join(_mb(idle.get(r, 0)) for r in roles),
                " / ".join(_mb(load.get(r, 0)) for r in roles),
                f"{_n(cpu_max['total'], 3)} ({' + '.join(_n(cpu_max[r], 3) for r in roles)})",
                f"{_n(cpu_high['total'], 3)} ({' + '.join(_n(cpu_high[r], 3) for r in roles)})"
                if cpu_high and not math.isnan(cpu_high["total"]) else "–",
            ])
        out += _table(["variant", "RSS idle MB (client / server)", "RSS under load MB (client / server)",
                       "CPU s / 1k req at max throughput", f"CPU s / 1k req at {_n(high or 0)} req/s"], rows) + [""]

    out += churn_section(res)

    # Ratios
    pairs = ratio_pairs(res)
    if pairs:
        out += ["## Ratios", "",
                "Each row divides the first variant's figure by the second's (lower is better except for "
                "throughput). Added latency is over direct; a ratio over an added latency not above zero is "
                "left out (–).", ""]
        metrics = {n: summary_metrics(res, n) for n in names}
        cols = ["max throughput"] + [f"added p99 @ {r:,.0f}" for r in rates] + [
            "CPU / 1k req (max)", "CPU / 1k req (high)", "RSS under load (largest proxy)"]
        rows = []
        for a, b in pairs:
            ma, mb = metrics[a], metrics[b]
            keys = ["max_rps"] + [f"added_p99@{r:g}" for r in rates] + [
                "cpu_per_1k_max", "cpu_per_1k_high", "rss_load_max"]
            rows.append([f"{a} / {b}"] + [_ratio(ma.get(k, math.nan), mb.get(k, math.nan)) for k in keys])
        out += _table(["ratio", *cols], rows) + [""]
        out += targets_section(res, metrics) + [""]

    # Checks
    out += profile_section(res)
    out += callcount_section(res)
    out += ["## Fairness checks", ""]
    any_check = False
    for n in names:
        for c in res["variants"][n].get("checks", []):
            any_check = True
            out.append(f"- {'✅' if c['ok'] else '❌'} **{n}**: {c['what']}: {c['detail']}")
    if not any_check:
        out.append("- (none ran)")
    out.append("")

    # Generator
    out += ["## Load generator", ""]
    gc = res.get("generator_check")
    if gc:
        out.append(
            f"- Against nginx alone at {gc['target_rate']:,.0f} req/s (twice the high rate) it completed "
            f"{gc['achieved_rate']:,.0f} req/s; its own lag (late sends with a connection free) p50 "
            f"{gc['gen_lag_us']['p50']:.0f} µs, p99 {gc['gen_lag_us']['p99']:.0f} µs, max "
            f"{gc['gen_lag_us']['max']:.0f} µs: "
            f"{'**overloaded**' if gc['generator_overloaded'] else 'keeps its schedule'}"
            f"{'' if gc['sustained'] else ' (not sustained)'}.")
    probes = res.get("high_probes", [])
    if probes:
        out.append("- High-rate probes: " + ", ".join(
            f"{p['variant']} @ {p['rate']:,.0f} {'ok' if p['sustained'] else 'not sustained'}" for p in probes) + ".")
    over = [r for r in res.get("latency", []) if r["summary"]["generator_overloaded"]]
    unsus = [r for r in res.get("latency", []) if not r["summary"]["sustained"]]
    out.append(f"- Measurements where the generator reported itself overloaded (median lag > 50 µs, or requests "
               f"unsent): {len(over)} of {len(res.get('latency', []))}"
               + (": " + ", ".join(f"{r['variant']} @ {r['rate']:,.0f} round {r['round'] + 1}" for r in over[:12])
                  if over else "") + ".")
    out.append(f"- Measurements not sustained (errors, unanswered requests, or a backlog still there when the "
               f"last request was due): {len(unsus)}"
               + (": " + ", ".join(f"{r['variant']} @ {r['rate']:,.0f} round {r['round'] + 1}" for r in unsus[:12])
                  if unsus else "") + ".")
    out.append("")

    plots = list(plots)
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    out += [
        "## Reading this report", "",
        "- Latency is measured from when each request was *due*, not when it was sent, so a stall is charged to "
        "every request it delayed (no coordinated omission). A low rate shows the per-request cost of a path; "
        "the high rate shows queueing when the proxies' CPU is busy.",
        "- p99.9 and max at 100 req/s rest on few samples (see samples/run): compare them across variants only "
        "as a rough indication.",
        "- 'generator lag p99' is how late the load generator itself sent requests although a connection was free "
        "(it is part of every latency above, the same for every variant at a rate); added latency over direct "
        "removes it.",
        "- 'other load' above is CPU time used on the machine by processes outside the benchmark while it "
        "measured; much of it means the figures are noisy.",
        "",
    ]
    return "\n".join(out)


# -- targets (issue 8) --------------------------------------------------------------


def targets_section(res: dict[str, Any], metrics: dict[str, dict[str, float]]) -> list[str]:
    names = variant_names(res)
    if "tether-http" not in names:
        return ["Targets (issue 8: tether-http against Envoy and HAProxy) are evaluated here once a "
                "tether-http variant runs."]
    t, e, h = metrics["tether-http"], metrics.get("envoy", {}), metrics.get("haproxy", {})
    rows: list[list[str]] = []

    def row(what: str, value: float, bar: float, ok: bool) -> None:
        rows.append([what, _n(value, 3), _n(bar, 3), "met" if ok else "**missed**"])

    nan = math.nan
    if e:
        row("max throughput ≥ Envoy's", t["max_rps"], e["max_rps"], t["max_rps"] >= e["max_rps"])
    if h:
        row("max throughput ≥ 0.5 × HAProxy's", t["max_rps"], 0.5 * h["max_rps"], t["max_rps"] >= 0.5 * h["max_rps"])
    for rate in (250.0, 1000.0):
        k = f"added_p99@{rate:g}"
        if e and k in t:
            row(f"added p99 at {rate:,.0f} req/s ≤ Envoy's (µs)", t[k], e.get(k, nan), t[k] <= e.get(k, nan))
    if e:
        row("CPU s / 1k req ≤ Envoy's", t["cpu_per_1k_max"], e["cpu_per_1k_max"],
            t["cpu_per_1k_max"] <= e["cpu_per_1k_max"])
    row("RSS per proxy under load ≤ 40 MB", t["rss_load_max"] / MB, 40.0, t["rss_load_max"] <= 40 * MB)
    for tv, ev in (("tether-h2", "envoy-h2"), ("tether-grpc", "envoy-grpc")):
        if tv in metrics and ev in metrics:
            row(f"{tv} max throughput ≥ {ev}'s", metrics[tv]["max_rps"], metrics[ev]["max_rps"],
                metrics[tv]["max_rps"] >= metrics[ev]["max_rps"])
    calls = res.get("callcounts") or {}
    if "tether-http" in calls:
        worst = max(per_request(c) for c in calls["tether-http"]["roles"].values())
        row("tether-http Python calls per request per proxy ≤ 60", worst, 60.0, worst <= 60)
    if "tether-tcp" in metrics and "haproxy-tcp" in metrics:
        tt, ht = metrics["tether-tcp"], metrics["haproxy-tcp"]
        row("stretch: tether-tcp max throughput ≥ haproxy-tcp's", tt["max_rps"], ht["max_rps"],
            tt["max_rps"] >= ht["max_rps"])
    return ["### Targets (issues 8 and 13)", ""] + _table(["target", "tether", "bar", ""], rows)


def churn_section(res: dict[str, Any]) -> list[str]:
    churn = res.get("churn")
    if not churn:
        return []
    out = ["## RSS under connection churn", "",
           "wrk with `Connection: close` (every request a new client connection), in segments; each proxy's RSS "
           "before and after each segment, MB. Growth from segment to segment is memory closed connections "
           "leave behind.", ""]
    rows = [[name, role, _mb(before), " → ".join(_mb(seg["rss"][role]) for seg in c["segments"]),
             _n(sum(seg["requests"] for seg in c["segments"])), _n(median([seg["rps"] for seg in c["segments"]]))]
            for name, c, role, before in _per_proxy(churn, "rss_before")]
    return out + _table(["variant", "proxy", "RSS before", "RSS after each segment", "connections",
                         "connections / s"], rows) + [""]


def per_request(counted: dict[str, Any]) -> float:
    """Python function calls per request from one proxy's call count."""
    return counted["python_calls"] / counted["requests"] if counted.get("requests") else math.nan


def callcount_section(res: dict[str, Any], top: int = 12) -> list[str]:
    """Python calls per request in each Tether proxy (bench/dataplane/callcount.py), with the functions called most."""
    counts = res.get("callcounts") or {}
    if not counts:
        return []
    out = ["## Python calls per request (cProfile counts, after the measurements)", "",
           "Each Tether proxy counted the calls made on its event loop's thread while h2load sent a fixed number "
           "of requests through the variant (4 connections; HTTP/2 and gRPC with as many streams in flight as "
           "in the throughput runs). Python = calls of Python functions; builtin = calls of functions written "
           "in C (methods of bytes, dict, the ssl and socket objects, the event loop's C methods...). The "
           "counts include each connection's accept and close, spread over its requests.", ""]
    rows = [[name, role, _n(c["requests"]), _n(per_request(r), 1),
             _n(r["builtin_calls"] / r["requests"] if r.get("requests") else math.nan, 1)]
            for name, c, role, r in _per_proxy(counts, "roles")]
    out += _table(["variant", "proxy", "requests", "Python calls / request", "builtin calls / request"], rows,
                  "llrrr") + [""]
    for name, _, role, r in _per_proxy(counts, "roles"):
        if r.get("requests"):
            out += [f"Python functions called most, {name} {role} proxy (calls per request):", ""]
            out += _table(["function", "calls / request"],
                          [[f"`{f}`", _n(n / r["requests"], 2)] for f, n in r["top"][:top]]) + [""]
    return out


def profile_section(res: dict[str, Any]) -> list[str]:
    """py-spy's view of each Tether proxy at maximum load: busy samples by area, then the hottest frames."""
    profiles = res.get("profiles") or {}
    if not profiles:
        return []
    out = ["## Where the time goes (py-spy, at maximum throughput)", "",
           "Samples of each proxy process while wrk drove it at its maximum, after every measurement above. "
           "Idle samples (threads waiting in epoll or futex, such as gRPC's) are left out; each busy sample is "
           "attributed to the area of its innermost frame (bench/dataplane/profile.py).", ""]
    for name, prof in profiles.items():
        roles = prof["roles"]
        out += [f"### {name} ({_n(prof['rps'])} req/s while sampled)", ""]
        areas = sorted({a for r in roles.values() for a in r["areas"]},
                       key=lambda a: -max(r["areas"].get(a, 0.0) for r in roles.values()))
        out += _table(["area", *roles], [[a, *(f"{r['areas'].get(a, 0.0) * 100:.1f} %" for r in roles.values())]
                                         for a in areas])
        out.append("")
        for role, r in roles.items():
            out += [f"Hottest innermost frames, {role} proxy ({r['busy_samples']} busy samples):", ""]
            out += _table(["frame", "share"], [[f"`{f}`", f"{v * 100:.1f} %"] for f, v in r["top"][:10]])
            out.append("")
    return out
