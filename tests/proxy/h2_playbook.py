"""Playbook tests for the push-driven HTTP/2 core: frames in (``>>``), sink calls out (``<<``), as frames.

    assert (H2Playbook(router, settings)
            >> Down(Headers(1, GET, end=True))
            << Connect(ADDR)
            >> Connected()
            << SendUp(0, Headers(1, GET_UP, end=True))
            >> Up(0, Headers(1, OK))
            << SendDown(Headers(1, OK)))

What the core writes is decoded back into frames (one HPACK decoder per
connection, as its peer would have) and compared with the expected ones up to
the next input; consecutive writes to one connection are joined, so a test
does not depend on how finely the core writes. The handshake is done by the
playbook and left out of the comparison: the prefaces, every SETTINGS frame
(and its ACK) and the connection windows raised to Linkerd's 1 MiB. Upstream
connections are numbered in the order the core asked for them; ``Connected``
answers the oldest pending one (and an HTTP/2 server's SETTINGS come in with
it). An HTTP/1 connection to the app (a downgraded stream: ``Checkout``) is
written and read as bytes (``SendUpBytes``, ``UpBytes``).
No sockets and no event loop: timers and discovery waits are answered by
the test (``Fire``, ``Waited``). The runner, and the inputs and calls that are
not about bytes, are ``playbook.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hpack
import hyperframe.frame as hf

from playbook import (
    CallLater,
    Checkin,
    Close,
    ConnectFailed,
    Count,
    DownLost,
    Fire,
    Playbook,
    UpEof,
    Wait,
    Waited,
    _Timer,
)

from tether.proxy.codec.http2 import CONNECTION_WINDOW, PREFACE, STREAM_WINDOW
from tether.proxy.core.commands import Command, Connect as ConnectCommand, Failed
from tether.proxy.core.http import HttpSettings, Router
from tether.proxy.core.http2_proxy import Http2Proxy
from tether.proxy.core.http_commands import Upstream

H = list[tuple[bytes, bytes]]

# -- frames ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Headers:
    sid: int
    headers: tuple[tuple[bytes, bytes], ...] | H
    end: bool = False

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Headers) and (self.sid, list(self.headers), self.end)
                == (other.sid, list(other.headers), other.end))

    def __hash__(self) -> int:
        return hash(self.sid)


@dataclass(frozen=True)
class Data:
    sid: int
    data: bytes
    end: bool = False
    pad: int = 0  # padding bytes (PADDED): sent by the test's peers only


@dataclass(frozen=True)
class Rst:
    sid: int
    code: int


@dataclass(frozen=True)
class GoAway:
    code: int
    last: int = 0


@dataclass(frozen=True)
class Window:
    sid: int
    increment: int


@dataclass(frozen=True)
class Ping:
    ack: bool = False
    data: bytes = field(default=b"playbook", compare=False)  # sent as given; what the core sends is not compared


Frame = Headers | Data | Rst | GoAway | Window | Ping


@dataclass(frozen=True, init=False)
class _ToClient:
    """Frames the client sends or is sent (``Down(f1, f2)``)."""

    frames: tuple[Frame, ...]

    def __init__(self, *frames: Frame) -> None:
        object.__setattr__(self, "frames", frames)


@dataclass(frozen=True, init=False)
class _ToUpstream:
    """Frames upstream connection ``n`` sends or is sent (``Up(0, f1, f2)``)."""

    n: int
    frames: tuple[Frame, ...]

    def __init__(self, n: int, *frames: Frame) -> None:
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "frames", frames)


# -- inputs ------------------------------------------------------------------------------------------------------


class Down(_ToClient):
    """The client sends these frames, in one read."""


class Up(_ToUpstream):
    """Upstream connection ``n`` sends these frames, in one read."""


@dataclass(frozen=True)
class UpBytes:
    """Upstream connection ``n`` (an HTTP/1 app, for a downgraded stream) sends these bytes."""

    n: int
    data: bytes




@dataclass(frozen=True)
class Connected:
    """The oldest pending connect succeeds (and the server's SETTINGS arrive: ``window``, its streams' initial
    window, and ``streams``, its MAX_CONCURRENT_STREAMS, when given)."""

    window: int | None = None
    streams: int | None = None


@dataclass(frozen=True)
class Do:
    """Run ``action`` (move a test's clock, say) between inputs."""

    action: Callable[[], None]





@dataclass(frozen=True)
class Writable:
    """A write buffer filled (False) or drained (True); ``n`` None: the client's."""

    n: int | None
    writable: bool


# -- sink calls --------------------------------------------------------------------------------------------------


class SendDown(_ToClient):
    """Frames written to the client."""


class SendUp(_ToUpstream):
    """Frames written to upstream connection ``n``."""


@dataclass(frozen=True)
class Connect:
    addr: object


@dataclass(frozen=True)
class Checkout:
    """An HTTP/1 connection asked for (a downgraded stream): ``pooled``, one checked in for reuse is answered at
    once (the oldest; ``Connected`` answers the others)."""

    addr: object
    pooled: bool = False


@dataclass(frozen=True)
class SendUpBytes:
    """Bytes written to HTTP/1 connection ``n``."""

    n: int
    data: bytes







# -- the wire ----------------------------------------------------------------------------------------------------

_INITIAL_RAISE = CONNECTION_WINDOW - STREAM_WINDOW  # the connection window raised by each side's handshake


class _Side:
    """One connection as its peer sees it: an HPACK encoder for what it sends, a decoder for what it gets."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = b""
        self.handshake = True  # the first connection-window raise is the handshake's

    def encode(self, frames: tuple[Frame, ...]) -> bytes:
        out = b""
        for frame in frames:
            if isinstance(frame, Headers):
                f: hf.Frame = hf.HeadersFrame(frame.sid)
                f.data = self.encoder.encode(list(frame.headers))
                f.flags.add("END_HEADERS")
            elif isinstance(frame, Data):
                f = hf.DataFrame(frame.sid)
                f.data = frame.data
                if frame.pad:
                    f.flags.add("PADDED")
                    f.pad_length = frame.pad
            elif isinstance(frame, Rst):
                f = hf.RstStreamFrame(frame.sid)
                f.error_code = frame.code
            elif isinstance(frame, GoAway):
                f = hf.GoAwayFrame(0)
                f.error_code = frame.code
                f.last_stream_id = frame.last
            elif isinstance(frame, Window):
                f = hf.WindowUpdateFrame(frame.sid)
                f.window_increment = frame.increment
            else:
                f = hf.PingFrame(0)
                f.opaque_data = frame.data
                if frame.ack:
                    f.flags.add("ACK")
            if getattr(frame, "end", False):
                f.flags.add("END_STREAM")
            out += f.serialize()
        return out

    def decode(self, data: bytes) -> list[Frame]:
        """The frames in what the core wrote, handshake frames left out."""
        self.buffer += data
        if self.buffer.startswith(PREFACE):
            self.buffer = self.buffer[len(PREFACE):]
        frames: list[Frame] = []
        while len(self.buffer) >= 9:
            f, length = hf.Frame.parse_frame_header(memoryview(self.buffer[:9]))
            if len(self.buffer) < 9 + length:
                break
            f.parse_body(memoryview(self.buffer[9:9 + length]))
            self.buffer = self.buffer[9 + length:]
            end = "END_STREAM" in f.flags
            if isinstance(f, hf.HeadersFrame):
                frames.append(Headers(f.stream_id, list(self.decoder.decode(f.data, raw=True)), end))
            elif isinstance(f, hf.DataFrame):
                frames.append(Data(f.stream_id, f.data, end))
            elif isinstance(f, hf.RstStreamFrame):
                frames.append(Rst(f.stream_id, f.error_code))
            elif isinstance(f, hf.GoAwayFrame):
                frames.append(GoAway(f.error_code, f.last_stream_id))
            elif isinstance(f, hf.WindowUpdateFrame):
                if self.handshake and f.stream_id == 0 and f.window_increment == _INITIAL_RAISE:
                    self.handshake = False
                    continue
                frames.append(Window(f.stream_id, f.window_increment))
            elif isinstance(f, hf.PingFrame):
                frames.append(Ping("ACK" in f.flags, f.opaque_data))
            # SETTINGS (and their ACKs): the handshake's
        return frames


# -- the sink ----------------------------------------------------------------------------------------------------



class H2Sink:
    """The core's ``Http2Sink``, recording each call (writes decoded into frames)."""

    def __init__(self) -> None:
        self.calls: list[object] = []
        self.client = _Side()
        self.ups: dict[int, Upstream] = {}
        self.sides: dict[int, _Side] = {}
        self.asked = 0  # connections asked for so far (their numbers)
        self.h1: set[int] = set()  # the HTTP/1 ones
        self.connects: list[tuple[Callable[[Upstream | Failed], None], int]] = []
        self.waits: list[Callable[[Any], None]] = []
        self.timers: list[_Timer] = []
        self.reading: dict[int, bool] = {}
        self.pool: list[Upstream] = []  # HTTP/1 connections checked in for reuse

    def send_down(self, data: bytes) -> None:
        self.calls.append(SendDown(*self.client.decode(data)))

    def close(self) -> None:
        self.calls.append(Close())

    def connect(self, connect: ConnectCommand, header: bytes | None,
                done: Callable[[Upstream | Failed], None]) -> None:
        self.calls.append(Connect(connect.addr))
        self.connects.append((done, self.asked))
        self.asked += 1

    def checkout(self, connect: ConnectCommand, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        if self.pool:
            self.calls.append(Checkout(connect.addr, pooled=True))
            up = self.pool.pop(0)
            up.reused = True
            return up
        self.calls.append(Checkout(connect.addr))
        self.h1.add(self.asked)
        self.connects.append((done, self.asked))
        self.asked += 1
        return None

    def send_up(self, up: Upstream, data: bytes) -> None:
        n: int = up.key  # type: ignore[assignment]
        if n in self.h1:
            self.calls.append(SendUpBytes(n, data))
        else:
            self.calls.append(SendUp(n, *self.sides[n].decode(data)))

    def checkin(self, up: Upstream, reuse: bool) -> None:
        self.calls.append(Checkin(up.key, reuse))  # type: ignore[arg-type]
        if reuse and up.key in self.h1:
            self.pool.append(up)

    def read_up(self, up: Upstream, reading: bool) -> None:
        self.reading[up.key] = reading  # type: ignore[index]

    def wait(self, command: Command, done: Callable[[Any], None]) -> None:
        self.calls.append(Wait())
        self.waits.append(done)

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        self.calls.append(CallLater(round(delay, 3)))
        timer = _Timer(callback)
        self.timers.append(timer)
        return timer

    def count(self, name: str, labels: str) -> None:
        self.calls.append(Count(name, labels))


def _joined(calls: list[object]) -> list[object]:
    """Consecutive writes to the same connection as one write; writes of handshake frames only left out."""
    out: list[object] = []
    for call in calls:
        last = out[-1] if out else None
        if isinstance(call, (SendDown, SendUp)) and not call.frames:
            continue
        if isinstance(call, SendDown) and isinstance(last, SendDown):
            out[-1] = SendDown(*last.frames, *call.frames)
        elif isinstance(call, SendUp) and isinstance(last, SendUp) and last.n == call.n:
            out[-1] = SendUp(call.n, *last.frames, *call.frames)
        elif isinstance(call, SendUpBytes) and isinstance(last, SendUpBytes) and last.n == call.n:
            out[-1] = SendUpBytes(call.n, last.data + call.data)
        else:
            out.append(call)
    return out


class H2Playbook(Playbook):
    """Inputs and expected sink calls of an ``Http2Proxy`` (``downgrade``: it honours ``l5d-orig-proto``),
    checked on ``bool()`` as ``playbook.Playbook`` checks them; the handshake is done first."""

    def __init__(self, router: Router, settings: HttpSettings, downgrade: bool = False) -> None:
        super().__init__(router, settings, sink=H2Sink())  # type: ignore[arg-type]
        self.downgrade = downgrade

    def start(self) -> None:
        core = Http2Proxy(self.router, self.settings, self.sink, downgrade=self.downgrade)  # type: ignore[arg-type]
        self.core = core  # type: ignore[assignment]
        core.start()
        core.down_data(PREFACE + hf.SettingsFrame(0).serialize())

    def apply(self, event: object) -> None:
        _apply(self.core, self.sink, event)  # type: ignore[arg-type]

    @staticmethod
    def joined(calls: list[object]) -> list[object]:
        return _joined(calls)


def _apply(core: Http2Proxy, sink: H2Sink, event: object) -> None:
    if isinstance(event, Down):
        core.down_data(sink.client.encode(event.frames))
    elif isinstance(event, Up):
        core.up_data(sink.ups[event.n], sink.sides[event.n].encode(event.frames))
    elif isinstance(event, UpBytes):
        core.up_data(sink.ups[event.n], event.data)
    elif isinstance(event, DownLost):
        core.down_lost()
    elif isinstance(event, UpEof):
        core.up_eof(sink.ups[event.up])
    elif isinstance(event, Connected):
        done, n = sink.connects.pop(0)
        up = sink.ups[n] = Upstream(n, None, 0.001, reused=False)
        sink.sides[n] = _Side()
        done(up)
        if n not in sink.h1:
            server_settings = {} if event.window is None else {hf.SettingsFrame.INITIAL_WINDOW_SIZE: event.window}
            if event.streams is not None:
                server_settings[hf.SettingsFrame.MAX_CONCURRENT_STREAMS] = event.streams
            core.up_data(up, hf.SettingsFrame(0, settings=server_settings).serialize())  # the server's preface
    elif isinstance(event, ConnectFailed):
        done, _ = sink.connects.pop(0)
        done(Failed(event.error, event.errno))
    elif isinstance(event, Waited):
        sink.waits.pop(0)(event.reply)
    elif isinstance(event, Fire):
        timer = next(t for t in sink.timers if not t.cancelled)
        sink.timers.remove(timer)
        timer.callback()
    elif isinstance(event, Do):
        event.action()
    elif isinstance(event, Writable):
        core.writable(sink.ups[event.n] if event.n is not None else None, event.writable)
    else:
        raise AssertionError(f"unknown input {event!r}")
