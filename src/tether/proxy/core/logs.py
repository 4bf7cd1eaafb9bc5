"""``LINKERD2_PROXY_LOG`` filters (tracing's EnvFilter syntax, the subset that maps onto ``logging``).

A filter is comma-separated directives: a bare level (``warn``) sets the default,
``target=level`` sets one target. Levels: ``trace``, ``debug``, ``info``,
``warn``, ``error``, ``off`` (case-insensitive). Targets are logger names.
Linkerd's targets name Rust crates and their modules (``linkerd=info``,
``linkerd2_proxy::inbound=debug``, ``linkerd_app_outbound=trace``); this proxy's
loggers are not cut along those crates, so every ``linkerd*`` target means the
proxy's own loggers, ``tether.proxy``, as a whole. A target that is neither a
``tether`` logger nor a Linkerd one is kept (it may name a library's logger,
``h2`` say) and reported by ``unmatched`` so the caller can warn by name,
except ``hickory``: Linkerd's DNS resolver, named in the injector's default
filter of every pod, has no counterpart here (this proxy resolves no names on
its own), so its directive holds trivially. Span filters (``[...]``) are rejected, except the two
Linkerd's injector appends by default, ``[{headers}]=off`` and
``[{request}]=off``: they keep HTTP headers and requests out of the log, and
this proxy never logs either at any level, so they hold as written.

Callers: ``tether.proxy.app`` (at start) and ``tether.proxy.io.admin`` (``/proxy-log-level``).
"""

from __future__ import annotations

import logging
import re

TRACE = 5
_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}
_PROXY = "tether.proxy"
# Logger roots that exist in this process: the proxy's and the HTTP/2 codec's.
_KNOWN_ROOTS = frozenset({"tether", "h2", "hpack", "hickory"})
# What Linkerd's injector adds unless `config.linkerd.io/proxy-log-http-headers: insecure`.
_HEADER_SPANS_OFF = frozenset({"[{headers}]=off", "[{request}]=off"})
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)*")


def parse(text: str) -> list[tuple[str, int]]:
    """``[(logger name, level)]``, ``""`` for the default; raises ``ValueError`` naming the bad directive."""
    directives: list[tuple[str, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item or item.replace(" ", "") in _HEADER_SPANS_OFF:
            continue
        target, sep, level_s = item.rpartition("=")
        if not sep:
            target, level_s = "", item
        level = _LEVELS.get(level_s.strip().lower())
        if level is None:
            raise ValueError(f"invalid log level {level_s!r} in {item!r}")
        target = target.strip()
        if target and not _TARGET.fullmatch(target):
            raise ValueError(f"invalid log target {target!r} in {item!r}")
        name = target.replace("::", ".")
        if name.partition(".")[0].startswith("linkerd"):
            name = _PROXY
        directives.append((name, level))
    return directives


def unmatched(directives: list[tuple[str, int]]) -> list[str]:
    """The targets of ``directives`` that name no logger root of this process (to be warned about by name)."""
    return [name for name, _ in directives if name and name.partition(".")[0] not in _KNOWN_ROOTS]


class LogFilter:
    """The filter in force; ``set`` applies a new one to the loggers (the previous targets reset first).

    With ``apply=False`` (a proxy embedded in another program, e.g. a test) the
    filter is only checked and remembered, and the host's logging is left alone.
    """

    def __init__(self, text: str, *, apply: bool = True) -> None:
        self.text = ""
        self.unmatched: list[str] = []
        self._apply = apply
        self._touched: list[str] = []
        self.set(text)

    def set(self, text: str) -> None:
        directives = parse(text)  # raises before anything changes
        self.unmatched = unmatched(directives)
        if not self._apply:
            self.text = text
            return
        for name in self._touched:
            logging.getLogger(name).setLevel(logging.NOTSET)
        default = logging.WARNING
        touched = []
        for name, level in directives:
            if name:
                logging.getLogger(name).setLevel(level)
                touched.append(name)
            else:
                default = level
        logging.getLogger().setLevel(default)
        self._touched = touched
        self.text = text
