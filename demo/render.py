"""Print the demo's manifests, ready for ``tether apply -f -``.

    python demo/render.py [--python PATH] [--demo-dir DIR] [--vote-rate N] | tether apply -f -

On the local platform a container's command runs on the host's filesystem, so
the manifests in ``demo/manifests`` name the interpreter and the directory
holding the ``emojivoto`` package as ``@PYTHON@`` and ``@DEMO_DIR@``; this
fills them in (default: the interpreter running this script and this
checkout's ``demo/``).  ``--vote-rate`` changes the vote bot's requests per
second.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
MANIFESTS = DEMO_DIR / "manifests"


def render(python: str, demo_dir: str, vote_rate: float | None = None) -> str:
    """Every manifest, in file order, as one multi-document YAML stream."""
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        text = path.read_text().replace("@PYTHON@", python).replace("@DEMO_DIR@", demo_dir)
        if vote_rate is not None:
            text = re.sub(r'(name: VOTE_RATE\n\s+value: )"[^"]*"', rf'\g<1>"{vote_rate:g}"', text)
        docs.append(text.strip("\n"))
    return "\n---\n".join(docs) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter with grpcio (default: this one)")
    parser.add_argument("--demo-dir", default=str(DEMO_DIR), help="directory holding the emojivoto package")
    parser.add_argument("--vote-rate", type=float, help="vote bot requests per second")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.python, args.demo_dir, args.vote_rate))


if __name__ == "__main__":
    main()
