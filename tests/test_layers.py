"""The layering rule of ARCHITECTURE.md, enforced on every import in the package sources.

The rule's one source is the layer table in ARCHITECTURE.md: this test reads it, so the document
and the code cannot drift apart. A module may import its own package and packages of a lower
layer; two packages of one layer are independent of each other. Lazy imports inside functions
and ``TYPE_CHECKING`` imports count like any other: they are dependencies all the same. So do
``from hilrec import X``, a module named in a string (``importlib.import_module("hilrec...")``)
and a child process started as ``python -m hilrec.daemon.cli <command>`` (the command's module).
The edges ARCHITECTURE.md allows at run time (its "Run-time edges" table) are the exceptions.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`(hilrec(?:\.[a-z_]+)+)`\s*\|\s*`([a-z_/]+)/`\s*\|")
EDGE = re.compile(r"^\|\s*`(hilrec(?:\.[a-z_]+)+)`\s*\|\s*`(hilrec(?:\.[a-z_*]+)+)`\s*\|")
MODULE_NAME = re.compile(r"^hilrec(?:\.[a-z_]+)+$")
CLI = "hilrec.daemon.cli"


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


def allowed_edges() -> list[tuple[str, str]]:
    """(from module, to module or ``package.*``) of ARCHITECTURE.md's run-time edges table."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    return [(m[1], m[2]) for m in (EDGE.match(line) for line in text.splitlines()) if m]


@functools.cache
def cli_commands() -> dict[str, str]:
    """Sub-command -> module, read from the command table in daemon/cli.py."""
    tree = ast.parse((REPO / "daemon" / "cli.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "COMMANDS":
            table = ast.literal_eval(node.value)  # type: ignore[arg-type]
            return {name: module for name, (module, _help) in table.items()}
    raise AssertionError("daemon/cli.py has no COMMANDS table")


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
    return list(_imports_of(path, path.read_text(encoding="utf-8"), module, frozenset(packages)))


# Keyed by the file's text: every test of this file walks all sources (a planted copy of the
# table too), and parsing them once instead of some twenty times is most of its run time.
@functools.cache
def _imports_of(path: Path, text: str, module: str, packages: frozenset[str]) -> tuple[tuple[int, str], ...]:
    tree = ast.parse(text, filename=str(path))
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
            if target in packages or target == "hilrec":  # `from hilrec.drivers import emulated`
                found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
        elif isinstance(node, (ast.List, ast.Tuple)):
            found.extend(_child_commands(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            found.append((node.lineno, node.value))  # importlib.import_module("hilrec..."), -m hilrec...
    return tuple((line, name) for line, name in found if name.startswith("hilrec."))


def _child_commands(node: ast.List | ast.Tuple) -> list[tuple[int, str]]:
    """``[..., "-m", "hilrec.daemon.cli", "display", ...]``: the child runs that command's module."""
    words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    commands = cli_commands()
    return [
        (node.lineno, commands[str(words[i + 1])])
        for i, word in enumerate(words[:-1])
        if word == CLI and words[i + 1] in commands
    ]


def _allowed(module: str, target: str, edges: list[tuple[str, str]]) -> bool:
    return any(
        module == source and (target == to or (to.endswith(".*") and target.startswith(to[:-1])))
        for source, to in edges
    )


def sources(table: list[Layer]) -> list[Path]:
    folders = {la.folder for la in table}
    return sorted({p for folder in folders for p in folder.rglob("*.py")})


def violations(table: list[Layer], edges: list[tuple[str, str]] | None = None) -> list[str]:
    edges = allowed_edges() if edges is None else edges
    problems: list[str] = []
    for path in sources(table):
        module = module_name(path, table)
        own = package_of(module, table)
        assert own is not None
        for line, target in imports_of(path, module, {la.package for la in table}):
            theirs = package_of(target, table)
            if theirs is None or theirs.package == own.package or _allowed(module, target, edges):
                continue
            if theirs.rank >= own.rank:
                where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"
                kind = "a package of the same layer" if theirs.rank == own.rank else "a higher layer"
                problems.append(
                    f"{where}: {own.package} (layer {own.rank}) imports {target}, "
                    f"{kind} ({theirs.package}, layer {theirs.rank})"
                )
    return sorted(set(problems))


@pytest.mark.slow
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
    folders = {k: REPO / v for k, v in setup["package-dir"].items()}
    # A folder of files and no code (the ui's static/) is a package only to ship its files.
    data_only = {k for k, folder in folders.items() if not any(folder.glob("*.py"))}
    assert set(setup["packages"]) - data_only == set(listed)
    assert {k: v for k, v in folders.items() if k not in data_only} == listed


@pytest.mark.parametrize(
    "source, target, allowed",
    [
        ("hilrec.daemon.dataset.writer.dataset_writer", "hilrec.sim.twin", False),  # format below the twin
        ("hilrec.sim.twin", "hilrec.drivers.bus", False),  # peers of one layer
        ("hilrec.drivers.arm", "hilrec.drivers.emulated.emulator", False),  # upward inside drivers
        ("hilrec.daemon.wire.server", "hilrec.daemon.control.settings", False),
        ("hilrec.daemon.control.loop", "hilrec.daemon.wire.telemetry", True),
        ("hilrec.drivers.emulated.motion", "hilrec.sim.twin", True),
        ("hilrec.daemon.replay.check", "hilrec.daemon.dataset.format.reader", True),
    ],
)
@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
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


@pytest.mark.parametrize(
    "source, body",
    [
        ("hilrec.daemon.wire.server", "from hilrec import daemon\nfrom hilrec.daemon import control\n"),
        (
            "hilrec.daemon.wire.server",
            "import importlib\nimportlib.import_module('hilrec.daemon.ui')\n",
        ),
        ("hilrec.daemon.ui.bridge", "ARGV = ['python', '-m', 'hilrec.daemon.cli', 'collect']\n"),
        ("hilrec.daemon.control.loop", "ARGV = ['python', '-m', 'hilrec.daemon.cli', 'display']\n"),
    ],
)
@pytest.mark.slow
def test_dependencies_by_name_and_by_child_process_are_seen(tmp_path: Path, source: str, body: str) -> None:
    """Each of these is an upward or sideways edge the checker must report; the last is the
    display child's edge, allowed only from the module the run-time table names."""
    table = layers()
    own = package_of(source, table)
    assert own is not None
    planted = tmp_path / "planted_pkg"
    planted.mkdir()
    (planted / "planted.py").write_text(body)
    fake = [Layer(la.rank, la.package, planted if la.package == own.package else la.folder) for la in table]
    reported = [p for p in violations(fake) if "planted.py" in p]
    assert reported, body


def test_the_display_child_edge_is_allowed_only_where_the_table_says() -> None:
    edges = allowed_edges()
    assert ("hilrec.daemon.wire.display_child", "hilrec.daemon.viz.cmd_display") in edges
    assert _allowed("hilrec.daemon.wire.display_child", "hilrec.daemon.viz.cmd_display", edges)
    assert not _allowed("hilrec.daemon.control.loop", "hilrec.daemon.viz.cmd_display", edges)


PLAIN_CLIENTS = ("hilrec.daemon.ui", "hilrec.daemon.collect", "hilrec.daemon.viz")
CONTROL = "hilrec.daemon.control"


def test_the_daemons_clients_import_nothing_of_control() -> None:
    """ui, collect and viz are plain clients of the daemon: its settings (the ports) and the
    display child are the wire's, so nothing in them reaches into the loop's package. (collect may
    start ``hilrec daemon`` as a child process: that edge is a process, not an import.)"""
    table = layers()
    daemon_child = cli_commands()["daemon"]
    found = []
    for layer in (la for la in table if la.package in PLAIN_CLIENTS):
        for path in sorted(layer.folder.rglob("*.py")):
            module = module_name(path, table)
            found += [
                f"{path.relative_to(REPO)}:{line}: {target}"
                for line, target in imports_of(path, module, {la.package for la in table})
                if (target == CONTROL or target.startswith(CONTROL + ".")) and target != daemon_child
            ]
    assert not found, "clients importing control:\n" + "\n".join(found)


DATASET = "hilrec.daemon.dataset"
BENCH_LIBRARIES = ("mujoco", "zmq", "serial", "cv2")


def _external_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_a_dataset_needs_nothing_of_the_bench() -> None:
    """The foundation and the dataset's rooms import no MuJoCo, ZeroMQ, pyserial or OpenCV: a
    dataset can be written, read, checked and repaired with none of them installed."""
    table = layers()
    low = [la for la in table if la.package == "hilrec.daemon" or la.package.startswith(DATASET)]
    problems: list[str] = []
    for path in sources(table):
        own = package_of(module_name(path, table), table)
        if own in low:
            bad = _external_imports(path) & set(BENCH_LIBRARIES)
            problems.extend(f"{path.relative_to(REPO)}: imports {name}" for name in sorted(bad))
    assert not problems, problems


def test_outside_the_dataset_only_its_public_surface_is_imported() -> None:
    table = layers()
    rooms = [la.package for la in table if la.package.startswith(DATASET + ".")]
    edges = allowed_edges()
    problems = []
    for path in sources(table):
        module = module_name(path, table)
        if module.startswith(DATASET):
            continue
        for line, target in imports_of(path, module, {la.package for la in table}):
            if _allowed(module, target, edges):
                continue
            if any(target == room or target.startswith(room + ".") for room in rooms):
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {target}; use {DATASET}")
    assert not problems, "\n".join(problems)


def test_the_surface_names_resolve() -> None:
    from hilrec.daemon import dataset

    # __all__ is written out for ruff and mypy; _WHERE is what resolves: the two lists agree.
    assert sorted(dataset.__all__) == sorted(dataset._WHERE)
    for name in dataset.__all__:
        assert getattr(dataset, name) is not None, name
