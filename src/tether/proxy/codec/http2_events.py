"""What ``codec.http2.H2Endpoint`` reports, and the error codes of RFC 9113 §7.

The events have the names and attributes of the ``h2`` library's (the
shapes the proxy's HTTP/2 core was written against, and that a reader of h2
knows): a message's headers (``RequestReceived``, ``ResponseReceived``,
``InformationalResponseReceived``, ``TrailersReceived``), ``DataReceived``,
``StreamEnded`` (also carried as ``stream_ended`` by the event whose frame
ended the stream: the event itself, or None), ``StreamReset``,
``WindowUpdated``, ``RemoteSettingsChanged``, ``PingAckReceived`` and
``GoAway``. Plain slotted classes: one is made per frame on the hot path.

Callers: ``codec.http2``, ``core.http2_proxy``, tests, the tap server.
"""

from __future__ import annotations

import enum

Headers = list[tuple[bytes, bytes]]


class ErrorCodes(enum.IntEnum):
    """RFC 9113 §7 (the names h2 uses; an ``int`` wherever a code is)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def error_name(code: int) -> str:
    """``CANCEL``, ``PROTOCOL_ERROR``... (the ``h2(...)`` metric label); the number for an unknown code."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return str(code)


class Event:
    __slots__: tuple[str, ...] = ()

    def _fields(self) -> list[str]:
        return [name for cls in reversed(type(self).__mro__) for name in getattr(cls, "__slots__", ())]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self._fields())

    __hash__ = None  # type: ignore[assignment]


class StreamEnded(Event):
    """The peer ended its side of the stream."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class _HeaderBlock(Event):
    """A message head or trailers on ``stream_id``; ``stream_ended`` when the block ended the stream."""

    __slots__ = ("stream_id", "headers", "stream_ended")

    def __init__(self, stream_id: int, headers: Headers, stream_ended: StreamEnded | None) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.stream_ended = stream_ended


class RequestReceived(_HeaderBlock):
    __slots__ = ()


class ResponseReceived(_HeaderBlock):
    __slots__ = ()


class InformationalResponseReceived(Event):
    """A 1xx response head (never the end of the stream)."""

    __slots__ = ("stream_id", "headers")

    def __init__(self, stream_id: int, headers: Headers) -> None:
        self.stream_id = stream_id
        self.headers = headers


class TrailersReceived(_HeaderBlock):
    """Trailers (always followed by ``StreamEnded``)."""

    __slots__ = ()


class DataReceived(Event):
    """``data`` without padding; ``flow_controlled_length`` with it (what to acknowledge once dealt with)."""

    __slots__ = ("stream_id", "data", "flow_controlled_length", "stream_ended")

    def __init__(self, stream_id: int, data: bytes, flow_controlled_length: int,
                 stream_ended: StreamEnded | None) -> None:
        self.stream_id = stream_id
        self.data = data
        self.flow_controlled_length = flow_controlled_length
        self.stream_ended = stream_ended


class StreamReset(Event):
    """The stream is over, reset: by the peer (``remote_reset``), or by us for a stream error of the peer's."""

    __slots__ = ("stream_id", "error_code", "remote_reset")

    def __init__(self, stream_id: int, error_code: int, remote_reset: bool = True) -> None:
        self.stream_id = stream_id
        self.error_code = error_code
        self.remote_reset = remote_reset


class WindowUpdated(Event):
    """The peer opened a window (``stream_id`` 0: the connection's): data may be sendable now."""

    __slots__ = ("stream_id", "delta")

    def __init__(self, stream_id: int, delta: int) -> None:
        self.stream_id = stream_id
        self.delta = delta


class RemoteSettingsChanged(Event):
    """The peer's SETTINGS (acknowledged already); ``changed``: code -> new value."""

    __slots__ = ("changed",)

    def __init__(self, changed: dict[int, int]) -> None:
        self.changed = changed


class PingAckReceived(Event):
    __slots__ = ("ping_data",)

    def __init__(self, ping_data: bytes) -> None:
        self.ping_data = ping_data


class GoAway(Event):
    """The peer sent GOAWAY: streams above ``last_stream_id`` were not (and will not be) processed."""

    __slots__ = ("last_stream_id", "error_code", "debug")

    def __init__(self, last_stream_id: int, error_code: int, debug: bytes = b"") -> None:
        self.last_stream_id = last_stream_id
        self.error_code = error_code
        self.debug = debug
