"""Compile proto/*.proto into the tether.api package (protobuf, gRPC and .pyi stubs).

Called by setup.py's build_py step, so `pip install -e .` and wheel builds
regenerate the stubs; also runnable by hand: `python proto/generate.py [OUT_DIR]`.

protoc writes top-level modules that import each other by absolute name
(`import net_pb2`); we rewrite those imports to package-relative form so the
modules work inside tether.api. Output is deterministic, and a file is only
rewritten when its bytes change, so repeated builds leave mtimes alone.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = PROTO_DIR.parent / "src" / "tether" / "api"

# Every file name protoc produces for Python ends in one of these.
_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
_SERVICE = re.compile(r"^\s*service\s+\w+", re.MULTILINE)


class GenerationError(RuntimeError):
    """protoc failed, or its output no longer has the shape we rewrite."""


def generate(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Regenerate the stubs in out_dir; return the paths whose contents changed.

    Stale generated files (from a removed .proto) are deleted and counted as changed.
    """
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise GenerationError(f"no .proto files in {PROTO_DIR}")
    stems = {p.stem for p in protos}
    # Files without a service would only get an empty version-check module.
    with_services = [p for p in protos if _SERVICE.search(p.read_text(encoding="utf-8"))]

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp)
        _protoc(["--python_out", str(raw), "--pyi_out", str(raw)], protos)
        _protoc(["--grpc_python_out", str(raw)], with_services)
        wanted = {p.name: _relativise(p.name, p.read_text(encoding="utf-8"), stems) for p in raw.iterdir()}

    out_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    for name in sorted(wanted):
        target = out_dir / name
        data = wanted[name].encode("utf-8")
        if not target.exists() or target.read_bytes() != data:
            # Replace atomically: tests or services may be importing from this tree meanwhile.
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            partial.replace(target)
            changed.append(target)
    for stale in sorted(out_dir.iterdir()):
        if stale.name.endswith(_GENERATED_SUFFIXES) and stale.name not in wanted:
            stale.unlink()
            changed.append(stale)
    return changed


def _protoc(options: list[str], protos: list[Path]) -> None:
    # Imported here so that importing this module (setup.py does) needs no grpc_tools.
    from grpc_tools import protoc

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    # protoc names each file relative to its -I directory ("net.proto", as upstream).
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", *options, *(str(p) for p in protos)]
    if protoc.main(args) != 0:
        raise GenerationError(f"protoc failed: {' '.join(args)}")


def _relativise(file_name: str, source: str, stems: set[str]) -> str:
    """Rewrite one generated file's sibling imports (and module name) to package form."""
    sibling = "|".join(sorted(re.escape(s) for s in stems))
    source = re.sub(
        rf"^import ((?:{sibling})_pb2) as (\w+)$", r"from . import \1 as \2", source, flags=re.MULTILINE
    )
    if re.search(r"^import \w+_pb2\b", source, flags=re.MULTILINE):
        raise GenerationError(f"{file_name}: an absolute *_pb2 import is left after rewriting")
    if file_name.endswith("_pb2.py"):
        # protoc hard-codes the top-level module name; classes need the real one
        # in __module__ so that pickling and reprs find them.
        source, count = re.subn(
            r"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'\w+'", r"\1__name__", source
        )
        if count != 1:
            raise GenerationError(f"{file_name}: module-name call not found once but {count} times")
    return source


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        print("usage: python proto/generate.py [OUT_DIR]", file=sys.stderr)
        return 2
    out_dir = Path(argv[1]) if len(argv) == 2 else DEFAULT_OUT_DIR
    changed = generate(out_dir)
    print(f"{len(changed)} file(s) changed in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
