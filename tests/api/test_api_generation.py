"""The generated tether.api package: complete, importable together, current and reproducible."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import re
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pool

import tether.api
from tether.api import destination_pb2

REPO = Path(__file__).resolve().parents[2]
API_DIR = Path(tether.api.__file__).parent
MESSAGE_FILES = [
    "destination", "identity", "inbound", "outbound", "tap", "net", "meta",
    "http_types", "http_route", "grpc_route", "opaque_route", "tls_route", "transport", "viz_tap", "workload",
]
SERVICE_FILES = ["destination", "identity", "inbound", "outbound", "tap", "viz_tap", "workload"]
GENERATED = sorted(
    [f"{n}_pb2.py" for n in MESSAGE_FILES]
    + [f"{n}_pb2.pyi" for n in MESSAGE_FILES]
    + [f"{n}_pb2_grpc.py" for n in SERVICE_FILES]
)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proto_generate", REPO / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generated_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if re.search(r"_pb2(_grpc)?\.pyi?$", p.name))


def test_exactly_the_expected_modules_are_generated() -> None:
    assert _generated_in(API_DIR) == GENERATED


def test_every_generated_module_imports_together() -> None:
    modules = [f"{n}_pb2" for n in MESSAGE_FILES] + [f"{n}_pb2_grpc" for n in SERVICE_FILES]
    for name in modules:
        importlib.import_module(f"tether.api.{name}")
    pool = descriptor_pool.Default()
    for name in MESSAGE_FILES:
        assert pool.FindFileByName(f"{name}.proto").name == f"{name}.proto"


def test_generated_imports_are_package_relative() -> None:
    for name in GENERATED:
        source = (API_DIR / name).read_text()
        assert not re.search(r"^import \w+_pb2", source, re.MULTILINE), name


def test_messages_know_their_real_module() -> None:
    update = destination_pb2.Update(no_endpoints=destination_pb2.NoEndpoints(exists=True))
    assert type(update).__module__ == "tether.api.destination_pb2"
    assert pickle.loads(pickle.dumps(update)) == update


def test_generation_is_reproducible_and_the_package_is_current(tmp_path: Path) -> None:
    generate = _generator().generate
    written = generate(tmp_path)
    assert sorted(p.name for p in written) == GENERATED
    assert generate(tmp_path) == [], "a second run must change nothing"
    for name in GENERATED:
        assert (tmp_path / name).read_bytes() == (API_DIR / name).read_bytes(), (
            f"{name} is stale: run `python proto/generate.py` (or reinstall)"
        )


def test_generation_removes_stale_stubs_only(tmp_path: Path) -> None:
    (tmp_path / "gone_pb2.py").write_text("")
    (tmp_path / "gone_pb2_grpc.py").write_text("")
    (tmp_path / "helpers.py").write_text("")
    changed = _generator().generate(tmp_path)
    assert {tmp_path / "gone_pb2.py", tmp_path / "gone_pb2_grpc.py"} <= set(changed)
    assert _generated_in(tmp_path) == GENERATED
    assert (tmp_path / "helpers.py").exists()


def test_relativising_refuses_output_it_does_not_understand() -> None:
    generator = _generator()
    with pytest.raises(generator.GenerationError, match="absolute"):
        generator._relativise("x_pb2_grpc.py", "import other_pb2 as other__pb2\n", {"x"})
    with pytest.raises(generator.GenerationError, match="module-name"):
        generator._relativise("x_pb2.py", "import x_pb2 as x__pb2\n", {"x"})
