"""Fetching proxies' ``/metrics`` from their admin port, many pods at once.

``scrape_all(targets, port, timeout)`` GETs ``http://<ip>:<port>/metrics`` of
every target in a small thread pool (plain HTTP/1.1 with ``http.client``, no
proxy settings from the environment) and returns, per key, the parsed
``PodCounters`` or the error as text.  A scrape takes as long as the slowest
pod, at most ``timeout``.

Callers: ``tether.viz.stat``.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tether.viz.exposition import parse
from tether.viz.proxy_metrics import PodCounters

ADMIN_PORT = 4191
MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Scraped:
    counters: PodCounters | None
    error: str | None = None


def fetch(ip: str, port: int = ADMIN_PORT, timeout: float = 2.0) -> str:
    """The text of ``/metrics`` at ``ip:port``; raises ``OSError`` (or ``HTTPException``) on failure."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        response = conn.getresponse()
        body = response.read(MAX_BODY)
        if response.status != 200:
            raise OSError(f"HTTP {response.status} from {ip}:{port}/metrics")
        return body.decode("utf-8", errors="replace")
    finally:
        conn.close()


def scrape_one(ip: str, port: int, timeout: float) -> Scraped:
    try:
        text = fetch(ip, port, timeout)
    except (OSError, http.client.HTTPException) as err:
        return Scraped(None, f"{ip}:{port}: {err or type(err).__name__}")
    return Scraped(PodCounters.from_exposition(parse(text)))


def scrape_all(targets: Mapping[str, str], port: int = ADMIN_PORT, timeout: float = 2.0,
               workers: int = 8) -> dict[str, Scraped]:
    """``{key: ip}`` in, ``{key: Scraped}`` out."""
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(targets))) as pool:
        futures = {key: pool.submit(scrape_one, ip, port, timeout) for key, ip in targets.items()}
        return {key: f.result() for key, f in futures.items()}
