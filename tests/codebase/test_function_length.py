"""Functions that read top to bottom: none in torch2ms is longer than ``MAX_LINES`` (its ``def``
line to its last, docstring and decorators' arguments included), and none in the stage, runner,
bundle, zoo and codegen code longer than ``ORCHESTRATION_LINES``. A longer one is split into named steps;
the failure names each with its length. Modules too: none in torch2ms is longer than
``MODULE_LINES``, the bundle's ``infer.py`` template included."""

from __future__ import annotations

import ast
from pathlib import Path

import torch2ms

MAX_LINES = 80
ORCHESTRATION_LINES = 70
PACKAGES = ("stages", "pipeline", "bundle", "zoo", "codegen")
MODULE_LINES = 500


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` for every function under ``root`` longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def long_modules(root: Path, limit: int) -> list[str]:
    """``path (n lines)`` for every module under ``root`` longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root.parent)} ({n} lines)")
    return out


def test_no_module_over_the_limit():
    found = long_modules(Path(torch2ms.__file__).parent, MODULE_LINES)
    assert not found, f"modules over {MODULE_LINES} lines, split them along their concerns:\n" + "\n".join(found)


def test_the_scan_sees_a_long_module(tmp_path):
    """The module scan is not blind: a 501-line module is named with its length, a 500-line one is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "long.py").write_text("x = 1\n" * 501)
    (pkg / "short.py").write_text("x = 1\n" * 500)
    assert long_modules(pkg, MODULE_LINES) == ["pkg/long.py (501 lines)"]


def test_no_function_over_the_limit():
    found = long_functions(Path(torch2ms.__file__).parent, MAX_LINES)
    assert not found, f"functions over {MAX_LINES} lines, split them into named steps:\n" + "\n".join(found)


def test_no_orchestration_function_over_its_limit():
    package = Path(torch2ms.__file__).parent
    found = [f for p in PACKAGES for f in long_functions(package / p, ORCHESTRATION_LINES)]
    assert not found, f"functions over {ORCHESTRATION_LINES} lines, split them into named steps:\n" + "\n".join(found)


def test_the_scan_sees_a_long_function(tmp_path):
    """The scan is not blind: a generated 80-line function is reported with its length."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n" + "    x = 1\n" * 79 + "\ndef g():\n    return 1\n")
    assert long_functions(pkg, ORCHESTRATION_LINES) == ["pkg/m.py:1 f (80 lines)"]
    assert long_functions(pkg, MAX_LINES) == []
