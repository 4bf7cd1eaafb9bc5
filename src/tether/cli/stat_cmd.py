"""``tether stat``: an alias of ``tether viz stat`` (Linkerd kept ``linkerd stat`` the same way).

Registered on the root group by ``tether.cli.main``.
"""

from __future__ import annotations

from tether.cli.viz import stat

__all__ = ["stat"]
