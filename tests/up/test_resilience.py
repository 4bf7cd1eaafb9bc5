"""Meshed traffic survives control-plane restarts and replica churn on the local platform.

Runs only once the proxy exists (``tether.proxy.main`` importable).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal

import pytest

from up import uplab
from up.uplab import client, ready, wait_for, web_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: steady, annotations: {linkerd.io/inject: enabled}}
"""


def _ready(p: uplab.Platform, prefix: str, count: int) -> list[dict]:
    def check() -> list[dict] | None:
        pods = [x for x in p.pods("steady") if x["metadata"]["name"].startswith(prefix)]
        return pods if len(pods) == count and all(ready(x) for x in pods) else None

    return wait_for(f"{count} ready pods {prefix}*", check, timeout=90)


def _log(p: uplab.Platform, pod: str) -> list[str]:
    return p.tether("logs", "-n", "steady", pod).stdout.splitlines()


def _answers_after(p: uplab.Platform, pod: str, start: int, count: int) -> list[str]:
    """Wait until ``count`` more answers than line ``start`` are logged; return the new lines."""
    def check() -> list[str] | None:
        new = _log(p, pod)[start:]
        return new if sum("ok 200" in x for x in new) >= count else None

    return wait_for(f"{count} more answers to {pod}", check, timeout=60)


def test_traffic_keeps_flowing_while_identity_and_destination_restart(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("api", "steady", 2))
    _ready(p, "api-", 2)
    p.apply(client("caller", "steady", "http://api.steady.svc.cluster.local/"))
    name = _ready(p, "caller-", 1)[0]["metadata"]["name"]
    _answers_after(p, name, 0, 5)
    start = len(_log(p, name))
    for component in ("destination", "identity"):
        pid = json.loads((p.home / "run" / f"{component}.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
    # With the control plane gone, cached discovery and the current certificate keep serving.
    down = _answers_after(p, name, start, 10)
    p.tether("up", *p.up_args)  # restarts what died
    after = _answers_after(p, name, start + len(down), 10)
    assert not [x for x in down + after if x.startswith("error")], down + after


def test_replicas_come_and_go_without_failed_requests(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("churn", "steady", 2))
    _ready(p, "churn-", 2)
    p.apply(client("watcher", "steady", "http://churn.steady.svc.cluster.local/"))
    name = _ready(p, "watcher-", 1)[0]["metadata"]["name"]
    _answers_after(p, name, 0, 5)
    start = len(_log(p, name))
    for replicas in (1, 3, 1):
        p.apply(web_server("churn", "steady", replicas))
        _ready(p, "churn-", replicas)
        _answers_after(p, name, len(_log(p, name)), 5)
    lines = _log(p, name)[start:]
    assert not [x for x in lines if x.startswith("error")], lines
