"""Compile the proxy's hot modules with mypyc into <venv>/tether-native (see tether.proxy.native).

Run by ``./run`` (dev/setup.sh) after the install; does nothing when the build already matches the sources,
when TETHER_PURE_PYTHON is set, or when there is no C compiler (the proxy then runs interpreted, and this says
so). Usage: ``.venv/bin/python dev/build_native.py [--force]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the build matches the sources")
    args = parser.parse_args()
    os.environ.setdefault("TETHER_PURE_PYTHON", "")
    if os.environ["TETHER_PURE_PYTHON"] not in ("", "0"):
        print("build_native: TETHER_PURE_PYTHON is set: nothing compiled", file=sys.stderr)
        return 0
    # Import the list and the fingerprint without the finder: the build must read the sources themselves.
    os.environ["TETHER_PURE_PYTHON"] = "1"
    from tether.proxy import native

    directory = native.native_dir()
    want = native.fingerprint()
    try:
        if json.loads((directory / native.MANIFEST).read_text()).get("fingerprint") == want and not args.force:
            return 0
    except (OSError, ValueError):
        pass
    blocker = native.build_blocker()
    if blocker is not None:
        print(f"build_native: {blocker}: the proxy runs interpreted", file=sys.stderr)
        return 0
    started = time.monotonic()
    print(f"build_native: compiling {len(native.COMPILED)} proxy modules with mypyc (about 2 minutes on 2 cores)...",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tether-native-") as tmp:
        files = _compile([str(path.relative_to(ROOT)) for path in native.source_paths()], Path(tmp))
        staging = directory.with_name(directory.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name, built in files.items():
            target = staging / (name + sysconfig.get_config_var("EXT_SUFFIX"))  # flat: the loader goes by name
            shutil.copy2(built, target)
            files[name] = target
        manifest = {"fingerprint": want, "files": {name: path.name for name, path in files.items()}}
        (staging / native.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
    print(f"build_native: done in {time.monotonic() - started:.0f} s ({directory})", file=sys.stderr)
    return 0


def _compile(sources: list[str], tmp: Path) -> dict[str, Path]:
    """mypyc over ``sources`` (paths from the repository's root), with the project's mypy configuration; returns
    module name -> extension."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    cwd = os.getcwd()
    os.chdir(ROOT)  # mypy reads pyproject.toml's [tool.mypy] from here, as `./run test` type-checks
    try:
        extensions = mypycify(sources, opt_level="3", multi_file=True, target_dir=str(tmp / "c"))
        dist = Distribution({"name": "tether-native", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.build_lib = str(tmp / "lib")  # type: ignore[attr-defined]
        command.build_temp = str(tmp / "obj")  # type: ignore[attr-defined]
        command.parallel = os.cpu_count() or 1  # type: ignore[attr-defined]
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built: dict[str, Path] = {}
    for extension in extensions:
        path = tmp / "lib" / (extension.name.replace(".", "/") + suffix)
        built[extension.name] = path
    return built


if __name__ == "__main__":
    sys.exit(main())
