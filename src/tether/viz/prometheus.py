"""A small Prometheus HTTP API client: instant queries, readiness, the targets page.

``Prometheus(url).query(expr)`` GETs ``<url>/api/v1/query`` and returns the
instant vector as ``Sample(labels, value)``; ``query_all`` runs a ``QuerySet``'s
queries at once (in threads, as Linkerd's metrics API runs them in
goroutines).  Every failure is a ``PrometheusError`` whose message names the
URL and what went wrong -- Prometheus down, not Prometheus, or a query it
refused -- so the CLI prints it as it is.  Environment proxy settings are not
used: the URL is the user's or the local platform's own.

Callers: ``tether.viz.metrics_api``, the CLI (``viz check``), tests.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT = 10.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(Exception):
    """Prometheus could not answer; the message names its URL."""


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Mapping[str, str]
    value: float


class Prometheus:
    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"{url!r} is not a Prometheus URL (want http://host:port)")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with _OPENER.open(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                detail = json.loads(body).get("error") or body.decode(errors="replace")
            except (ValueError, AttributeError):
                detail = body.decode(errors="replace")[:200]
            raise PrometheusError(f"Prometheus at {self.url} refused the request (HTTP {err.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise PrometheusError(f"{self.url} did not answer as Prometheus does (not JSON)") from None

    def query(self, expr: str) -> list[Sample]:
        doc = self._get("/api/v1/query", {"query": expr})
        if not isinstance(doc, dict) or doc.get("status") != "success":
            detail = doc.get("error") if isinstance(doc, dict) else doc
            raise PrometheusError(f"Prometheus at {self.url} failed the query {expr!r}: {detail}")
        data = doc.get("data") or {}
        if data.get("resultType") != "vector":
            raise PrometheusError(f"Prometheus at {self.url} answered {data.get('resultType')!r}, not a vector")
        out = []
        for item in data.get("result") or ():
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            out.append(Sample(dict(item.get("metric") or {}), value))
        return out

    def query_all(self, queries: Mapping[str, str]) -> dict[str, list[Sample]]:
        """Every query at once; the first failure is raised."""
        if not queries:
            return {}
        with ThreadPoolExecutor(max_workers=min(8, len(queries))) as pool:
            futures = {name: pool.submit(self.query, expr) for name, expr in queries.items()}
            return {name: f.result() for name, f in futures.items()}

    def ready(self) -> None:
        """Raises ``PrometheusError`` unless ``/-/ready`` answers 200."""
        try:
            with _OPENER.open(f"{self.url}/-/ready", timeout=self.timeout) as response:
                if response.status == 200:
                    return
                raise PrometheusError(f"Prometheus at {self.url} is not ready (HTTP {response.status})")
        except urllib.error.HTTPError as err:
            raise PrometheusError(f"Prometheus at {self.url} is not ready (HTTP {err.code})") from None
        except (urllib.error.URLError, OSError) as err:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {getattr(err, 'reason', err)}") from None

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (job, labels, health, last error)."""
        doc = self._get("/api/v1/targets", {"state": "active"})
        return list(((doc or {}).get("data") or {}).get("activeTargets") or ())


def count(value: float) -> int:
    """A counter's increase as a whole number, NaN as 0 (Linkerd rounds the same way)."""
    return 0 if math.isnan(value) else int(round(value))
