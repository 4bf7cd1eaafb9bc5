"""Playbook tests for the push-driven HTTP/1 core (mitmproxy's style): events in (``>>``), sink calls out (``<<``).

    assert (Playbook(core)
            >> DownData(b"GET / HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n")
            << Checkout(ADDR)
            >> Connected()
            << SendUp(0, b"GET / HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n"))

The playbook runs on ``assert``: each input is applied to a fresh core, and
the sink calls it made are compared with the expected ones up to the next
input. Consecutive writes to one side are joined before comparing, so a
test does not depend on how finely the core writes; a mismatch prints both
lists. Upstream connections are numbered in the order the sink made them.
No sockets, no event loop: timers and discovery waits are answered by the
test (``Fire``, ``Waited``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.proxy.core.commands import Command, Connect, Failed, Revocable
from tether.proxy.core.http import HttpSettings, Router
from tether.proxy.core.http1_proxy import Http1Proxy
from tether.proxy.core.http_commands import Upstream

# -- inputs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownData:
    data: bytes


@dataclass(frozen=True)
class DownEof:
    pass


@dataclass(frozen=True)
class DownLost:
    pass


@dataclass(frozen=True)
class UpData:
    up: int
    data: bytes


@dataclass(frozen=True)
class UpEof:
    up: int


@dataclass(frozen=True)
class Connected:
    """The oldest pending checkout gets a new connection."""


@dataclass(frozen=True)
class ConnectFailed:
    error: str = "i/o"
    errno: str = "ECONNREFUSED"
    timed_out: bool = False


@dataclass(frozen=True)
class Waited:
    """The oldest pending discovery wait is answered ``reply``."""

    reply: Any


@dataclass(frozen=True)
class Fire:
    """The oldest armed timer fires."""


@dataclass(frozen=True)
class Run:
    """Run ``fn`` at this point of the play (e.g. move the test's clock on)."""

    fn: Callable[[], object]


# -- sink calls --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendDown:
    data: bytes


@dataclass(frozen=True)
class SendUp:
    up: int
    data: bytes


@dataclass(frozen=True)
class Checkout:
    addr: object
    pooled: bool = False  # answered at once from the pool


@dataclass(frozen=True)
class Checkin:
    up: int
    reuse: bool


@dataclass(frozen=True)
class Wait:
    pass


@dataclass(frozen=True)
class CallLater:
    delay: float


@dataclass(frozen=True)
class Count:
    name: str
    labels: str


@dataclass(frozen=True)
class PauseDown:
    pass


@dataclass(frozen=True)
class ResumeDown:
    pass


@dataclass(frozen=True)
class Tunnel:
    up: int
    to_up: bytes
    to_down: bytes
    watched: bool = False  # given something that may withdraw it (an inbound policy's watch)


@dataclass(frozen=True)
class Close:
    pass


class _Timer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeSink:
    """The core's ``Http1Sink``, recording each call; a pool of idle connections the test can fill."""

    def __init__(self, pooling: bool = True) -> None:
        self.pooling = pooling  # connections checked in for reuse come back at the next checkout
        self.calls: list[object] = []
        self.ups: list[Upstream] = []
        self.idle: list[Upstream] = []  # the pool
        self.checkouts: list[Callable[[Upstream | Failed], None]] = []
        self.waits: list[Callable[[Any], None]] = []
        self.timers: list[_Timer] = []
        self.tunnel_done: list[Callable[[], None]] = []
        self.held: Upstream | None = None  # the connection in hand (what send_up writes to), as Http1Io's ``up``

    def new_up(self, reused: bool = False) -> Upstream:
        up = Upstream(len(self.ups), None, 0.001, reused)
        self.ups.append(up)
        return up

    def send_down(self, data: bytes) -> None:
        self.calls.append(SendDown(data))

    def pause_down(self) -> None:
        self.calls.append(PauseDown())

    def resume_down(self) -> None:
        self.calls.append(ResumeDown())

    def close(self) -> None:
        self.calls.append(Close())

    def checkout(self, connect: Connect, header: bytes | None,
                 done: Callable[[Upstream | Failed], None]) -> Upstream | None:
        if self.idle:
            up = self.idle.pop()
            up.reused = True
            self.calls.append(Checkout(connect.addr, pooled=True))
            self.held = up
            return up
        self.calls.append(Checkout(connect.addr))
        self.checkouts.append(lambda reply: self._ready(reply, done))
        return None

    def _ready(self, reply: Upstream | Failed, done: Callable[[Upstream | Failed], None]) -> None:
        if isinstance(reply, Upstream) and self.held is None:
            self.held = reply
        done(reply)

    def send_up(self, data: bytes) -> None:
        assert self.held is not None, "send_up with no connection in hand"
        self.calls.append(SendUp(self.held.key, data))  # type: ignore[arg-type]

    def checkin(self, up: Upstream, reuse: bool) -> None:
        self.calls.append(Checkin(up.key, reuse))  # type: ignore[arg-type]
        if self.held is up:
            self.held = None
        if reuse and self.pooling:
            self.idle.append(up)

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

    def tunnel(self, up: Upstream, to_up: bytes, to_down: bytes, done: Callable[[], None],
               authz: Revocable | None) -> None:
        self.calls.append(Tunnel(up.key, to_up, to_down, authz is not None))  # type: ignore[arg-type]
        self.tunnel_done.append(done)
        if self.held is up:
            self.held = None


def _joined(calls: list[object]) -> list[object]:
    """Consecutive writes to the same side as one write."""
    out: list[object] = []
    for call in calls:
        last = out[-1] if out else None
        if isinstance(call, SendDown) and isinstance(last, SendDown):
            out[-1] = SendDown(last.data + call.data)
        elif isinstance(call, SendUp) and isinstance(last, SendUp) and last.up == call.up:
            out[-1] = SendUp(call.up, last.data + call.data)
        elif isinstance(call, (SendDown, SendUp)) and not call.data:
            continue
        else:
            out.append(call)
    return out


@dataclass(frozen=True)
class Steps:
    """Several inputs and expected calls as one (``>>`` or ``<<`` it): a sequence many playbooks share."""

    steps: tuple[tuple[str, object], ...]


def exchange(addr: object, up: int, request: bytes, response: bytes) -> Steps:
    """``request`` served on a new upstream connection (number ``up``) to ``addr``: checked out, connected,
    written, answered with ``response``, which goes down; the connection is checked in for reuse."""
    return Steps((("out", Checkout(addr)), ("in", Connected()), ("out", SendUp(up, request)),
                  ("in", UpData(up, response)), ("out", SendDown(response)), ("out", Checkin(up, reuse=True))))


@dataclass
class Playbook:
    """Inputs and expected sink calls, checked on ``bool()`` (``assert playbook``)."""

    router: Router
    settings: HttpSettings
    steps: list[tuple[str, object]] = field(default_factory=list)
    sink: FakeSink = field(default_factory=FakeSink)
    core: Http1Proxy | None = None

    def __rshift__(self, event: object) -> Playbook:
        return self._add("in", event)

    def __lshift__(self, call: object) -> Playbook:
        return self._add("out", call)

    def _add(self, kind: str, item: object) -> Playbook:
        self.steps.extend(item.steps if isinstance(item, Steps) else [(kind, item)])
        return self

    def start(self) -> None:
        """Make the core (``tests/proxy/h2_playbook.py`` makes an HTTP/2 one)."""
        self.core = Http1Proxy(self.router, self.settings, self.sink)

    def apply(self, event: object) -> None:
        _apply(self.core, self.sink, event)  # type: ignore[arg-type]

    @staticmethod
    def joined(calls: list[object]) -> list[object]:
        return _joined(calls)

    def __bool__(self) -> bool:
        sink = self.sink
        self.start()
        expected: list[object] = []
        applied: list[object] = []
        for kind, item in [*self.steps, ("in", None)]:
            if kind == "out":
                expected.append(item)
                continue
            got = self.joined(sink.calls)
            want = self.joined(expected)
            if got != want:
                where = f"after {applied[-1]!r}" if applied else "at the start"
                raise AssertionError(f"sink calls differ {where}:\n  expected {want}\n  got      {got}")
            sink.calls.clear()
            expected.clear()
            if item is None:
                return True
            applied.append(item)
            self.apply(item)
        return True


def _apply(core: Http1Proxy, sink: FakeSink, event: object) -> None:
    if isinstance(event, DownData):
        core.down_data(event.data)
    elif isinstance(event, DownEof):
        core.down_eof()
    elif isinstance(event, DownLost):
        core.down_lost()
    elif isinstance(event, UpData):
        core.up_data(sink.ups[event.up], event.data)
    elif isinstance(event, UpEof):
        core.up_eof(sink.ups[event.up])
    elif isinstance(event, Connected):
        sink.checkouts.pop(0)(sink.new_up())
    elif isinstance(event, ConnectFailed):
        sink.checkouts.pop(0)(Failed(event.error, event.errno, event.timed_out))
    elif isinstance(event, Waited):
        sink.waits.pop(0)(event.reply)
    elif isinstance(event, Run):
        event.fn()
    elif isinstance(event, Fire):
        timer = next(t for t in sink.timers if not t.cancelled)
        sink.timers.remove(timer)
        timer.callback()
    else:
        raise AssertionError(f"unknown input {event!r}")
