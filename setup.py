"""Build hook: regenerate tether.api's protobuf and gRPC stubs from proto/ on every build.

pip runs this for `pip install -e .` (dev/setup.sh) and for wheel builds; the
project's metadata lives in pyproject.toml. The generation itself is
proto/generate.py, which can also be run by hand.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_generator() -> ModuleType:
    # proto/ is not a package, so load the script by path.
    spec = importlib.util.spec_from_file_location("tether_proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    """build_py that first writes the stubs into src/tether/api.

    They go into the source tree, not the build directory, because an
    editable install imports straight from src/ (build_py copies nothing then).
    """

    def run(self) -> None:
        _load_generator().generate()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
