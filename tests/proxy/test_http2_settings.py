"""The HTTP/2 variables of proxy.md §2.7: parsed (errors naming the variable), and in effect in the core's SETTINGS,
its refusals, its rapid-reset bound and its upstream connections' windows; end to end through a real proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hpack
import pytest
from h2_playbook import Connect, Connected, Down, GoAway, H2Playbook, Headers, Rst, SendDown, SendUp
from playbook import Close, Count
from proxy_harness import Mesh, connection, run
from test_http2_proxy import ADDRS, GET, Router, http_settings

from tether.proxy.codec.http2 import PREFACE, ErrorCodes, Http2Params
from tether.proxy.core.config import ConfigError, ProxyConfig
from tether.proxy.core.http2_proxy import Http2Proxy
from tether.proxy.core.http_commands import Upstream

SERVER = "LINKERD2_PROXY_INBOUND_SERVER_HTTP2"


def settings_of(data: bytes) -> dict[int, int]:
    """The values of the first SETTINGS frame in ``data`` (after a client preface, if any)."""
    data = data.removeprefix(PREFACE)
    assert data[3] == 0x4
    payload = data[9:9 + int.from_bytes(data[:3], "big")]
    return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
            for i in range(0, len(payload), 6)}


def test_the_server_variables_are_read(minimal_env: dict[str, str]) -> None:
    env = {f"{SERVER}_INITIAL_STREAM_WINDOW_SIZE": "1000000", f"{SERVER}_INITIAL_CONNECTION_WINDOW_SIZE": "4000000",
           f"{SERVER}_MAX_CONCURRENT_STREAMS": "7", f"{SERVER}_MAX_FRAME_SIZE": "65536",
           f"{SERVER}_MAX_HEADER_LIST_SIZE": "8192", f"{SERVER}_MAX_PENDING_ACCEPT_RESET_STREAMS": "3",
           "LINKERD2_PROXY_HTTP2_INITIAL_STREAM_WINDOW_SIZE": "131072"}
    config = ProxyConfig.from_env({**minimal_env, **env})
    assert config.inbound.server_h2.params == Http2Params(1_000_000, 4_000_000, 7, 65536, 8192)
    assert config.inbound.server_h2.max_pending_accept_reset_streams == 3
    assert config.outbound.server_h2.params == Http2Params()  # unset: Linkerd's defaults
    assert config.http2_client == Http2Params(stream_window=131072)


def test_the_variables_not_applied_are_warned_about_by_name(minimal_env: dict[str, str]) -> None:
    outbound = "LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2"
    config = ProxyConfig.from_env({**minimal_env, f"{SERVER}_ADAPTIVE_FLOW_CONTROL": "true",
                                   f"{outbound}_MAX_SEND_BUF_SIZE": "409600",
                                   f"{outbound}_ADAPTIVE_FLOW_CONTROL": "false"})
    assert [w.split(" ")[0] for w in config.unapplied] == [f"{SERVER}_ADAPTIVE_FLOW_CONTROL=true",
                                                          f"{outbound}_MAX_SEND_BUF_SIZE=409600"]
    assert ProxyConfig.from_env(minimal_env).unapplied == ()
    with pytest.raises(ConfigError, match=f"{SERVER}_ADAPTIVE_FLOW_CONTROL"):
        ProxyConfig.from_env({**minimal_env, f"{SERVER}_ADAPTIVE_FLOW_CONTROL": "sometimes"})
    with pytest.raises(ConfigError, match=f"{outbound}_MAX_SEND_BUF_SIZE"):
        ProxyConfig.from_env({**minimal_env, f"{outbound}_MAX_SEND_BUF_SIZE": "-5"})


@pytest.mark.parametrize("env,named", [
    ({f"{SERVER}_INITIAL_STREAM_WINDOW_SIZE": "1000000"}, f"{SERVER}_INITIAL_CONNECTION_WINDOW_SIZE"),
    ({f"{SERVER}_INITIAL_STREAM_WINDOW_SIZE": "2147483648", f"{SERVER}_INITIAL_CONNECTION_WINDOW_SIZE": "70000"},
     f"{SERVER}_INITIAL_STREAM_WINDOW_SIZE"),
    ({"LINKERD2_PROXY_HTTP2_INITIAL_CONNECTION_WINDOW_SIZE": "1000"}, "_HTTP2_INITIAL_CONNECTION_WINDOW_SIZE"),
    ({f"{SERVER}_MAX_FRAME_SIZE": "1000"}, f"{SERVER}_MAX_FRAME_SIZE"),
    ({f"{SERVER}_MAX_CONCURRENT_STREAMS": "-1"}, f"{SERVER}_MAX_CONCURRENT_STREAMS"),
    ({f"{SERVER}_MAX_PENDING_ACCEPT_RESET_STREAMS": "many"}, f"{SERVER}_MAX_PENDING_ACCEPT_RESET_STREAMS"),
])
def test_bad_values_name_their_variable(minimal_env: dict[str, str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ProxyConfig.from_env({**minimal_env, **env})


class _Sink:
    """Records what the core writes, raw (the handshake included)."""

    def __init__(self) -> None:
        self.down = b""
        self.up = b""
        self.connects: list[Callable[[Any], None]] = []

    def send_down(self, data: bytes) -> None:
        self.down += data

    def send_up(self, up: Upstream, data: bytes) -> None:
        self.up += data

    def connect(self, connect: object, header: object, done: Callable[[Any], None]) -> None:
        self.connects.append(done)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kw: None  # the rest of Http2Sink: not used by these exchanges


def test_the_core_advertises_the_server_settings_and_opens_upstreams_with_the_client_windows() -> None:
    sink = _Sink()
    server = Http2Params(stream_window=1_000_000, connection_window=4_000_000, max_concurrent_streams=7,
                         max_frame_size=65536, max_header_list_size=8192)
    core = Http2Proxy(Router(ADDRS[:1]), http_settings(h2_server=server, h2_client=Http2Params(stream_window=131072)),
                      sink)  # type: ignore[arg-type]
    core.start()
    assert settings_of(sink.down) == {0x3: 7, 0x4: 1_000_000, 0x6: 8192, 0x5: 65536}
    assert sink.down.endswith((4_000_000 - 65_535).to_bytes(4, "big"))  # the connection window, raised
    core.down_data(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                   + _frame(0x1, 0x5, 1, hpack.Encoder().encode(GET)))
    sink.connects[0](Upstream(0, None, 0.001, reused=False))
    assert settings_of(sink.up)[0x4] == 131072


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def test_a_stream_over_the_limit_is_refused_and_the_others_go_on() -> None:
    settings = http_settings(h2_server=Http2Params(max_concurrent_streams=1))
    assert (H2Playbook(Router(ADDRS[:1]), settings)
            >> Down(Headers(1, GET, end=True), Headers(3, GET, end=True))
            << Connect(ADDRS[0])
            << SendDown(Rst(3, ErrorCodes.REFUSED_STREAM))  # safe for the client to send again
            >> Connected()
            << SendUp(0, Headers(1, [*GET], end=True)))


def test_the_rapid_reset_bound_is_the_variables() -> None:
    settings = http_settings(h2_max_pending_resets=1)
    frames = [f for sid in (1, 3) for f in (Headers(sid, GET), Rst(sid, ErrorCodes.CANCEL))]
    assert (H2Playbook(Router(ADDRS[:1]), settings)
            >> Down(*frames)
            << Count("outbound_http_errors_total", 'error="rapid reset"')
            << SendDown(GoAway(ErrorCodes.ENHANCE_YOUR_CALM, 3))
            << Close())


def test_a_real_proxy_advertises_its_variables(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Mesh(tmp_path) as mesh:
            empty, _ = await mesh.proxy_to_nowhere(
                LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_MAX_CONCURRENT_STREAMS="3",
                LINKERD2_PROXY_OUTBOUND_SERVER_HTTP2_MAX_FRAME_SIZE="32768")
            async with connection(empty, 80) as (reader, writer):
                writer.write(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                head = await asyncio.wait_for(reader.readexactly(9), 30)
                body = await asyncio.wait_for(reader.readexactly(int.from_bytes(head[:3], "big")), 30)
                values = settings_of(head + body)
                assert values[0x3] == 3 and values[0x5] == 32768

    run(scenario())
