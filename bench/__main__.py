"""``python -m bench [NAME ...] [-- ARGS]``: run the named benchmarks (all when none are named)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def _names() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.ispkg and not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names, _, rest = (argv[: argv.index("--")], None, argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None, [])
    available = _names()
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    for name in names or available:
        print(f"== bench {name} ==", flush=True)
        importlib.import_module(f"bench.{name}").run(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
