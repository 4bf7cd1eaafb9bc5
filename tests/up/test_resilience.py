"""Meshed traffic survives control-plane crashes (each component restarted by its supervisor) and replica
churn on the local platform.

Runs only once the proxy exists (``tether.proxy.main`` importable).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal

import pytest

from up import uplab
from up.uplab import client, wait_for, web_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tether.proxy.main") is None,
                                reason="the proxy (tether.proxy.main) is not in the tree yet")

NAMESPACE = """
apiVersion: v1
kind: Namespace
metadata: {name: steady, annotations: {linkerd.io/inject: enabled}}
"""


def _log(p: uplab.Platform, pod: str) -> list[str]:
    return p.logs("steady", pod).splitlines()


def _answers_after(p: uplab.Platform, pod: str, start: int, count: int) -> list[str]:
    """Wait until ``count`` more answers than line ``start`` are logged; return the new lines."""
    def check() -> list[str] | None:
        new = _log(p, pod)[start:]
        return new if sum("ok 200" in x for x in new) >= count else None

    return wait_for(f"{count} more answers to {pod}", check, timeout=60)


def _kill_and_await_restart(p: uplab.Platform, component: str, restarts: int) -> None:
    """SIGKILL the component's own process; wait until its supervisor has it back, ready, counted in status."""
    state = p.home / "run" / f"{component}.supervisor.json"
    pid = json.loads(state.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)

    def back() -> list[str] | None:
        rows = {r.split()[0]: r.split() for r in p.tether("status", ok=None).stdout.splitlines() if r.split()}
        row = rows.get(component)
        return row if row and row[1:4] == ["running", "yes", str(restarts)] and row[4] != str(pid) else None

    wait_for(f"{component} restarted and ready", back, timeout=90)


def test_killed_components_come_back_and_traffic_to_new_targets_recovers(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    p.apply(web_server("api", "steady", 2))
    p.ready_pods("steady", 2, "api-")
    p.apply(client("caller", "steady", "http://api.steady.svc.cluster.local/"))
    name = p.ready_pods("steady", 1, "caller-")[0]["metadata"]["name"]
    _answers_after(p, name, 0, 5)
    start = len(_log(p, name))
    # Nobody runs `tether up` again: each component's supervisor restarts it.
    for component in ("destination", "identity"):
        _kill_and_await_restart(p, component, 1)
    # Cached discovery and the current certificate kept serving meanwhile.
    during = _answers_after(p, name, start, 10)
    assert not [x for x in during if x.startswith("error")], during
    _kill_and_await_restart(p, "platform", 1)  # the controller: it takes every pod down and up again
    # A target nobody used before: new pods (the controller), their certificates (identity) and
    # their discovery (destination) all come from restarted components.
    p.apply(web_server("fresh", "steady", 1))
    p.ready_pods("steady", 1, "fresh-")
    p.apply(client("newcomer", "steady", "http://fresh.steady.svc.cluster.local/"))
    newcomer = p.ready_pods("steady", 1, "newcomer-")[0]["metadata"]["name"]
    _answers_after(p, newcomer, 0, 5)


# The churn app's preStop sleep, in seconds. Its http.server dies at once on SIGTERM, and a removed pod's app is
# signalled as soon as the pod is deleted, while the removal of its endpoint is still on its way (EndpointSlice,
# destination, the client proxy's balancer): a request sent there meanwhile reaches the pod's proxy, whose app
# is gone, and is answered 502 (l5d-proxy-error "... ECONNREFUSED"; the eighth session's CI saw one). Linkerd
# answers so too, and its docs give the remedy this test uses, as a Linkerd user would: the app keeps serving for
# a while after the pod is deleted (a preStop sleep), longer than its endpoint's removal takes to reach clients.
PRE_STOP_SLEEP = 5


def test_replicas_come_and_go_without_failed_requests(running: uplab.Platform) -> None:
    p = running
    p.apply(NAMESPACE)
    churn = functools.partial(web_server, "churn", "steady", pre_stop_sleep=PRE_STOP_SLEEP)
    p.apply(churn(2))
    p.ready_pods("steady", 2, "churn-")
    p.apply(client("watcher", "steady", "http://churn.steady.svc.cluster.local/"))
    name = p.ready_pods("steady", 1, "watcher-")[0]["metadata"]["name"]
    _answers_after(p, name, 0, 5)
    start = len(_log(p, name))
    for replicas in (1, 3, 1):
        p.apply(churn(replicas))
        p.ready_pods("steady", replicas, "churn-")
        _answers_after(p, name, len(_log(p, name)), 5)
    lines = _log(p, name)[start:]
    # On failure, the client proxy's log says which proxy answered and why ("remote proxy error: ...").
    assert not [x for x in lines if x.startswith("error")], (lines, p.logs("steady", name, "-c", "linkerd-proxy"))
