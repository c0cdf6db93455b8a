"""The house's size rule: no source module over 600 lines, no function over 100 lines.

A module that grows past 600 lines holds more than one concept, and a function past 100 lines
more than one step; both are split along their seams rather than let grow. The sources are the
folders of ARCHITECTURE.md's layer table (tests and benchmarks are not held to it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layers import REPO, layers

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


def sources() -> list[Path]:
    folders = {layer.folder for layer in layers()}
    return sorted({p for folder in folders for p in folder.rglob("*.py")})


def long_functions(path: Path, root: Path = REPO, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function or method longer than ``limit`` lines,
    from its ``def`` (decorators excluded) to its last line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_module_is_over_600_lines() -> None:
    long = [
        f"{p.relative_to(REPO)} ({n} lines)"
        for p in sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


@pytest.mark.slow
def test_no_function_is_over_100_lines() -> None:
    long = [f for p in sources() for f in long_functions(p)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_rule_can_fail(tmp_path: Path) -> None:
    def function(lines: int) -> str:
        return "def f():\n" + "\n".join(f"    x{i} = {i}" for i in range(lines - 1)) + "\n"

    (tmp_path / "over.py").write_text(function(MAX_FUNCTION_LINES + 1))
    method = "".join(f"    {line}\n" for line in function(MAX_FUNCTION_LINES).splitlines())
    (tmp_path / "fits.py").write_text("class C:\n" + method)
    assert long_functions(tmp_path / "over.py", tmp_path) == [f"over.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(tmp_path / "fits.py", tmp_path) == []
