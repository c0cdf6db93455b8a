"""The suite's xdist groups hold: under ``-n 2 --dist loadgroup`` a module's tests that share a
module fixture run on one worker, which builds the fixture once (tests/conftest.py); a session
fixture has one definition in the whole suite, so a worker builds it once; and the Ray cluster
runs from its first user to the last of a run of users, not to the session's end."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = 24
SAMPLE = f"""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(f"{{os.getpid()}}\\n")
    return os.getpid()


@pytest.mark.parametrize("i", range({TESTS}))
def test_shares_the_build(built, i):
    assert built == os.getpid()


@pytest.mark.parametrize("i", range({TESTS}))
def test_alone(i):
    with open(os.environ["ALONE_LOG"], "a") as log:
        log.write(f"{{os.environ.get('PYTEST_XDIST_WORKER', 'no-worker')}}\\n")
"""


def _suite_files(here: Path) -> dict[str, str]:
    """The suite's conftest and support package, for a pytester run that uses them."""
    support = {f"tests/support/{path.stem}": path.read_text() for path in (here / "support").glob("*.py")}
    return {"tests/conftest": (here / "conftest.py").read_text(), **support}


@pytest.mark.slow
def test_a_module_fixture_is_built_once_on_two_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built, alone = tmp_path / "built.log", tmp_path / "alone.log"
    monkeypatch.setenv("BUILT_LOG", str(built))
    monkeypatch.setenv("ALONE_LOG", str(alone))
    pytester.makepyfile(**{"tests/test_sample": SAMPLE, **_suite_files(Path(__file__).parent)})
    argv = ("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "tests")
    result = pytester.runpytest_subprocess(*argv)
    result.assert_outcomes(passed=2 * TESTS)
    assert len(built.read_text().split()) == 1  # one build, on the one worker of the group
    # The run was spread: every test ran in an xdist worker. Which workers the ungrouped tests
    # land on is the scheduler's and the machine's load's (one worker took all 24 once in CI).
    assert set(alone.read_text().split()) <= {"gw0", "gw1"}


def _session_fixtures(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                scope = [k.value for k in getattr(decorator, "keywords", []) if k.arg == "scope"]
                if scope and isinstance(scope[0], ast.Constant) and scope[0].value == "session":
                    names.add(node.name)
    return names


def _bound_names(tree: ast.Module) -> set[str]:
    """What a module defines, assigns or imports at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def test_a_session_fixture_has_one_definition_in_the_suite() -> None:
    """pytest keeps a session fixture per definition: the fan-out and the replay conftests each
    had their own ``ray_address``, and a worker that ran both kinds started two Ray clusters."""
    tests = Path(__file__).parent
    sources = [*tests.rglob("conftest.py"), *(tests / "support").glob("*.py")]
    trees = {path: ast.parse(path.read_text()) for path in sources}
    session = set().union(*(_session_fixtures(tree) for tree in trees.values()))
    assert "ray_cluster" in session  # the rule reads real definitions
    where = defaultdict(list)
    for path, tree in trees.items():
        if path.name == "conftest.py":
            for name in _bound_names(tree) & session:
                where[name].append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


# Ray's start stood in for by a generator that logs (the real one is what test_ray.py runs).
RAY_USERS = """
import os

from support import ray_cluster


def log(line):
    with open(os.environ["RAY_LOG"], "a") as out:
        out.write(line + "\\n")


def started():
    log("start")
    try:
        yield "127.0.0.1:1"
    finally:
        log("stop")


ray_cluster.start_cluster = started


def test_a(ray_address):
    log("a " + ray_address)


def test_b(ray_address):
    log("b " + ray_address)


def test_c():
    log("c")


def test_d(ray_address):
    log("d " + ray_address)
"""


def test_the_ray_cluster_stops_after_the_last_of_a_run_of_its_users(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ray_log = tmp_path / "ray.log"
    monkeypatch.setenv("RAY_LOG", str(ray_log))
    pytester.makepyfile(**{"tests/test_users": RAY_USERS, **_suite_files(Path(__file__).parent)})
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "tests")
    result.assert_outcomes(passed=4)
    address = "127.0.0.1:1"
    assert ray_log.read_text().split("\n")[:-1] == [
        "start",
        f"a {address}",
        f"b {address}",
        "stop",
        "c",
        "start",
        f"d {address}",
        "stop",
    ]


ORDER_SAMPLES = {
    # a fast module whose five tests share a module fixture: one xdist group, the largest
    "tests/test_a_fast": """
import pytest

@pytest.fixture(scope="module")
def shared():
    return 1

@pytest.mark.parametrize("i", range(5))
def test_fast(shared, i):
    pass
""",
    "tests/test_b_slow": """
import pytest

def test_b_first():
    pass

@pytest.mark.slow
def test_b_second():
    pass
""",
    "tests/ui/test_page": "import pytest\n\n@pytest.mark.slow\ndef test_the_page():\n    pass\n",
    "tests/collect/test_kills": "import pytest\n\n@pytest.mark.slow\ndef test_kills():\n    pass\n",
}


@pytest.mark.slow
def test_the_modules_with_a_slow_test_run_first_then_the_fast_each_in_its_order(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(**{**ORDER_SAMPLES, **_suite_files(Path(__file__).parent)})
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    # One worker runs the units in the order it is given them: xdist's own reordering would put
    # the five-test group first.
    argv = ("-n", "1", "--dist", "loadgroup", "-p", "no:cacheprovider", "-v", "tests")
    result = pytester.runpytest_subprocess(*argv)
    result.assert_outcomes(passed=9)
    passed = [line.split(" PASSED ", 1)[1] for line in result.outlines if " PASSED " in line]
    ran = [nodeid.split("::", 1)[1].split("@")[0].strip() for nodeid in passed]
    assert ran == [
        "test_kills",
        "test_b_first",
        "test_b_second",
        "test_the_page",
        *(f"test_fast[{i}]" for i in range(5)),
    ], ran
