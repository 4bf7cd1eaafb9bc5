"""PNG plots of a run, with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.dataplane.report import MB, PCTS, cpu_per_1k, latency_median, max_throughput, proxy_roles, \
    rss_under_load, variant_names
from bench.dataplane.runner import median


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_plot(res: dict[str, Any], path: Path) -> Path:
    """One panel per rate: each variant's latency percentiles (log scale)."""
    plt = _plt()
    rates = res.get("rates", [])
    names = variant_names(res)
    fig, axes = plt.subplots(1, max(1, len(rates)), figsize=(4.2 * max(1, len(rates)), 4.2), sharey=True,
                             squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=False):
        for n in names:
            med = latency_median(res, n, rate)
            ax.plot(range(len(PCTS)), [max(med[p], 1.0) for p in PCTS], marker="o", label=n)
        label = f"{rate:,.0f} req/s" + (" (high)" if rate == res.get("high_rate") else "")
        ax.set_title(label)
        ax.set_xticks(range(len(PCTS)), PCTS)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("latency (µs, from scheduled send)")
    axes[0][-1].legend(fontsize="small")
    fig.suptitle("Latency percentiles by variant and rate (median over rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def resources_plot(res: dict[str, Any], path: Path) -> Path:
    """Throughput, proxy RSS (idle and under load) and CPU per 1,000 requests, by variant."""
    plt = _plt()
    names = variant_names(res)
    proxied = [n for n in names if proxy_roles(res, n)]
    fig, (ax_t, ax_m, ax_c) = plt.subplots(1, 3, figsize=(15, 4.5))

    ax_t.bar(names, [median(max_throughput(res, n)) for n in names], color="tab:blue")
    ax_t.set_title("maximum throughput (req/s)")
    ax_t.tick_params(axis="x", rotation=30)

    width = 0.2
    xs = range(len(proxied))
    series = [("client idle", "client", True), ("server idle", "server", True),
              ("client load", "client", False), ("server load", "server", False)]
    for i, (label, role, idle) in enumerate(series):
        vals = []
        for n in proxied:
            src = res["variants"][n].get("idle_rss", {}) if idle else rss_under_load(res, n)
            vals.append(src.get(role, 0) / MB)
        ax_m.bar([x + (i - 1.5) * width for x in xs], vals, width, label=label,
                 alpha=0.55 if idle else 1.0, color="tab:green" if role == "client" else "tab:olive")
    ax_m.set_xticks(list(xs), proxied, rotation=30)
    ax_m.set_title("proxy RSS (MB)")
    ax_m.legend(fontsize="small")

    bottoms = [0.0] * len(proxied)
    for role, color in (("client", "tab:red"), ("server", "tab:orange")):
        vals = []
        for n in proxied:
            rows = [r for r in res.get("throughput", []) if r["variant"] == n]
            vals.append(cpu_per_1k(rows, proxy_roles(res, n)).get(role, 0.0))
        ax_c.bar(proxied, vals, bottom=bottoms, label=f"{role} proxy", color=color)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax_c.set_title("proxy CPU s per 1,000 requests (max throughput)")
    ax_c.tick_params(axis="x", rotation=30)
    ax_c.legend(fontsize="small")

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(res: dict[str, Any], directory: Path) -> list[str]:
    """Write every plot into ``directory``; returns their file names (for the report)."""
    names = []
    if res.get("latency"):
        names.append(latency_plot(res, directory / "latency.png").name)
    if res.get("throughput"):
        names.append(resources_plot(res, directory / "resources.png").name)
    return names
