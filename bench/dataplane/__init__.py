"""The data-plane benchmark: direct, Envoy, HAProxy (and Tether) on the same request path, in one run.

Entry point: ``bench/mesh.py`` (``./run bench mesh``). Modules:

- ``variants/``: the paths under test, one small class each, registered in ``VARIANTS``;
- ``backend``: the nginx every path ends at; ``pki``: the proxies' certificates;
- ``openloop``: the open-loop latency generator; ``closedloop``: wrk for maximum throughput;
- ``procs``: starting, pinning and always stopping processes; ``procstat``: /proc readings;
- ``runner``: the run itself; ``report`` and ``plots``: Markdown and PNGs from its results.

See docs/benchmarks.md.
"""
