"""The tap controller: TapByResource resolved to tappable pods, max_rps divided, Observe fanned out over mTLS.

The "pods" are Pod objects at 127.0.0.2 and 127.0.0.3, each with a real
``tether.proxy.io.tap_server`` on the same port, presenting that pod's
identity; the controller presents the tap identity, as on the local platform.
The CLI ``tether viz tap`` is run against the controller's gRPC server.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from click.testing import CliRunner

from tether.api import tap_pb2, viz_tap_pb2, viz_tap_pb2_grpc
from tether.cli.main import cli
from tether.proxy.core.tap import INBOUND, TapRequest, Taps
from tether.viz import tables
from tether.viz.dashboard.server import Dashboard
from tether.viz.dashboard.views import Views
from tether.viz.metrics_api import Mesh
from tether.viz.prometheus import Prometheus
from tether.viz.tap import (NoTappablePods, TapError, hydrate, peer_labels, per_pod_limit,
                            tappable_pods, translate_match)
from viz.browser import CHROMEDRIVER, CHROMIUM, Browser
from viz.taplab import NS, TapLab as _Lab, _objects

VM = viz_tap_pb2.TapByResourceRequest.Match


def test_resolution_keeps_meshed_tap_enabled_running_pods() -> None:
    pods = tappable_pods(_objects(), viz_tap_pb2.Resource(namespace=NS, type="deploy", name="web"), Mesh())
    assert [(p.name, p.ip) for p in pods] == [("web-5d8f7c9b4-abcde", "127.0.0.2"), ("web-5d8f7c9b4-fghij", "127.0.0.3")]
    assert pods[0].identity == "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"


def test_untappable_pods_are_named_with_their_reason() -> None:
    with pytest.raises(NoTappablePods) as err:
        tappable_pods(_objects(), viz_tap_pb2.Resource(namespace=NS, type="deployment", name="emoji"), Mesh())
    message = str(err.value)
    assert "no pods to tap for deployment/emoji in namespace emojivoto" in message
    assert "emoji-5d8f7c9b4-aaaaa: tap not enabled (its proxy has no LINKERD2_PROXY_TAP_SVC_NAME)" in message
    assert "emoji-5d8f7c9b4-ccccc: tap disabled (viz.linkerd.io/disable-tap)" in message
    with pytest.raises(NoTappablePods, match="voting-5d8f7c9b4-bbbbb: not meshed"):
        tappable_pods(_objects(), viz_tap_pb2.Resource(namespace=NS, type="po", name="voting-5d8f7c9b4-bbbbb"),
                      Mesh())
    with pytest.raises(NoTappablePods, match="no pods found for deployment/nope"):
        tappable_pods(_objects(), viz_tap_pb2.Resource(namespace=NS, type="deploy", name="nope"), Mesh())
    with pytest.raises(TapError, match="not services"):
        tappable_pods(_objects(), viz_tap_pb2.Resource(namespace=NS, type="svc", name="web"), Mesh())


def test_max_rps_is_divided_among_pods_at_least_one_each() -> None:
    assert per_pod_limit(100, 2) == 50
    assert per_pod_limit(1, 4) == 1  # capped, not refused
    assert per_pod_limit(0, 1) == 100  # unset: Linkerd's default


def test_the_viz_match_becomes_the_proxys() -> None:
    match = translate_match(VM(all=VM.Seq(matches=[
        VM(http=VM.Http(method="POST")), VM(http=VM.Http(path="/api")), VM(http=VM.Http(authority="web:80")),
        VM(destinations=viz_tap_pb2.ResourceSelection(resource=viz_tap_pb2.Resource(
            namespace=NS, type="deploy", name="emoji")))])))
    method, path, authority, dest = match.all.matches
    assert method.http.method.registered == 1  # POST
    assert path.http.path.prefix == "/api" and authority.http.authority.exact == "web:80"
    assert [(m.destination_label.key, m.destination_label.value) for m in dest.all.matches] == [
        ("deployment", "emoji"), ("namespace", NS)]
    with pytest.raises(TapError, match="no condition set"):
        translate_match(VM())


@pytest.fixture(scope="module")
def lab() -> Iterator[_Lab]:
    lab = _Lab()
    yield lab
    lab.close()


def test_tap_by_resource_merges_both_pods_events(lab: _Lab) -> None:
    async def tap() -> list[tap_pb2.TapEvent]:
        request = viz_tap_pb2.TapByResourceRequest(maxRps=10)
        request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=NS, type="deployment", name="web"))
        request.match.CopyFrom(VM(http=VM.Http(path="/api")))
        events = []
        async with grpc.aio.insecure_channel(lab.address) as channel:
            call = viz_tap_pb2_grpc.TapStub(channel).TapByResource(request)
            feeder = asyncio.create_task(lab.serve_requests(["/api/a", "/web", "/api/b"]))
            async for event in call:
                events.append(event)
                if len(events) == 12:  # 2 pods x 2 matching requests x 3 events
                    call.cancel()
                    break
            await feeder
        return events

    events = lab.run(tap())
    inits = [e for e in events if e.http.WhichOneof("event") == "request_init"]
    assert sorted((e.destination.port, e.http.request_init.path, e.http.request_init.id.base) for e in inits) == [
        (8080, "/api/a", 1), (8080, "/api/a", 2), (8080, "/api/b", 1), (8080, "/api/b", 2)]
    # The controller labels each event's destination with the pod at its address (the client, 10.0.0.1, is none).
    assert sorted(e.destination_meta.labels["pod"] for e in inits) == [
        "web-5d8f7c9b4-abcde", "web-5d8f7c9b4-abcde", "web-5d8f7c9b4-fghij", "web-5d8f7c9b4-fghij"]
    assert all(e.destination_meta.labels["deployment"] == "web" and "pod" not in e.source_meta.labels for e in events)


def test_an_untappable_resource_is_not_found_naming_the_pods(lab: _Lab) -> None:
    async def tap() -> grpc.aio.AioRpcError:
        request = viz_tap_pb2.TapByResourceRequest()
        request.target.resource.CopyFrom(viz_tap_pb2.Resource(namespace=NS, type="deployment", name="emoji"))
        async with grpc.aio.insecure_channel(lab.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in viz_tap_pb2_grpc.TapStub(channel).TapByResource(request):
                    pass
        return err.value

    err = lab.run(tap())
    assert err.code() == grpc.StatusCode.NOT_FOUND and "emoji-5d8f7c9b4-aaaaa: tap not enabled" in err.details()


def test_tap_lines_read_as_linkerd_s() -> None:
    taps = Taps(base=3)
    from tether.proxy.core.tap import new_tap

    tap = new_tap(tap_pb2.ObserveRequest(limit=1), lambda: None)
    taps.add(tap)
    stream = taps.begin(TapRequest(INBOUND, ("10.0.0.1", 5000), ("10.0.0.2", 8080), "GET", "http", "web:80", "/api",
                                   source_labels={"tls": "true"}), 0.0)
    assert stream is not None
    stream.response_init(200, [], 0.0015)
    stream.response_end(0.002, response_bytes=3, grpc_status=0)
    assert [tables.tap_line(e) for e in tap.events] == [
        "req id=3:1 proxy=in src=10.0.0.1:5000 dst=10.0.0.2:8080 tls=true :method=GET :authority=web:80 :path=/api",
        "rsp id=3:1 proxy=in src=10.0.0.1:5000 dst=10.0.0.2:8080 tls=true :status=200 latency=1500µs",
        "end id=3:1 proxy=in src=10.0.0.1:5000 dst=10.0.0.2:8080 tls=true grpc-status=0 duration=500µs "
        "response-length=3B",
    ]


def test_events_get_the_pods_labels_and_wide_lines_name_both_sides() -> None:
    """As Linkerd's tap server labels each event's peers from the pods at their addresses, and ``viz tap -o wide``
    prints them: the tapped kind's resource (else the pod) and the namespace of each side, then the route."""
    peers = peer_labels(_objects())
    assert peers["127.0.0.2"] == {"namespace": NS, "pod": "web-5d8f7c9b4-abcde", "serviceaccount": "web",
                                  "deployment": "web"}
    taps = Taps(base=3)
    from tether.proxy.core.tap import new_tap

    tap = new_tap(tap_pb2.ObserveRequest(limit=1), lambda: None)
    taps.add(tap)
    # Inbound at web from emoji's pod; the proxy's own label (tls) stays, and 10.9.9.9 is no pod.
    stream = taps.begin(TapRequest(INBOUND, ("127.0.0.4", 5000), ("127.0.0.2", 8080), "GET", "http", "web:80", "/",
                                   source_labels={"tls": "true", "namespace": "as-the-proxy-saw-it"},
                                   route_labels={"route": "GET /"}), 0.0)
    assert stream is not None
    (event,) = tap.events
    hydrate(event, peers)
    assert dict(event.source_meta.labels) == {"tls": "true", "namespace": "as-the-proxy-saw-it",
                                              "pod": "emoji-5d8f7c9b4-aaaaa", "serviceaccount": "default",
                                              "deployment": "emoji"}
    assert event.destination_meta.labels["deployment"] == "web"
    line = tables.tap_line(event, "deployment")
    assert line.endswith(":path=/ src_res=deploy/emoji src_ns=as-the-proxy-saw-it dst_res=deploy/web "
                         f"dst_ns={NS} rt_route=GET /"), line
    assert tables.tap_line(event, "pod").endswith(
        f"src_res=po/emoji-5d8f7c9b4-aaaaa src_ns=as-the-proxy-saw-it dst_res=po/web-5d8f7c9b4-abcde dst_ns={NS} "
        "rt_route=GET /")
    assert " src_res=ns/as-the-proxy-saw-it dst_res=ns/" in tables.tap_line(event, "namespace")
    unknown = tap_pb2.TapEvent()
    unknown.CopyFrom(event)
    unknown.source.CopyFrom(tap_pb2.TapEvent().source)  # no address: nothing to look up
    assert hydrate(unknown, {}).source_meta.labels["tls"] == "true"


def test_cli_tap_json_asks_for_headers_and_wide_does_not(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``-o json`` asks the proxies for the headers (Linkerd's tap sets extract for it); the event is printed whole."""
    import tether.cli.viz as viz_cli

    asked: list[Any] = []
    event = tap_pb2.TapEvent(proxy_direction=INBOUND)
    event.http.request_init.path = "/api"
    event.http.request_init.headers.headers.add(name="x-id", value=b"7")

    def source(tap_server: str | None, kube: object) -> Any:
        async def run(request: Any, show: Any) -> None:
            asked.append(request)
            show(event)
        return run

    monkeypatch.setattr(viz_cli, "_tap_source", source)
    out = CliRunner().invoke(cli, ["viz", "tap", "deploy/web", "-n", NS, "-o", "json"],
                             env={"TETHER_HOME": str(tmp_path)}, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert asked[0].extract.http.WhichOneof("extract") == "headers"
    doc = json.loads(out.output)
    assert doc["http"]["requestInit"]["headers"]["headers"] == [{"name": "x-id", "value": "Nw=="}]
    wide = CliRunner().invoke(cli, ["viz", "tap", "deploy/web", "-n", NS, "-o", "wide"],
                              env={"TETHER_HOME": str(tmp_path)}, catch_exceptions=False)
    assert wide.exit_code == 0 and not asked[1].HasField("extract"), wide.output


def test_cli_tap_errors_name_the_pods_or_the_server(lab: _Lab, tmp_path: Path) -> None:
    env = {"TETHER_HOME": str(tmp_path)}
    bad = CliRunner().invoke(cli, ["viz", "tap", "deploy/emoji", "-n", NS, "--tap-server", lab.address], env=env)
    assert bad.exit_code == 1 and "emoji-5d8f7c9b4-aaaaa: tap not enabled" in bad.output
    assert "Traceback" not in bad.output
    down = CliRunner().invoke(cli, ["viz", "tap", "deploy/web", "-n", NS, "--tap-server", "127.0.0.1:1"], env=env)
    assert down.exit_code == 1 and "cannot reach the tap server at 127.0.0.1:1" in down.output
    none = CliRunner().invoke(cli, ["viz", "tap", "deploy/web"], env=env)
    assert none.exit_code == 1 and "tether viz install" in none.output


def test_top_folds_events_into_the_busiest_paths() -> None:
    from tether.proxy.core.tap import new_tap
    from tether.viz.top import Top

    taps = Taps(base=1)
    tap = new_tap(tap_pb2.ObserveRequest(limit=10), lambda: None)
    taps.add(tap)
    for path, status, latency in (("/a", 200, 0.002), ("/a", 500, 0.010), ("/b", 200, 0.001), ("/a", 200, 0.004)):
        stream = taps.begin(TapRequest(INBOUND, ("10.0.0.1", 5000), ("10.0.0.2", 8080), "GET", "http", "web",
                                       path), 0.0)
        assert stream is not None
        stream.response_init(status, [], latency)
        stream.response_end(latency + 0.001)
    top = Top()
    for event in tap.events:
        top.add(event)
    assert top.rows() == [
        ["10.0.0.1", "10.0.0.2", "GET", "/a", "3", "2ms", "10ms", "4ms", "66.67%"],
        ["10.0.0.1", "10.0.0.2", "GET", "/b", "1", "1ms", "1ms", "1ms", "100.00%"],
    ]


def test_list_names_tappable_pods_and_why_not(tmp_path: Path) -> None:
    from tether.store import Store

    with Store(tmp_path / "store.db") as store:
        for obj in _objects().objs:
            store.apply(obj)
    result = CliRunner().invoke(cli, ["viz", "list", "-n", NS], env={"TETHER_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.output.splitlines()[1:]}
    assert lines["web-5d8f7c9b4-abcde"].endswith("enabled")
    assert "not meshed" in lines["voting-5d8f7c9b4-bbbbb"]
    assert "tap disabled (viz.linkerd.io/disable-tap)" in lines["emoji-5d8f7c9b4-ccccc"]


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
def test_the_dashboard_s_live_tap_shows_the_requests(lab: _Lab, tmp_path_factory: pytest.TempPathFactory) -> None:
    shots = Path(os.environ.get("VIZ_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    # Prometheus is down here: the metric panels say so, the live tap works on its own.
    views = Views(Prometheus("http://127.0.0.1:1"), _objects(), Mesh(), "30s", tap_address=lab.address)
    dashboard = Dashboard(views, "127.0.0.1", 0)
    dashboard.start()
    browser = Browser()
    try:
        browser.open(f"{dashboard.url}?namespace={NS}")
        browser.wait("the page's first answer", "return document.getElementById('status').className.includes('error')")
        browser.script("document.getElementById('tap-resource').value = 'deploy/emoji';"
                       "document.getElementById('tap-start').click();")
        status = browser.wait("the refusal", "const s = document.getElementById('tap-status');"
                              "return s.className === 'error' ? s.textContent : null;")
        assert "emoji-5d8f7c9b4-aaaaa: tap not enabled" in status
        browser.script("document.getElementById('tap-resource').value = 'deploy/web';"
                       "document.getElementById('tap-path').value = '/api';"
                       "document.getElementById('tap-start').click();")
        lab.run(lab.serve_requests(["/api/vote", "/web", "/api/list"]))
        lines = browser.wait("six request lines", """
            const lines = document.getElementById('tap').textContent.split('\\n').filter(l => l.startsWith('req '));
            return lines.length >= 4 ? lines : null;
        """)
        assert all(":path=/api/" in line for line in lines)
        assert {line.split(" dst=")[1].split(":")[0] for line in lines} == {"127.0.0.2", "127.0.0.3"}
        print(f"screenshot: {browser.screenshot(shots / 'live-tap.png')}")
        browser.script("document.getElementById('tap-stop').click();")
        for proxy in lab.proxies:  # the page closed its stream: the pods' taps close too
            lab.run(_Lab.until_no_taps(proxy))
    finally:
        browser.close()
        dashboard.stop()


def test_profile_from_tap_makes_a_route_per_request_received(tmp_path: Path) -> None:
    """`viz profile --tap`: the distinct inbound requests of both pods, `/` left out, stopping at the limit.

    A lab of its own: a tap left open by an earlier test's client would take the requests."""
    lab = _Lab()
    try:
        _profile_from_tap(lab, tmp_path)
    finally:
        lab.close()


def _profile_from_tap(lab: _Lab, tmp_path: Path) -> None:
    runner = CliRunner()
    done: dict[str, Any] = {}

    def run() -> None:
        done["result"] = runner.invoke(cli, ["viz", "profile", "web", "--tap", "deploy/web", "-n", NS,
                                             "--tap-server", lab.address, "--tap-duration", "1m",
                                             "--tap-route-limit", "3"], env={"TETHER_HOME": str(tmp_path)})

    thread = threading.Thread(target=run)
    thread.start()
    lab.run(lab.serve_requests(["/api/a", "/", "/web", "/api/a", "/api/b", "/late"]))
    thread.join(60)
    assert not thread.is_alive(), "viz profile did not stop at --tap-route-limit"
    result = done["result"]
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert doc["metadata"] == {"name": "web.emojivoto.svc.cluster.local", "namespace": NS}
    assert doc["spec"]["routes"] == [
        {"name": "GET /api/a", "condition": {"pathRegex": "/api/a", "method": "GET"}},
        {"name": "GET /api/b", "condition": {"pathRegex": "/api/b", "method": "GET"}},
        {"name": "GET /web", "condition": {"pathRegex": "/web", "method": "GET"}}]
    bad = runner.invoke(cli, ["viz", "profile", "web", "--tap", "deploy/web", "--tap-duration", "soon",
                              "--tap-server", lab.address])
    assert bad.exit_code == 2 and "--tap-duration" in bad.output
