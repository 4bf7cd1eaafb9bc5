"""Streams that cannot hurt the server: bounded queues, overflow, clean shutdown, the admin port."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from destination_helpers import NS, Harness, Pki, addrs, authority, eventually, namespace, pod, profile, service

from tether.destination import ConfigError, DestinationConfig, DestinationService
from tether.serving.stream import EndReason, UpdateStream
from tether.platform.local.watch import LocalResourceWatcher


async def test_a_full_queue_ends_the_stream_and_drops_its_backlog() -> None:
    overflows: list[int] = []
    stream = UpdateStream(3, on_overflow=lambda: overflows.append(1))
    for i in range(3):
        stream.send(b"%d" % i, 0.0)
    assert stream.queued == 3 and stream.ended is None
    stream.send(b"3", 0.0)
    assert stream.ended is EndReason.OVERFLOW and stream.queued == 0
    stream.send(b"4", 0.0)  # after the end: ignored, no second overflow
    assert overflows == [1]

    async def never(_: bytes) -> None:
        raise AssertionError("nothing is written after the end")

    assert await stream.run(never) is EndReason.OVERFLOW


async def test_the_queue_is_bounded_in_bytes_too_but_one_large_message_still_goes() -> None:
    stream = UpdateStream(100, max_bytes=100)
    stream.send(b"x" * 500, 0.0)  # larger than the bound, but the queue is empty: a snapshot must go out
    assert stream.ended is None and stream.queued_bytes == 500
    stream.send(b"y", 0.0)  # over the byte bound with 1 of 100 messages queued
    assert stream.ended is EndReason.OVERFLOW and stream.queued_bytes == 0

    small = UpdateStream(100, max_bytes=100)
    for _ in range(10):
        small.send(b"z" * 10, 0.0)
    assert small.ended is None and small.queued_bytes == 100
    small.send(b"z", 0.0)
    assert small.ended is EndReason.OVERFLOW


async def test_an_overflow_interrupts_a_write_stuck_on_the_client() -> None:
    stream = UpdateStream(2)
    started = asyncio.Event()
    written: list[bytes] = []

    async def stuck(message: bytes) -> None:
        written.append(message)
        started.set()
        await asyncio.Future()  # the client stopped reading

    runner = asyncio.create_task(stream.run(stuck))
    stream.send(b"first", 0.0)
    await started.wait()
    for i in range(3):
        stream.send(b"more", 0.0)
    assert await asyncio.wait_for(runner, 5) is EndReason.OVERFLOW
    assert written == [b"first"]


async def test_shutdown_ends_a_waiting_writer_and_outside_cancellation_propagates() -> None:
    stream = UpdateStream(10)
    sent: list[float] = []
    stream_with_lag = UpdateStream(10, on_sent=sent.append)

    async def write(_: bytes) -> None:
        return None

    runner = asyncio.create_task(stream.run(write))
    await asyncio.sleep(0)
    stream.end()
    assert await runner is EndReason.SHUTDOWN

    runner = asyncio.create_task(stream_with_lag.run(write))
    stream_with_lag.send(b"x", asyncio.get_running_loop().time())
    await eventually(lambda: len(sent) == 1)
    runner.cancel()
    try:
        await runner
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the client's cancellation must propagate")


async def test_a_client_that_never_reads_is_cut_off_and_others_keep_going(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-0", "10.1.0.100"),
                       stream_queue_capacity=4) as h:
        # A client with a tiny flow-control window (1 KiB, no BDP growth) that never reads: the
        # server's writes to it soon block, and its queue fills.
        stalled_channel = grpc.aio.secure_channel(
            h.address, grpc.ssl_channel_credentials(h.pki.ca.read_bytes()),
            options=[("grpc.ssl_target_name_override", h.client_tls().server_name),
                     ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)],
        )
        stalled = h.get(authority(), channel=stalled_channel)
        healthy = h.get(authority())
        assert addrs(await healthy.next()) == ["10.1.0.100:8080"]
        await eventually(lambda: h.service.server.open_streams == 2)

        overflow = {"service": authority()}
        for round_ in range(60):
            ready = round_ % 2 == 0
            h.apply(pod("web-1", "10.1.0.1", ready=ready))
            update = await healthy.next()  # the healthy client hears every change
            assert update == ({"add": update["add"]} if ready else {"remove": ["10.1.0.1:8080"]})
            if h.metric("endpoint_updates_queue_overflow_total", overflow) == 1:
                break
        else:
            raise AssertionError("the stalled stream never overflowed")
        await eventually(lambda: h.service.server.open_streams == 1)
        labels = {"cluster": "local", "namespace": NS, "service": "web", "port": "80", "hostname": "", "nodename": ""}
        assert h.metric("endpoints_subscribers", labels) == 1

        # The healthy stream goes on.
        h.apply(pod("web-2", "10.1.0.2"))
        assert addrs(await healthy.next()) == ["10.1.0.2:8080"]

        # The stalled client, once it reads, finds what was in flight and then a clear status.
        error = await stalled.error(timeout=30)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "overflowed" in error.details()
        await stalled_channel.close()


async def test_a_burst_of_changes_is_coalesced(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-0", "10.1.0.100")) as h:
        stream = h.get(authority())
        assert addrs(await stream.next()) == ["10.1.0.100:8080"]
        # 300 changes in one store transaction, flapping readiness and adding pods: far more
        # than the queue holds, yet the healthy client keeps up and ends at the right state.
        burst = [pod("web-1", "10.1.0.1", ready=i % 2 == 0) for i in range(200)]
        burst += [pod(f"web-{i}", f"10.1.1.{i}") for i in range(2, 102)]
        h.apply(*burst)
        seen: set[str] = {"10.1.0.100:8080"}
        while len(seen) != 101:
            update = await stream.next()
            if "add" in update:
                seen.update(addrs(update))
            else:
                seen.difference_update(update["remove"])
        assert "10.1.0.1:8080" not in seen
        assert h.metric("destination_updates_sent_total", {"kind": "endpoints"}) < 50


async def test_shutdown_ends_open_streams_cleanly(workdir: Path, pki: Pki) -> None:
    harness = Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1"))
    async with harness as h:
        streams = [h.get(authority()), h.get_profile(authority()), h.get_profile("10.1.0.1:8080")]
        for stream in streams:
            await stream.next()
        await h.service.stop()
        for stream in streams:
            assert await asyncio.wait_for(stream.call.read(), 10) is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK
        assert h.service.server.open_streams == 0


async def _http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, _, body = response.partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


async def test_admin_port_serves_health_and_metrics(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace(), service(), pod("web-1", "10.1.0.1")) as h:
        stream = h.get(authority())
        await stream.next()
        port = h.service.admin_port
        assert port is not None
        assert await _http_get(port, "/ready") == (200, "ok\n")
        assert await _http_get(port, "/live") == (200, "live\n")
        assert (await _http_get(port, "/nope"))[0] == 404
        status, metrics = await _http_get(port, "/metrics")
        assert status == 200
        for line in (
            'endpoints_subscribers{cluster="local",hostname="",namespace="emojivoto",nodename="",port="80",'
            'service="web"} 1.0',
            'pod_cache_size{cluster="local"} 1.0',
            'service_cache_size{cluster="local"} 1.0',
            'destination_updates_sent_total{kind="endpoints"} 1.0',
            'destination_streams{method="Get"} 1.0',
        ):
            assert line in metrics, line
        assert "destination_delivery_lag_seconds_bucket" in metrics
        await h.service.stop()
        assert h.service.ready is False


async def test_a_taken_port_is_a_config_error_and_nothing_is_left_running(workdir: Path, pki: Pki) -> None:
    async with Harness(workdir, pki, namespace()) as h:
        second = DestinationService(
            DestinationConfig(addr=h.address, admin_addr="127.0.0.1:0", tls=h.service.config.tls),
            LocalResourceWatcher(h.store),
        )
        try:
            await second.start()
        except ConfigError as exc:
            assert h.address in str(exc)
        else:
            await second.stop()
            raise AssertionError("two servers on one port")
        assert second.ready is False and second.server.open_streams == 0


async def test_a_slow_client_of_large_profiles_delays_no_other_stream_nor_the_admin_port(
    workdir: Path, pki: Pki
) -> None:
    """Issue 19 item 5: unread GetProfile streams of ~30 KB profiles are cut by bytes, not after 100 messages."""
    routes = [{"name": f"GET /route/{i:04d}/" + "x" * 200, "condition": {"method": "GET", "pathRegex": f"/r{i}"}}
              for i in range(120)]
    async with Harness(workdir, pki, namespace(), service(), profile(routes=routes),
                       stream_queue_capacity=100, stream_queue_bytes=256 * 1024) as h:
        stalled_channels = [
            grpc.aio.secure_channel(
                h.address, grpc.ssl_channel_credentials(h.pki.ca.read_bytes()),
                options=[("grpc.ssl_target_name_override", h.client_tls().server_name),
                         ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)],
            )
            for _ in range(5)
        ]
        stalled = [h.get_profile(authority(), channel=c) for c in stalled_channels]
        healthy = h.get_profile(authority())
        first = await healthy.next()
        assert len(first["routes"]) == 120
        await eventually(lambda: h.service.server.open_streams == 6)
        port = h.service.admin_port
        assert port is not None

        sent = 0
        for round_ in range(90):  # fewer updates than the message bound: only the byte bound can trip
            routes[0] = {**routes[0], "name": f"GET /round/{round_}"}
            h.apply(profile(routes=routes))
            update = await healthy.next()  # the healthy stream hears every change, in order
            assert update["routes"][0]["metrics_labels"]["route"] == f"GET /round/{round_}"
            assert await _http_get(port, "/ping") == (200, "pong\n")  # the admin port answers meanwhile
            sent += 1
            if h.service.server.open_streams == 1:
                break
        assert h.service.server.open_streams == 1, "the stalled streams were never cut off"
        assert sent < 100
        overflows = h.metric("profile_updates_queue_overflow_total",
                             {"fqn": f"web.{NS}.svc.cluster.local", "port": "80"})
        assert overflows == 5
        # (Their status is not asserted: with a large write in flight, gRPC core refuses a second send op,
        # so a client that stopped reading mid-message learns of the end only from HTTP/2 itself.)
        for stream in stalled:
            stream.cancel()
        for channel in stalled_channels:
            await channel.close()
