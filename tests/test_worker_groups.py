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
        log.write(f"{{os.getpid()}}\\n")
"""


@pytest.mark.slow
def test_a_module_fixture_is_built_once_and_other_tests_spread(
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
    assert len(set(alone.read_text().split())) == 2  # the ungrouped tests still use both workers
