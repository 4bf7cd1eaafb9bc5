"""The proxy's hot modules compiled with mypyc (tether.proxy.native, dev/build_native.py).

What runs in production is what these tests run: `./run` builds the extensions before the suite, so every
other test of the proxy exercises the compiled modules. These check the switch itself: that the build is used
when it matches the sources, never when it does not, that TETHER_PURE_PYTHON runs the sources, and that the
interpreted code passes the codec's and the cores' own tests too (the fallback without a C compiler).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tether.proxy import native

ROOT = Path(__file__).resolve().parents[2]


def _module_file(module: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", f"import {module} as m, tether.proxy.native as n; "
                          "print(m.__file__); print(n.status)"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout


@pytest.mark.skipif(native.build_blocker() is not None, reason=f"{native.build_blocker()}: the proxy runs interpreted")
def test_the_suite_runs_the_compiled_modules() -> None:
    # ./run built them before the tests: if the build broke silently, everything else here tested the sources.
    assert native.status.startswith("compiled:"), native.status
    import tether.proxy.codec.http2 as http2
    import tether.proxy.core.http1_proxy as http1_proxy

    assert http2.__file__ is not None and http2.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    assert http1_proxy.__file__ is not None and str(native.native_dir()) in http1_proxy.__file__


def test_pure_python_runs_the_sources() -> None:
    out = _module_file("tether.proxy.codec.http2", TETHER_PURE_PYTHON="1")
    assert out.splitlines() == [str(ROOT / "src/tether/proxy/codec/http2.py"),
                                "interpreted: TETHER_PURE_PYTHON is set"]


def _fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fingerprint: str) -> Path:
    directory = tmp_path / "tether-native"
    directory.mkdir()
    (directory / "x.so").write_bytes(b"")
    (directory / native.MANIFEST).write_text(json.dumps({"fingerprint": fingerprint,
                                                         "files": {"tether.proxy.codec.nothing": "x.so"}}))
    monkeypatch.setattr(native, "native_dir", lambda: directory)
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    return directory


def test_a_build_of_other_sources_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer edited a module after the build: running the old extension would test code that is not there.
    _fake_build(tmp_path, monkeypatch, "0" * 64)
    before = list(sys.meta_path)
    assert native._decide() == "interpreted: the sources changed since the build (./run rebuilds)"
    assert sys.meta_path == before


def test_a_build_of_these_sources_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _fake_build(tmp_path, monkeypatch, native.fingerprint())
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder goes away with the test
    assert native._decide() == f"compiled: {len(native.COMPILED)} modules from {directory}"
    finder = sys.meta_path[0]
    spec = finder.find_spec("tether.proxy.codec.nothing")  # type: ignore[call-arg]
    assert spec is not None and spec.origin == str(directory / "x.so")
    assert finder.find_spec("tether.proxy.codec.http2") is None  # type: ignore[call-arg]  # not in this build


def test_no_build_and_a_broken_build_run_interpreted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "native_dir", lambda: tmp_path / "absent")
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    assert native._decide().startswith("interpreted: not built")
    directory = _fake_build(tmp_path, monkeypatch, native.fingerprint())
    (directory / "x.so").unlink()
    assert native._decide() == f"interpreted: {directory} is incomplete"


def test_every_compiled_module_exists_and_is_type_checked() -> None:
    # mypyc compiles what mypy checks, under the project's configuration: a module outside it would build with
    # looser types than the rest (and fail at run time where mypy would have said so).
    for relative in native.COMPILED:
        assert (ROOT / "src/tether/proxy" / relative).is_file(), relative
        assert relative.startswith(("codec/", "core/")), relative


def test_the_interpreted_codec_and_cores_pass_their_own_tests() -> None:
    # The fallback where no C compiler is: the same sources, interpreted, through the sans-IO tests.
    tests = ["tests/proxy/test_http1_codec.py", "tests/proxy/test_http2_codec.py",
             "tests/proxy/test_http2_playbook.py", "tests/proxy/test_http1_proxy.py",
             "tests/proxy/test_http2_profiles.py",  # (its ack-counting tests run only interpreted)
             "tests/proxy/test_hot_constructors.py"]  # (the written-out __init__s' signatures: interpreted only)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, env={**os.environ, native.PURE_ENV: "1"}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
