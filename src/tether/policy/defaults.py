"""The six default inbound policies and the authorizations each one grants (Linkerd's ``defaults.rs``).

Used by the inbound index for ports no Server selects (chosen by the pod's
``config.linkerd.io/default-inbound-policy``, else its namespace's, else the
cluster's ``--default-policy``) and for a Server's ``accessPolicy``.  Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.policy.model import ALL_NETWORKS, AuthnKind, ClientAuthz, IdentityMatch, Ref
from tether.resources.policy import DEFAULT_POLICIES, Network

ANY_IDENTITY = (IdentityMatch(suffix=()),)


class UnknownPolicy(ValueError):
    """Not one of the six default policy names."""


@dataclass(frozen=True, slots=True)
class DefaultPolicy:
    """``allow`` with two switches, ``deny``, or ``audit`` (allow all, but the proxy reports it)."""

    name: str

    @classmethod
    def parse(cls, text: str) -> DefaultPolicy:
        if text not in DEFAULT_POLICIES:
            raise UnknownPolicy(f"{text!r} is not a default policy (one of: {', '.join(DEFAULT_POLICIES)})")
        return cls(text)

    @property
    def allows(self) -> bool:
        return self.name not in ("deny", "audit")

    def authenticated(self) -> DefaultPolicy:
        """The policy for a port listed in ``proxy-require-identity-inbound-ports``: allow becomes authenticated."""
        if self.name == "all-unauthenticated":
            return DefaultPolicy("all-authenticated")
        if self.name == "cluster-unauthenticated":
            return DefaultPolicy("cluster-authenticated")
        return self

    def authorizations(self, cluster_networks: tuple[Network, ...]) -> tuple[ClientAuthz, ...]:
        if self.name == "deny":
            return ()
        ref = Ref.default(self.name)
        if self.name == "audit":
            return (ClientAuthz(ref, AuthnKind.UNAUTHENTICATED),)
        networks = cluster_networks if self.name.startswith("cluster-") else ALL_NETWORKS
        if self.name.endswith("-authenticated"):
            return (ClientAuthz(ref, AuthnKind.TLS_AUTHENTICATED, ANY_IDENTITY, networks),)
        return (ClientAuthz(ref, AuthnKind.UNAUTHENTICATED, (), networks),)
