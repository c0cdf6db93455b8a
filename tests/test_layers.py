"""The layering rule of ARCHITECTURE.md, enforced on every import in the package sources.

The rule's one source is the layer table in ARCHITECTURE.md: this test reads it, so the document
and the code cannot drift apart. A module may import its own package and packages of a lower
layer; two packages of one layer are independent of each other. Lazy imports inside functions
and ``TYPE_CHECKING`` imports count like any other: they are dependencies all the same.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`(hilrec(?:\.[a-z_]+)+)`\s*\|\s*`([a-z_/]+)/`\s*\|")


@dataclass(frozen=True)
class Layer:
    rank: int
    package: str
    folder: Path


def layers() -> list[Layer]:
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = [ROW.match(line) for line in text.splitlines()]
    found = [Layer(int(m[1]), m[2], REPO / m[3]) for m in rows if m]
    assert found, "ARCHITECTURE.md has no layer table (| rank | `package` | `folder/` | ...)"
    return found


def package_of(module: str, table: list[Layer]) -> Layer | None:
    """The most specific listed package holding ``module`` (hilrec.drivers.emulated.x -> emulated)."""
    best: Layer | None = None
    for layer in table:
        if (module == layer.package or module.startswith(layer.package + ".")) and (
            best is None or len(layer.package) > len(best.package)
        ):
            best = layer
    return best


def module_name(path: Path, table: list[Layer]) -> str:
    holder = max((la for la in table if path.is_relative_to(la.folder)), key=lambda la: len(la.folder.parts))
    rel = path.relative_to(holder.folder).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([holder.package, *parts])


def imports_of(path: Path, module: str, packages: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if target in packages:  # `from hilrec.drivers import emulated` imports a sub-package
                found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return [(line, name) for line, name in found if name.startswith("hilrec.")]


def sources(table: list[Layer]) -> list[Path]:
    folders = {la.folder for la in table}
    return sorted({p for folder in folders for p in folder.rglob("*.py")})


def violations(table: list[Layer]) -> list[str]:
    problems: list[str] = []
    for path in sources(table):
        module = module_name(path, table)
        own = package_of(module, table)
        assert own is not None
        for line, target in imports_of(path, module, {la.package for la in table}):
            theirs = package_of(target, table)
            if theirs is None or theirs.package == own.package:
                continue
            if theirs.rank >= own.rank:
                where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"
                kind = "a package of the same layer" if theirs.rank == own.rank else "a higher layer"
                problems.append(
                    f"{where}: {own.package} (layer {own.rank}) imports {target}, "
                    f"{kind} ({theirs.package}, layer {theirs.rank})"
                )
    return sorted(set(problems))


def test_every_import_follows_the_layer_table() -> None:
    problems = violations(layers())
    assert not problems, "imports against the layering rule:\n" + "\n".join(problems)


def test_the_table_lists_every_package_and_pyproject_agrees() -> None:
    table = layers()
    listed = {la.package: la.folder for la in table}
    on_disk = {
        module_name(init.parent / "__init__.py", table)
        for init in (p for la in table for p in la.folder.rglob("__init__.py"))
    }
    assert on_disk == set(listed), f"packages on disk {sorted(on_disk)} vs ARCHITECTURE.md {sorted(listed)}"
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setup["packages"]) == set(listed)
    assert {k: REPO / v for k, v in setup["package-dir"].items()} == listed


@pytest.mark.parametrize(
    "source, target, allowed",
    [
        ("hilrec.daemon.dataset.writer", "hilrec.sim.twin", False),  # format below the twin
        ("hilrec.sim.twin", "hilrec.drivers.bus", False),  # peers of one layer
        ("hilrec.drivers.arm", "hilrec.drivers.emulated.emulator", False),  # upward inside drivers
        ("hilrec.daemon.wire.server", "hilrec.daemon.control.settings", False),
        ("hilrec.daemon.control.loop", "hilrec.daemon.wire.telemetry", True),
        ("hilrec.drivers.emulated.motion", "hilrec.sim.twin", True),
        ("hilrec.daemon.replay.check", "hilrec.daemon.dataset.reader", True),
    ],
)
def test_the_rule_can_fail(tmp_path: Path, source: str, target: str, allowed: bool) -> None:
    """The checker itself: a planted import of each kind is (or is not) reported."""
    table = layers()
    own = package_of(source, table)
    assert own is not None
    planted = tmp_path / own.package.replace(".", "_")
    planted.mkdir()
    (planted / "planted.py").write_text(f"def f():\n    import {target}\n")
    fake = [Layer(la.rank, la.package, planted if la.package == own.package else la.folder) for la in table]
    reported = [p for p in violations(fake) if "planted.py" in p]
    assert bool(reported) is not allowed, reported
