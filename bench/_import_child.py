"""The fresh interpreter of ``bench/proxy_memory.py``: imports steps, prints what they cost (one dict a line).

Kept apart, with nothing imported at the top, so the interpreter's own
baseline is Python's alone. ``argv[1]``: a Python literal ``(mode, steps,
base)``; mode ``rss`` (VmRSS after each step, then RSS per mapping and the
packages loaded) or ``trace`` (tracemalloc's traced Python allocations after
each step).

Once a step (or the base) has imported ``tether.proxy.protobuf_runtime`` it defers protobuf's pure-Python message
implementation, as the serving process does (``tether.proxy.main``): the figures after it are the proxy's.
"""

DEFERRER = "tether.proxy.protobuf_runtime"


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _smaps() -> dict:
    """RSS per mapping: each mapped file by its name, anonymous memory as ``[anonymous]``/``[heap]``."""
    out: dict = {}
    name = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header line
                path = fields[5] if len(fields) >= 6 else ""
                name = path.rsplit("/", 1)[-1] if path.startswith("/") else (path or "[anonymous]")
            elif fields and fields[0] == "Rss:":
                out[name] = out.get(name, 0) + int(fields[1]) * 1024
    return out


def main() -> None:
    import ast
    import gc
    import importlib
    import sys

    mode, steps, base = ast.literal_eval(sys.argv[1])
    if mode == "trace":
        import tracemalloc

        tracemalloc.start()
        size = lambda: tracemalloc.get_traced_memory()[0]  # noqa: E731
    else:
        size = _rss
    gc.collect()
    print({"step": "python", "size": size()}, flush=True)
    for module in base:
        importlib.import_module(module)
    if DEFERRER in sys.modules:
        sys.modules[DEFERRER].defer_python_message()
    if base:
        gc.collect()
        print({"step": "base", "size": size()}, flush=True)
    for label, modules in steps:
        try:
            for module in modules:
                importlib.import_module(module)
                if module == DEFERRER:
                    sys.modules[DEFERRER].defer_python_message()
        except ImportError as e:
            print({"step": label, "error": str(e)}, flush=True)
            continue
        gc.collect()
        print({"step": label, "size": size()}, flush=True)
    if mode == "rss":
        packages: dict = {}
        for module in list(sys.modules):
            top = "google.protobuf" if module.startswith("google.protobuf") else module.split(".")[0]
            packages[top] = packages.get(top, 0) + 1
        print({"smaps": _smaps(), "packages": packages, "modules": sorted(sys.modules)}, flush=True)


if __name__ == "__main__":
    main()
