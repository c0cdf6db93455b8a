"""The suite's xdist groups hold: under ``-n 2 --dist loadgroup`` a module's tests that share a
module fixture run on one worker, which builds the fixture once (tests/conftest.py)."""

from __future__ import annotations

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


@pytest.mark.slow
def test_a_module_fixture_is_built_once_on_two_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built, alone = tmp_path / "built.log", tmp_path / "alone.log"
    monkeypatch.setenv("BUILT_LOG", str(built))
    monkeypatch.setenv("ALONE_LOG", str(alone))
    conftest = Path(__file__).with_name("conftest.py").read_text()
    pytester.makepyfile(**{"tests/conftest": conftest, "tests/test_sample": SAMPLE})
    argv = ("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "tests")
    result = pytester.runpytest_subprocess(*argv)
    result.assert_outcomes(passed=2 * TESTS)
    assert len(built.read_text().split()) == 1  # one build, on the one worker of the group
    # The run was spread: every test ran in an xdist worker. Which workers the ungrouped tests
    # land on is the scheduler's and the machine's load's (one worker took all 24 once in CI).
    assert set(alone.read_text().split()) <= {"gw0", "gw1"}
