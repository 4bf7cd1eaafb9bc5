"""An inbound index filled once from a platform's listing: the controller's rules, for a one-off question.

``tether authz`` asks which authorizations apply to a workload without a
running controller; it lists each watched type through the platform's
``ResourceWatcher`` until ``SYNCED`` and answers from the same ``InboundIndex``
the controller serves from, so the CLI and the proxies can never disagree.
"""

from __future__ import annotations

from contextlib import aclosing

from tether.platform.watch import ResourceWatcher
from tether.policy.config import PolicyConfig
from tether.policy.inbound.index import WATCHED, InboundIndex


async def snapshot_index(watcher: ResourceWatcher, config: PolicyConfig) -> InboundIndex:
    index = InboundIndex(config)
    for type_key in WATCHED:
        async with aclosing(watcher.watch(type_key)) as events:
            async for event in events:
                index.apply(type_key, event)
                if event.type == "SYNCED":
                    break
    index.flush()
    return index
