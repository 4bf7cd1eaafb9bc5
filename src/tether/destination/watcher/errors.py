"""What a subscription can fail with; ``tether.destination.server`` maps each to a gRPC status."""

from __future__ import annotations


class SubscribeError(Exception):
    """A lookup that cannot be subscribed to."""


class ServiceNotFound(SubscribeError):
    """No such Service (gRPC NOT_FOUND)."""


class InvalidService(SubscribeError):
    """The Service exists but has no endpoints to discover, e.g. ExternalName (gRPC INVALID_ARGUMENT)."""


class ConflictingAddress(SubscribeError):
    """Several objects claim the same IP (gRPC FAILED_PRECONDITION)."""
