"""The policy driver: chunks indexed by tick, bad outputs refused and counted, the policy in its
own process, and its death seen and said."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.errors import PolicyError
from hilrec.daemon.policy.chunks import PLAUSIBLE_UNITS, refusal
from hilrec.daemon.policy.driver import PolicyDriver
from hilrec.daemon.policy.load import load_policy
from hilrec.daemon.policy.runner import InlineRunner, ProcessRunner

POLICIES = Path(__file__).with_name("_policies.py")
STATE = np.array([1.0, -20.0, 30.0, 40.0, 5.0, 25.0], dtype=np.float32)


def observation(state: np.ndarray = STATE) -> dict[str, object]:
    return {"observation.state": state, "task": "hold"}


def inline(name: str) -> PolicyDriver:
    return PolicyDriver(InlineRunner(load_policy(f"{POLICIES}:{name}")))


def test_a_chunk_is_indexed_by_the_tick_of_its_observation() -> None:
    driver = inline("chunk_of_three")
    first = driver.step(10, observation())
    assert first.goal is not None and first.age == 0 and first.fresh
    assert first.goal[0] == STATE[0] + 1
    second = driver.step(11, observation(STATE + 100))  # not asked: the chunk has goals left
    assert second.goal is not None and second.age == 1 and not second.fresh
    assert second.goal[0] == STATE[0] + 2
    driver.step(12, observation())
    fourth = driver.step(13, observation(STATE + 7))  # the chunk is spent: asked again
    assert fourth.goal is not None and fourth.age == 0 and fourth.fresh
    assert fourth.goal[0] == STATE[0] + 7 + 1


@pytest.mark.parametrize("name", ["nan", "huge", "wrong_shape", "raises"])
def test_a_bad_output_is_refused_counted_and_nothing_is_due(name: str) -> None:
    driver = inline(name)
    for tick in range(3):
        step = driver.step(tick, observation())
        assert step.goal is None and step.starved and step.refused == 1
    assert driver.refused == 3
    assert driver.last_refusal is not None and "refused" in driver.last_refusal


def test_refusal_names_what_is_wrong() -> None:
    why_nan = refusal(np.full(6, np.nan))
    why_huge = refusal(np.full(6, 1e6))
    why_shape = refusal(np.zeros((2, 5)))
    assert why_nan is not None and "non-finite" in why_nan
    assert why_huge is not None and "1e+06" in why_huge
    assert why_shape is not None and "(2, 5)" in why_shape
    assert refusal(np.zeros((4, 6))) is None and refusal([0.0] * 6) is None
    assert refusal(np.full(6, PLAUSIBLE_UNITS)) is None
    assert refusal("six numbers") is not None


def test_after_bad_answers_good_ones_drive_again() -> None:
    driver = inline("BadThenGood")
    steps = [driver.step(tick, observation()) for tick in range(5)]
    assert [s.goal is None for s in steps] == [True, True, True, False, False]
    assert driver.refused == 3


@pytest.fixture()
def process_driver() -> Iterator[PolicyDriver]:
    runner = ProcessRunner(f"{POLICIES}:hold_still")
    driver = PolicyDriver(runner)
    yield driver
    driver.close()


def test_a_policy_process_answers_without_the_caller_waiting(process_driver: PolicyDriver) -> None:
    runner = process_driver.runner
    assert isinstance(runner, ProcessRunner)
    first = process_driver.step(0, observation())
    assert first.starved  # submit returned at once: the answer is not there yet
    assert runner.wait(30.0)
    step = process_driver.step(1, observation())
    # The answer to tick 0's observation is one tick old at tick 1 and holds still.
    assert step.goal is not None and step.age == 1 and step.fresh
    np.testing.assert_array_equal(step.goal, STATE)
    assert step.latency_s >= 0


def test_a_killed_policy_process_is_said_dead(process_driver: PolicyDriver) -> None:
    runner = process_driver.runner
    assert isinstance(runner, ProcessRunner) and runner.pid is not None
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(30.0)
    assert runner.dead is not None and "exit code -9" in runner.dead
    with pytest.raises(PolicyError, match="ended"):
        process_driver.step(5, observation())


def test_a_policy_that_does_not_load_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="no_such"):
        ProcessRunner(f"{POLICIES}:no_such")
