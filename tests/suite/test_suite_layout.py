"""The test suite's own layout: any set of test directories given to pytest together collects.

pytest (its default "prepend" import mode) puts every test directory without an ``__init__.py`` on
``sys.path`` and imports its files under their bare names; a directory with an ``__init__.py`` is a package
named for the directory, imported from ``tests/``. Two bare names alike in two directories are one module to
Python, so whichever directory was collected first would win. Each directory's ``conftest.py`` is the
exception pytest manages: it is imported as ``conftest`` and replaced by the next one, so a test that imports
``conftest`` by name gets whichever directory's conftest pytest loaded last.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _test_directories() -> list[Path]:
    return sorted({path.parent for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts})


def _bare_modules() -> dict[str, list[Path]]:
    """Every module pytest imports under its bare name, by that name."""
    names: dict[str, list[Path]] = defaultdict(list)
    for directory in _test_directories():
        if (directory / "__init__.py").exists():
            continue
        for path in directory.glob("*.py"):
            if path.name != "conftest.py":
                names[path.stem].append(path.relative_to(TESTS))
    return names


def test_no_two_bare_test_modules_share_a_name() -> None:
    clashes = {name: paths for name, paths in _bare_modules().items() if len(paths) > 1}
    assert clashes == {}


def test_no_bare_test_module_hides_a_test_directory() -> None:
    # tests/ is on sys.path (its conftest.py is imported from there): `from up.uplab import ...` and
    # `from proxy.proxy_harness import ...` name directories, which a module `up.py` or `proxy.py` would hide.
    directories = {directory.name for directory in _test_directories() if directory.parent == TESTS}
    hiding = {name: paths for name, paths in _bare_modules().items() if name in directories}
    assert hiding == {}


def test_no_test_imports_conftest_by_name() -> None:
    offenders = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "conftest":
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(alias.name == "conftest" for alias in node.names):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert offenders == [], "a directory's fixtures and constants reach its tests as fixtures, not as imports"
