"""What discovery says about a target, and the small interfaces the pure layers see discovery through.

``Resolution`` is the answer the outbound layer and the routers act on. The
watches that produce it live in ``io.discovery`` (gRPC streams, asyncio); the
layers and routers only need what the ``Protocol``s below name, so tests hand
them plain objects (no ``type: ignore``) and ``core`` never imports ``io``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tether.proxy.core.balancer import Balancer
from tether.proxy.core.endpoint import Endpoint

if TYPE_CHECKING:
    from tether.proxy.core.client_policy import ClientPolicy
    from tether.proxy.core.profiles import Profile


class ProfileSource(Protocol):
    """A profile watch (``io.discovery.ProfileWatch``): its latest answer, and a lease to give back.

    Waited on with ``commands.Wait`` (its ``wait`` answers a ``Resolution`` or ``commands.Failed``).
    """

    resolution: Resolution

    @property
    def ready(self) -> bool:
        """Whether discovery has answered (so ``resolution`` is its answer, not the default)."""
        ...

    def release(self) -> None: ...

    async def wait(self, timeout: float) -> Any: ...


class PolicySource(Protocol):
    """A client policy watch (``io.discovery.PolicyWatch``): the target's latest ``OutboundPolicy``
    (None: the controller has none for it, or has not answered). Waited on with ``commands.Wait``."""

    @property
    def policy(self) -> ClientPolicy | None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def failed(self) -> Any:
        """``commands.Failed`` when the controller refused the lookup for good (the connection fails), else
        None."""
        ...

    def release(self) -> None: ...

    async def wait(self, timeout: float) -> Any: ...


class DiscoverySource(Protocol):
    """Discovery as the outbound layer uses it (``io.discovery.Discovery``): a lease on a target's profile."""

    def profile(self, addr: Any) -> ProfileSource: ...


@dataclass(frozen=True, slots=True)
class Resolution:
    """What discovery says about an original destination.

    Exactly one of: ``balancer`` (a service: pick an endpoint per connection),
    ``endpoint`` (the profile names one endpoint), or neither (forward to the
    original destination as it is). ``opaque``: skip protocol detection.
    ``profile``: the service's profile routes and traffic split (None when it
    has neither). ``watch``: the profile watch this came from, whose
    ``resolution`` is the latest (None for answers that cannot change).
    ``policy``: the target's client policy watch, when the proxy asks the
    policy controller (set by ``core.outbound``, not by the profile watch).
    """

    opaque: bool = False
    balancer: Balancer | None = None
    endpoint: Endpoint | None = None
    authority: str = ""  # the service's name:port, for metrics
    profile: Profile | None = None
    watch: ProfileSource | None = field(default=None, compare=False, repr=False)
    policy: PolicySource | None = field(default=None, compare=False, repr=False)  # the client policy watch


FORWARD = Resolution()


class NotLookedUp:
    """The profile source of a name discovery is never asked about (outside
    ``LINKERD2_PROXY_DESTINATION_PROFILE_SUFFIXES``): answered at once, with no service behind it."""

    resolution = FORWARD
    ready = True

    def release(self) -> None:
        pass

    async def wait(self, timeout: float) -> Any:
        return self.resolution


NOT_LOOKED_UP = NotLookedUp()
