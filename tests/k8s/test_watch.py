"""``KubernetesResourceWatcher`` against kmock: list then watch, bookmarks, 410 Gone, reconnects, paging, lag.

kmock's emulator serves the stateful parts (objects created, patched and deleted
over HTTP show up in lists and watches); scripted kmock reactions force what an
emulator does not do by itself (resource versions, bookmarks, 410, errors).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import kmock
import pytest

from tether.platform.kubernetes.client import ClientSettings
from tether.platform.kubernetes.resources import API_RESOURCES, api_resource
from tether.platform.kubernetes.watch import KubernetesResourceWatcher, change_time
from tether.resources import kinds

from .kube_helpers import PODS, emulated_api, hold, listing, pod, status, take, watching


class RecordingSleep:
    """Records backoff delays and sleeps only briefly, so retries are fast and checkable."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0.01)


def watcher(settings: ClientSettings, **overrides: object) -> KubernetesResourceWatcher:
    options: dict[str, object] = {"watch_timeout": 5.0, "retry_initial": 0.5, "retry_max": 4.0,
                                  "rng": random.Random(7)}
    options.update(overrides)
    return KubernetesResourceWatcher(settings, **options)  # type: ignore[arg-type]


def names(events: list) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"]["name"] if e.object else "") for e in events]


async def test_lists_then_watches_changes(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await api.post("/api/v1/namespaces/default/pods", json=pod("a"))
        events = watcher(settings).watch(kinds.POD.key)
        first = await take(events, 2)
        assert names(first) == [("ADDED", "a"), ("SYNCED", "")]
        assert first[0].object["kind"] == "Pod" and first[0].object["apiVersion"] == "v1"
        pending = asyncio.ensure_future(take(events, 3))  # a generator only watches while it is asked for more
        await watching(api)
        await api.post("/api/v1/namespaces/default/pods", json=pod("b"))
        await api.patch("/api/v1/namespaces/default/pods/a", json={"spec": {"nodeName": "n1"}})
        await api.delete("/api/v1/namespaces/default/pods/b")
        changes = await pending
        assert names(changes) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
        assert changes[1].object["spec"] == {"nodeName": "n1"}
        await events.aclose()

        watch_request = api["watch"][0]
        assert watch_request.url.path == "/api/v1/pods"
        assert watch_request.params["watch"] == "true"
        assert watch_request.params["allowWatchBookmarks"] == "true"
        assert watch_request.params["resourceVersion"] == "..."  # what kmock's list said
        assert 5 <= int(watch_request.params["timeoutSeconds"]) <= 10
        assert api["list"][0].params["limit"] == "500"
        assert api["watch"][0].headers["Authorization"] == "Bearer test-token"


async def test_namespace_watch_reads_one_namespace(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        await api.post("/api/v1/namespaces/default/pods", json=pod("a"))
        await api.post("/api/v1/namespaces/other/pods", json=pod("z", "other"))
        events = watcher(settings).watch(kinds.POD.key, "other")
        assert names(await take(events, 2)) == [("ADDED", "z"), ("SYNCED", "")]
        pending = asyncio.ensure_future(take(events, 1))
        await watching(api)
        await api.post("/api/v1/namespaces/default/pods", json=pod("b"))
        await api.post("/api/v1/namespaces/other/pods", json=pod("y", "other"))
        assert names(await pending) == [("ADDED", "y")]
        await events.aclose()
        assert api["list"][0].url.path == "/api/v1/namespaces/other/pods"


async def test_bookmark_moves_the_resume_version_without_an_event(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS] << listing("10", pod("a", version="5"))
        bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                   "metadata": {"resourceVersion": "20"}}}
        api["watch", PODS][:1] << (bookmark,)  # then the server ends this watch
        api["watch", PODS][1:2] << ({"type": "ADDED", "object": pod("b", version="21")}, hold)
        events = watcher(settings).watch(kinds.POD.key)
        got = await take(events, 3)
        assert names(got) == [("ADDED", "a"), ("SYNCED", ""), ("ADDED", "b")]
        assert got[1].resource_version == "10" and got[2].resource_version == "21"
        await events.aclose()
        assert [r.params["resourceVersion"] for r in api["watch"]] == ["10", "20"]
        assert len(api["list"]) == 1  # a normal end of a watch is no reason to list again


@pytest.mark.parametrize("how", ["error-event", "http-410"])
async def test_gone_relists_at_once_and_yields_only_the_difference(tmp_path: Path, how: str) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS][:1] << listing("10", pod("a", version="1"), pod("b", version="2"), pod("c", version="3"))
        api["list", PODS][1:2] << listing("40", pod("a", version="31"), pod("c", version="3"), pod("d", version="32"))
        gone = status(410, "Expired", "too old resource version: 10 (35)")
        if how == "error-event":
            api["watch", PODS][:1] << ({"type": "ERROR", "object": gone},)
        else:
            api["watch", PODS][:1] << 410 << gone
        api["watch", PODS][1:2] << (hold,)
        sleep = RecordingSleep()
        w = watcher(settings, sleep=sleep)
        events = w.watch(kinds.POD.key)
        first = await take(events, 4)
        assert names(first) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c"), ("SYNCED", "")]
        second = await take(events, 4)
        assert names(second) == [("DELETED", "b"), ("MODIFIED", "a"), ("ADDED", "d"), ("SYNCED", "")]
        assert second[0].object == {"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": "b", "namespace": "default", "resourceVersion": "2"}}
        assert second[-1].resource_version == "40"
        pending = asyncio.ensure_future(anext(events))
        await watching(api, 2)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await events.aclose()
        assert sleep.delays == []  # 410 relists without waiting
        assert [r.params["resourceVersion"] for r in api["watch"]] == ["10", "40"]
        assert w.metrics.lists.labels("Pod", "gone")._value.get() == 1


async def test_reconnects_with_backoff_and_jitter_after_losing_the_server(tmp_path: Path) -> None:
    async with kmock.KubernetesEmulator() as api, kmock.Server(api) as side:
        first = kmock.Server(api)
        await first.__aenter__()
        port = first.port
        from .kube_helpers import write_kubeconfig

        settings = ClientSettings(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", str(first.url)),
                                  connect_timeout=2.0)
        await side.client.post("/api/v1/namespaces/default/pods", json=pod("a"))
        await side.client.post("/api/v1/namespaces/default/pods", json=pod("b"))
        sleep = RecordingSleep()
        w = watcher(settings, sleep=sleep, retry_initial=0.5, retry_max=4.0)
        events = w.watch(kinds.POD.key)
        assert names(await take(events, 3)) == [("ADDED", "a"), ("ADDED", "b"), ("SYNCED", "")]

        await first.__aexit__(None, None, None)  # the API server goes away, watch and all
        await side.client.delete("/api/v1/namespaces/default/pods/a")
        await side.client.post("/api/v1/namespaces/default/pods", json=pod("c"))
        pending = asyncio.ensure_future(take(events, 3, timeout=20))
        while len(sleep.delays) < 3:  # let a few reconnects fail
            await asyncio.sleep(0.02)
        async with kmock.Server(api, port=port):
            after = await pending
            assert names(after) == [("DELETED", "a"), ("ADDED", "c"), ("SYNCED", "")]
            await events.aclose()
        base = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        for delay, limit in zip(sleep.delays, base, strict=False):
            assert limit / 2 <= delay <= limit  # exponential, capped, with jitter
        assert len(set(sleep.delays)) > 1
        assert w.metrics.errors.labels("Pod", "unreachable")._value.get() >= 3
        assert w.metrics.lists.labels("Pod", "error")._value.get() == 1


async def test_api_errors_back_off_then_recover(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        servers = kmock.resource("policy.linkerd.io", "v1beta3", "servers")
        api["list", servers][:2] << 404 << status(404, "NotFound", "the server could not find the requested resource")
        api["list", servers][2:3] << 500 << status(500, "InternalError", "etcd timed out")
        api["list", servers] << listing("7")
        api["watch", servers] << (hold,)
        sleep = RecordingSleep()
        w = watcher(settings, sleep=sleep)
        events = w.watch(kinds.SERVER.key)
        assert names(await take(events, 1)) == [("SYNCED", "")]
        await events.aclose()
        assert len(sleep.delays) == 3
        assert api["list"][0].url.path == "/apis/policy.linkerd.io/v1beta3/servers"
        assert w.metrics.errors.labels(kinds.SERVER.key, "404")._value.get() == 2
        assert w.metrics.errors.labels(kinds.SERVER.key, "500")._value.get() == 1


async def test_a_gateway_api_route_without_its_crd_is_an_empty_collection_until_the_crd_comes(
        tmp_path: Path) -> None:
    """Linkerd watches TLSRoutes (and the other Gateway API routes) only where their CRDs are installed: a
    cluster without them must not keep the policy controller from syncing."""
    async with emulated_api(tmp_path) as (api, _, settings):
        routes = kmock.resource("gateway.networking.k8s.io", "v1alpha2", "tlsroutes")
        route = {"apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TLSRoute",
                 "metadata": {"name": "r", "namespace": "default", "resourceVersion": "3"}}
        api["list", routes][:2] << 404 << status(404, "NotFound", "the server could not find the requested resource")
        api["list", routes] << listing("3", route)
        api["watch", routes] << (hold,)
        sleep = RecordingSleep()
        w = watcher(settings, sleep=sleep)
        events = w.watch(kinds.TLS_ROUTE.key)
        assert names(await take(events, 1)) == [("SYNCED", "")]  # at once: nothing to wait for
        assert names(await take(events, 2)) == [("ADDED", "r"), ("SYNCED", "")]  # the CRD installed later
        await events.aclose()
        assert sleep.delays == [4.0, 4.0]  # listed again every retry_max, quietly
        assert not api_resource(kinds.SERVER.key).optional and api_resource(kinds.TCP_ROUTE.key).optional


async def test_lists_follow_continue_tokens(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS][:1] << listing("9", pod("a", version="1"), token="page-2")
        api["list", PODS][1:2] << listing("9", pod("b", version="2"))
        api["watch", PODS] << (hold,)
        events = watcher(settings, page_size=1).watch(kinds.POD.key)
        assert names(await take(events, 3)) == [("ADDED", "a"), ("ADDED", "b"), ("SYNCED", "")]
        await events.aclose()
        assert [(r.params.get("limit"), r.params.get("continue")) for r in api["list"]] == [("1", None), ("1", "page-2")]


async def test_repeated_events_are_dropped_and_types_follow_what_was_seen(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS] << listing("10", pod("a", version="5"))
        api["watch", PODS] << (
            {"type": "ADDED", "object": pod("a", version="5")},  # already listed: dropped
            {"type": "MODIFIED", "object": pod("n", version="11")},  # never seen: it is an ADDED
            {"type": "DELETED", "object": pod("ghost", version="12")},  # never seen: nothing to delete
            {"type": "ADDED", "object": pod("a", version="13")},  # seen before: a MODIFIED
            hold,
        )
        events = watcher(settings).watch(kinds.POD.key)
        got = await take(events, 4)
        assert names(got) == [("ADDED", "a"), ("SYNCED", ""), ("ADDED", "n"), ("MODIFIED", "a")]
        await events.aclose()


async def test_lag_metric_measures_change_to_arrival(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS] << listing("10")
        changed = pod("a", version="11")
        changed["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        changed["metadata"]["managedFields"] = [{"manager": "kubelet", "time": "2026-01-01T00:00:07Z"}]
        api["watch", PODS] << ({"type": "ADDED", "object": changed}, hold)
        now = change_time(changed) + 3.0
        w = watcher(settings, wall_clock=lambda: now)
        events = w.watch(kinds.POD.key)
        await take(events, 2)
        await events.aclose()
        assert w.metrics.lag.labels("Pod")._sum.get() == pytest.approx(3.0)
        assert w.metrics.last_message.labels("Pod")._value.get() == now


async def test_the_client_closes_with_the_last_watch(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        api["list", PODS] << listing("1")
        api["list", kmock.resource("", "v1", "services")] << listing("1")
        w = watcher(settings)
        one, two = w.watch(kinds.POD.key), w.watch(kinds.SERVICE.key)
        await take(one, 1)
        await take(two, 1)
        await one.aclose()
        assert w.client.host is not None
        await two.aclose()
        assert w.client.host is None


def test_every_kind_of_the_resource_model_has_an_api_path() -> None:
    for rtype in kinds.REGISTRY:
        resource = api_resource(rtype.key)
        assert resource.version == rtype.versions[0]
    assert api_resource("Pod").collection_path("web") == "/api/v1/namespaces/web/pods"
    assert api_resource("Namespace").collection_path("web") == "/api/v1/namespaces"
    assert api_resource(kinds.SERVER.key).collection_path() == "/apis/policy.linkerd.io/v1beta3/servers"
    assert kinds.ENDPOINT_SLICE.key in API_RESOURCES
    assert api_resource(kinds.ENDPOINT_SLICE.key).collection_path("a") == "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices"
    with pytest.raises(KeyError):
        api_resource("Widget")


async def test_endpoint_slices_are_watched_too(tmp_path: Path) -> None:
    async with emulated_api(tmp_path) as (api, _, settings):
        slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                  "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
                  "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]}
        await api.post("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", json=slice_)
        events = watcher(settings).watch(kinds.ENDPOINT_SLICE.key)
        got = await take(events, 2)
        assert names(got) == [("ADDED", "web-abc"), ("SYNCED", "")]
        assert got[0].object["endpoints"][0]["addresses"] == ["10.0.0.1"]
        await events.aclose()


async def test_a_missing_configuration_ends_the_watch(tmp_path: Path) -> None:
    from tether.platform.kubernetes.client import ConfigError

    events = watcher(ClientSettings(kubeconfig=tmp_path / "absent", in_cluster=False)).watch(kinds.POD.key)
    with pytest.raises(ConfigError, match="no usable Kubernetes configuration"):
        await anext(events)
