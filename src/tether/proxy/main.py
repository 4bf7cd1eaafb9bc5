"""The proxy's process entry: configuration from the environment, logging, uvloop, ``app.serve``.

``main(env)`` is called by ``python -m tether.proxy`` and by ``tether proxy``
(``tether.cli.proxy_cmd``) with ``os.environ``; it is the only place that
turns the environment into a ``ProxyConfig``. A bad variable prints
``tether proxy: <message naming the variable>`` and exits 64, as linkerd2-proxy.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Mapping

from tether.proxy.core.config import EX_CONFIG, ConfigError, LogFormat, ProxyConfig
from tether.proxy.core.logs import LogFilter


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"timestamp": self.formatTime(record), "level": record.levelname, "target": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


# The cyclic garbage collector's thresholds while the proxy serves (Python's defaults: 700, 10, 10). A full
# collection walks every object not frozen and stalls the loop meanwhile: at 1,000 req/s a proxy with the
# defaults ran about one a second, and they were most of the tail (p99 65-170 ms; 24-30 ms with full
# collections a hundred times rarer; 9-54 ms with the collector off: docs/benchmarks.md, 2026-12-02). The
# young generations stay as they are (their passes are short and free what dies young); full collections come
# a hundred times rarer. That is safe because a closed connection leaves no cycle
# (tests/proxy/test_http1_garbage.py): with the cycles the client proxy of `./run bench mesh -- --quick` freed
# ~300,000 objects by collection per run and its RSS grew ~2.5 MB per 6,000 short connections under these
# thresholds; without them, ~2,500, and no growth.
GC_THRESHOLDS = (700, 10, 1000)


def _collect_rarely() -> None:
    """The proxy serves: what start-up made (identity, TLS contexts, discovery and policy state, listeners)
    joins the imports out of the collector's sight, and full collections become rare (``GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(env: Mapping[str, str]) -> int:
    """Run the proxy until it is stopped; returns the exit status."""
    try:
        config = ProxyConfig.from_env(env)
        log_filter = LogFilter(config.log_filter)
    except ConfigError as exc:
        print(f"tether proxy: {exc}", file=sys.stderr)
        return EX_CONFIG
    except ValueError as exc:
        print(f"tether proxy: invalid LINKERD2_PROXY_LOG: {exc}", file=sys.stderr)
        return EX_CONFIG
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format is LogFormat.JSON:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    for target in log_filter.unmatched:
        logging.getLogger(__name__).warning("LINKERD2_PROXY_LOG: target %r names no logger of this proxy", target)
    for unapplied in config.unapplied:
        logging.getLogger(__name__).warning("%s", unapplied)

    import uvloop

    from tether.proxy.protobuf_runtime import defer_python_message

    defer_python_message()  # before the first protobuf import (the proxy's messages come with app)
    from tether.proxy.app import serve

    # Everything imported so far lives as long as the process: out of the collector's sight, a full collection
    # no longer walks it (~12 ms when grpc and cryptography were loaded too, ~37k objects; protobuf and the
    # proxy's own modules are most of it now), a stall for every request in flight at that moment.
    gc.collect()
    gc.freeze()

    try:
        uvloop.run(serve(config, env, log_filter, on_serving=_collect_rarely))
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a listener could not be bound
        print(f"tether proxy: {exc}", file=sys.stderr)
        return 1
    return 0
