"""ServiceProfiles by (namespace, name): the profile now in force for each watched name, or None.

``GetProfile`` subscribes once per candidate name (the client's namespace and
the service's); a new listener hears the current value at once, then every
change (a deletion is ``None``).
"""

from __future__ import annotations

from tether.destination.metrics import DestinationMetrics
from tether.destination.watcher.cluster import Change, ClusterIndex, Key
from tether.destination.watcher.facts import ProfileFacts
from tether.destination.watcher.listeners import ProfileListener


class ProfileWatcher:
    def __init__(self, index: ClusterIndex, metrics: DestinationMetrics) -> None:
        self._index = index
        self._metrics = metrics
        self._listeners: dict[Key, list[ProfileListener]] = {}
        index.observe(self._on_change)

    def subscribe(self, namespace: str, name: str, listener: ProfileListener) -> None:
        key = (namespace, name)
        listeners = self._listeners.setdefault(key, [])
        listeners.append(listener)
        self._metrics.profile_subscribers.labels(namespace, name).set(len(listeners))
        listener.update(self._index.profiles.get(key), None)

    def unsubscribe(self, namespace: str, name: str, listener: ProfileListener) -> None:
        key = (namespace, name)
        listeners = self._listeners.get(key)
        if listeners is None or listener not in listeners:
            return
        listeners.remove(listener)
        if listeners:
            self._metrics.profile_subscribers.labels(namespace, name).set(len(listeners))
        else:
            del self._listeners[key]
            self._metrics.profile_subscribers.remove(namespace, name)

    def _on_change(self, change: Change) -> None:
        if change.kind != "profile":
            return
        listeners = self._listeners.get(change.key)
        if not listeners:
            return
        assert change.new is None or isinstance(change.new, ProfileFacts)
        self._metrics.profile_updates.labels(*change.key).inc()
        for listener in tuple(listeners):
            listener.update(change.new, change.at)
