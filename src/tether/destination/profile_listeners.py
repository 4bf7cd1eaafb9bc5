"""The listener decorators between the watchers and a ``ProfileTranslator``, one job each.

``GetProfile`` for a service builds, back to front::

    ProfileWatcher(client ns) -> Fallback.primary \\
                                                   > Fallback -> OpaquePortsAdaptor -> ProfileTranslator
    ProfileWatcher(svc ns)    -> Fallback.backup  /              ^
    OpaquePortsWatcher(service) ---------------------------------'

``FallbackProfileListener`` picks the client-namespace profile when there is
one, else the service-namespace one, and says nothing until both have
reported once.  ``OpaquePortsAdaptor`` joins the chosen profile with whether
the requested port is opaque and whether the Service defines it, and says
nothing until it has both.
"""

from __future__ import annotations

from typing import Protocol

from tether.destination.watcher.facts import ProfileFacts
from tether.destination.watcher.listeners import ServicePorts

_UNSET = object()


class ProfileSink(Protocol):
    def update(self, profile: ProfileFacts | None, opaque: bool, undefined_port: bool, at: float | None) -> None:
        """``undefined_port``: the Service exists and does not define the requested port."""


class OpaquePortsAdaptor:
    """A ``ProfileListener`` and an ``OpaquePortsListener`` in one: forwards (profile, port is opaque, port is
    one the Service does not define)."""

    __slots__ = ("_sink", "_port", "_profile", "_ports")

    def __init__(self, sink: ProfileSink, port: int) -> None:
        self._sink = sink
        self._port = port
        self._profile: object = _UNSET
        self._ports: ServicePorts | None = None

    def update(self, profile: ProfileFacts | None, at: float | None) -> None:
        self._profile = profile
        self._forward(at)

    def update_ports(self, ports: ServicePorts, at: float | None) -> None:
        self._ports = ports
        self._forward(at)

    def _forward(self, at: float | None) -> None:
        if self._profile is _UNSET or self._ports is None:
            return
        assert self._profile is None or isinstance(self._profile, ProfileFacts)
        defined = self._ports.defined
        self._sink.update(self._profile, self._port in self._ports.opaque,
                          defined is not None and self._port not in defined, at)


class _Slot:
    __slots__ = ("_owner", "value")

    def __init__(self, owner: "FallbackProfileListener") -> None:
        self._owner = owner
        self.value: object = _UNSET

    def update(self, profile: ProfileFacts | None, at: float | None) -> None:
        self.value = profile
        self._owner.changed(at)


class FallbackProfileListener:
    """Primary (client namespace) wins when it exists; else the backup (service namespace)."""

    __slots__ = ("_listener", "primary", "backup")

    def __init__(self, listener: OpaquePortsAdaptor) -> None:
        self._listener = listener
        self.primary = _Slot(self)
        self.backup = _Slot(self)

    def changed(self, at: float | None) -> None:
        if self.primary.value is _UNSET or self.backup.value is _UNSET:
            return
        chosen = self.primary.value if self.primary.value is not None else self.backup.value
        assert chosen is None or isinstance(chosen, ProfileFacts)
        self._listener.update(chosen, at)
