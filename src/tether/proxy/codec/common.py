"""Vocabulary shared by the sans-IO protocol modules: ``NEED_DATA`` and the error split.

Callers: every module in ``tether.proxy.codec``, and the proxy's I/O layers,
which catch ``RemoteProtocolError`` to drop a misbehaving peer and treat
``LocalProtocolError`` as a bug in Tether.
"""

from __future__ import annotations

import enum


class NeedData(enum.Enum):
    """The parser has no answer yet: feed it more bytes (or ``b""`` for EOF)."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return self.value


NEED_DATA = NeedData.NEED_DATA


class ProtocolError(Exception):
    """Bytes or calls that break a protocol; see the two subclasses for whose fault."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes the protocol does not allow: drop the connection."""


class LocalProtocolError(ProtocolError):
    """We asked for something the protocol forbids (or misused a parser): a bug on our side."""
