"""The ``context_token`` a proxy sends with every lookup: who is asking (namespace, node, pod).

Read by the destination (``Get``, ``GetProfile``) and the policy controller (``OutboundPolicies``).  Proxies
set it from ``LINKERD2_PROXY_DESTINATION_CONTEXT``: JSON
``{"ns": ..., "nodeName": ..., "pod": ...}``, or the legacy form ``ns:<namespace>``.
Anything else is ignored (an empty context), as Linkerd does. Pure.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_TOKEN = 4096  # a proxy's token is a few dozen bytes; refuse to parse novels


@dataclass(frozen=True, slots=True)
class ContextToken:
    ns: str = ""
    node_name: str = ""
    pod: str = ""


def parse_context_token(token: str) -> ContextToken:
    """Parse a context token; an empty or unreadable token gives an empty context."""
    text = token.strip()
    if not text or len(text) > MAX_TOKEN:
        return ContextToken()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            log.debug("ignoring a context token that is not JSON: %.80r", text)
            return ContextToken()
        if not isinstance(doc, dict):
            return ContextToken()
        return ContextToken(
            ns=_string(doc.get("ns")), node_name=_string(doc.get("nodeName")), pod=_string(doc.get("pod"))
        )
    if text.startswith("ns:"):
        log.debug("legacy context token %.80r", text)
        return ContextToken(ns=text[3:].strip())
    return ContextToken()


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""
