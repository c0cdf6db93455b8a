"""An emulated leader under torque: Torque_Enable, Goal_Position and Torque_Limit move its servos,
and the scripted hand on it rests, holds or pushes, winning against a low torque.

The emulator's motion runs on a clock the test sets by hand, so how far a servo moves in a given
time is exact (no wall-clock timing is asserted). Everything goes through the real bus, the
leader driver and the unmodified SDK on a pty.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import MOTOR_IDS
from hilrec.drivers.arm import LeaderConfig, SO101Leader
from hilrec.drivers.calibration import save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.hand import HAND_FORCE, HandMode, HandScript
from hilrec.drivers.emulated.motion import wave_path

STEP_S = 0.005


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def leader_rig(
    tmp_path: Path, emulate: Callable[..., EmulatedArm]
) -> Iterator[Callable[..., tuple[EmulatedArm, SO101Leader, ManualClock]]]:
    """``start(motion, hand)``: an emulated leader on a manual clock and the driver, open."""
    opened: list[SO101Leader] = []

    def start(motion: str = "servo", hand: str = "grip") -> tuple[EmulatedArm, SO101Leader, ManualClock]:
        clock = ManualClock()
        emu = emulate("leader", motion=motion, hand=HandScript.parse(hand), clock=clock)
        calibration = save_calibration(emu.frame.calibration, tmp_path / f"leader{len(opened)}.json")
        arm = SO101Leader(LeaderConfig(port=emu.port, calibration=calibration))
        arm.open()  # torque off, as a leader is opened
        opened.append(arm)
        return emu, arm, clock

    yield start
    for arm in opened:
        arm.close()  # before the fixture `emulate` stops the emulators


def run(arm: SO101Leader, clock: ManualClock, seconds: float) -> np.ndarray:
    """Let ``seconds`` pass in small steps, reading (so the emulator moves) at each; the last."""
    reading = arm.get_action().values
    for _ in range(round(seconds / STEP_S)):
        clock.now += STEP_S
        reading = arm.get_action().values
    return reading.astype(np.float64)


def away(present: np.ndarray, degrees: float) -> np.ndarray:
    goal = present.astype(np.float32).copy()
    goal[:5] += np.float32(degrees)  # the body joints; the gripper stays
    return goal


def test_a_leader_under_torque_moves_to_its_goal_slower_at_a_low_torque(leader_rig) -> None:
    moved = {}
    for limit in (1000, 60):
        _, arm, clock = leader_rig()
        start = run(arm, clock, 0.05)
        np.testing.assert_allclose(run(arm, clock, 0.2), start, atol=0.1)  # torque off: stays put
        arm.hold_under_torque(limit, start.astype(np.float32))
        goal = away(start, 20.0)
        arm.send_feedback(goal, start.astype(np.float32), max_step=90.0)
        moved[limit] = float(np.abs(run(arm, clock, 0.04) - start)[:5].min())
        final = run(arm, clock, 1.0)
        np.testing.assert_allclose(final[:5], goal[:5], atol=0.2)  # both get there in the end
    assert 0 < moved[60] < moved[1000] / 2, moved


def test_the_hand_wins_against_a_low_torque_and_loses_against_a_high_one(leader_rig) -> None:
    emu, arm, clock = leader_rig(motion="wave", hand="grip")
    path = wave_path(emu.frame)
    start = run(arm, clock, 0.1)
    arm.hold_under_torque(int(HAND_FORCE) - 150, start.astype(np.float32))
    goal = away(start, 25.0)
    arm.send_feedback(goal, start.astype(np.float32), max_step=90.0)
    weak = run(arm, clock, 0.5)
    with emu.paused():
        hand_at, t = emu.motion.actual(), clock.now - 1000.0
    np.testing.assert_allclose(hand_at, path(t), atol=1e-6)  # where the hand is: on its path
    assert np.abs(weak[:5] - goal[:5]).max() > 5.0
    arm.hold_under_torque(1000, weak.astype(np.float32))
    arm.send_feedback(goal, weak.astype(np.float32), max_step=90.0)
    np.testing.assert_allclose(run(arm, clock, 1.0)[:5], goal[:5], atol=0.2)


def test_a_resting_hand_goes_along_under_torque_and_takes_over_without_a_jump(leader_rig) -> None:
    emu, arm, clock = leader_rig(motion="wave", hand="rest")
    before = run(arm, clock, 0.2)
    assert np.abs(run(arm, clock, 0.3) - before).max() > 1.0  # torque off: the hand moves it
    here = run(arm, clock, 0.0)
    arm.hold_under_torque(200, here.astype(np.float32))
    held = run(arm, clock, 0.5)
    np.testing.assert_allclose(held, here, atol=0.2)  # the hand rests: the servos hold
    goal = away(held, 10.0)
    arm.send_feedback(goal, held.astype(np.float32), max_step=90.0)
    followed = run(arm, clock, 0.5)
    np.testing.assert_allclose(followed[:5], goal[:5], atol=0.2)  # and follow their goal
    arm.release()
    first = arm.get_action().values.astype(np.float64)
    clock.now += STEP_S
    second = arm.get_action().values.astype(np.float64)
    # Taken where it is: the hand's first steps are a hand's, not a jump to its path.
    assert np.abs(first - followed).max() < 0.5 and np.abs(second - followed).max() < 1.0
    assert np.abs(run(arm, clock, 1.0) - followed).max() > 2.0  # then it moves the arm on
    assert [servo.get("Torque_Enable") for servo in emu.servos] == [0] * len(MOTOR_IDS)


def test_a_pushing_hand_moves_a_leader_under_low_torque_away_from_its_goal(leader_rig) -> None:
    deviations = {}
    for limit in (200, 1000):
        emu, arm, clock = leader_rig(motion="wave", hand="push:after_s=0.5")
        here = run(arm, clock, 0.3)
        arm.hold_under_torque(limit, here.astype(np.float32))
        early = run(arm, clock, 0.45)
        np.testing.assert_allclose(early, here, atol=0.2)  # resting, until it pushes
        pushed = run(arm, clock, 1.5)
        deviations[limit] = float(np.abs(pushed - here)[:5].max())
        assert [servo.get("Torque_Enable") for servo in emu.servos] == [1] * len(MOTOR_IDS)
    assert deviations[200] > 5.0 and deviations[1000] < 0.2, deviations


def test_a_bad_hand_script_names_the_problem() -> None:
    assert HandScript.parse("push:after_s=2").mode == HandMode.PUSH
    bad = (("shove", "unknown hand"), ("push:after=2", "after_s="), ("push:after_s=x", "number"))
    for text, words in bad:
        with pytest.raises(ConfigError, match=words):
            HandScript.parse(text)
