"""tests/support: ``wait_until`` returns the first truthy value, and a wait that does not come
true fails as a test failure naming what it waited for, bounded in time."""

from __future__ import annotations

import itertools
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import WaitTimeout, wait_until


def test_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "there", timeout=5, interval=0.001) == "there"


def test_a_condition_that_never_holds_fails_naming_it_and_its_last_value() -> None:
    door = {"state": "shut"}
    with pytest.raises(AssertionError, match=r"after 0\.2 s waiting for the door to open \(last: False\)"):
        wait_until(lambda: door["state"] == "open", timeout=0.2, what="the door to open")


def test_a_zero_timeout_still_looks_once() -> None:
    assert wait_until(lambda: 7, timeout=0) == 7
    with pytest.raises(WaitTimeout):
        wait_until(lambda: 0, timeout=0)


def test_retried_exceptions_are_not_yet_and_named_at_the_end() -> None:
    attempts = itertools.count()

    def flaky() -> int:
        if next(attempts) < 2:
            raise FileNotFoundError("not written yet")
        return 1

    assert wait_until(flaky, timeout=5, interval=0.001, retry_on=(FileNotFoundError,)) == 1
    with pytest.raises(WaitTimeout, match="not written yet"):
        wait_until(_missing, timeout=0.05, retry_on=(FileNotFoundError,))
    with pytest.raises(FileNotFoundError):  # not listed: at once, not after the timeout
        wait_until(_missing, timeout=60)


def _missing() -> int:
    raise FileNotFoundError("not written yet")


@pytest.mark.parametrize(("timeout", "interval"), [(-1.0, 0.01), (1.0, 0.0)])
def test_a_nonsense_bound_is_refused(timeout: float, interval: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        wait_until(lambda: True, timeout=timeout, interval=interval)


@pytest.mark.slow  # a pytest of its own
def test_a_suite_started_with_ctrl_c_ignored_still_sends_it_to_its_children() -> None:
    """A script that starts `make test` in the background (``cmd &`` without job control) hands
    pytest SIGINT ignored; a child inherits that through exec, and every Ctrl-C a test sent was
    lost: the Ctrl-C tests of record and the display's stop failed in such a run."""
    repo = Path(__file__).resolve().parents[1]
    test = "tests/viz/test_display_child.py::test_a_display_stopped_before_it_heard_anything_is_not_a_fault"
    ignoring = f"trap '' INT; exec {shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider {test}"
    done = subprocess.run(
        ["sh", "-c", ignoring], cwd=repo, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:]
