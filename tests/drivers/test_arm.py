"""SO-101 follower and leader over the real stack, against emulated arms."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hilrec.daemon.errors import (
    ActionError,
    BusTimeoutError,
    CalibrationError,
    ConfigError,
    DeviceError,
    ServoFaultError,
)
from hilrec.daemon.so101 import JOINT_NAMES, MAX_TICK, NormMode
from hilrec.drivers.arm import ArmConfig, FollowerConfig, SO101Follower, SO101Leader
from hilrec.drivers.calibration import load_calibration, save_calibration, units_to_ticks
from hilrec.drivers.emulated.emulator import EmulatedArm
from hilrec.drivers.emulated.faults import Fault

IDS = (1, 2, 3, 4, 5, 6)
# Every joint at the emulated arm's middle (Present_Position 2047, the homing pose) reads 0, but
# wrist_roll: its range is LeRobot's full turn 0..4095, whose middle is half a tick higher.
WRIST_ROLL_AT_2047 = float(np.float32((2047 - (0 + 4095) / 2) * 360 / 4095))
MIDDLE_POSE = [0.0, 0.0, 0.0, 0.0, WRIST_ROLL_AT_2047, 50.0]


def registers(emu: EmulatedArm, name: str) -> list[int]:
    with emu.paused():
        return [servo.get(name) for servo in emu.servos]


def wait_until_reached(arm: SO101Follower, goal: np.ndarray, ticks_tolerance: float = 1.0) -> None:
    tolerance = ticks_tolerance * 360 / MAX_TICK + 1e-4
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # a condition with a timeout: the servos are moving
        if np.all(np.abs(arm.read().values - goal) <= tolerance):
            return
    raise AssertionError(f"follower did not reach {goal}: {arm.read().values}")


def test_follower_is_configured_like_lerobot(follower_emu: EmulatedArm, calibration_file: Path) -> None:
    with SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file)):
        assert registers(follower_emu, "P_Coefficient") == [16] * 6
        assert registers(follower_emu, "I_Coefficient") == [0] * 6
        assert registers(follower_emu, "D_Coefficient") == [32] * 6
        assert registers(follower_emu, "Operating_Mode") == [0] * 6
        assert registers(follower_emu, "Return_Delay_Time") == [0] * 6
        assert registers(follower_emu, "Maximum_Acceleration") == [254] * 6
        assert registers(follower_emu, "Max_Torque_Limit")[5] == 500
        assert registers(follower_emu, "Protection_Current")[5] == 250
        assert registers(follower_emu, "Overload_Torque")[5] == 25
        assert registers(follower_emu, "Max_Torque_Limit")[:5] == [1000] * 5  # body untouched
        assert registers(follower_emu, "Torque_Enable") == [1] * 6
        assert registers(follower_emu, "Lock") == [1] * 6
    assert registers(follower_emu, "Torque_Enable") == [0] * 6  # off on close


def test_torque_goes_off_when_the_with_block_fails(follower_emu: EmulatedArm, calibration_file: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="operator code failed"),
        SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file)),
    ):
        raise RuntimeError("operator code failed")
    assert registers(follower_emu, "Torque_Enable") == [0] * 6


def test_units_round_trip_through_the_servos(follower_emu: EmulatedArm, calibration_file: Path) -> None:
    config = FollowerConfig(port=follower_emu.port, calibration=calibration_file)
    with SO101Follower(config) as arm:
        assert arm.read().values.tolist() == MIDDLE_POSE
        goal = np.array([30.0, -45.0, 60.5, -10.0, 90.0, 20.0], dtype=np.float32)
        sent = arm.send_action(goal)
        assert sent.sent.dtype == np.float32 and not sent.clamped
        wait_until_reached(arm, goal)
        reading = arm.read()
        assert reading.ticks == sent.ticks  # the servo reached exactly the ticks we sent
        assert reading.values.dtype == np.float32


def test_action_is_cast_to_float32_before_it_becomes_ticks(
    follower_emu: EmulatedArm, calibration_file: Path
) -> None:
    cal = follower_emu.frame.calibration["shoulder_pan"]
    # Find a float64 goal whose float32 rounding crosses a tick boundary.
    candidates = (k * 360 / MAX_TICK - 3e-9 for k in range(1, 2000))
    value = next(
        v
        for v in candidates
        if units_to_ticks(v, cal, NormMode.DEGREES)
        != units_to_ticks(float(np.float32(v)), cal, NormMode.DEGREES)
    )
    with SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file)) as arm:
        sent = arm.send_action(np.array([value, 0, 0, 0, 0, 50], dtype=np.float64))
    assert sent.sent[0] == np.float32(value)
    assert sent.ticks[0] == units_to_ticks(float(np.float32(value)), cal, NormMode.DEGREES)
    assert sent.ticks[0] != units_to_ticks(value, cal, NormMode.DEGREES)


def test_max_relative_target_clamps_and_returns_what_was_sent(
    follower_emu: EmulatedArm, calibration_file: Path
) -> None:
    caps = dict(zip(JOINT_NAMES, [5.0, 5.0, 5.0, 5.0, 5.0, 10.0], strict=True))
    config = FollowerConfig(port=follower_emu.port, calibration=calibration_file, max_relative_target=caps)
    with SO101Follower(config) as arm:
        present = arm.read().values
        handled = follower_emu.packets_handled
        sent = arm.send_action([40.0, -2.0, -40.0, 0.0, 0.0, 90.0], present=present)
        assert follower_emu.wait_handled(handled + 1)  # a sync write has no reply to wait for
        assert sent.clamped
        np.testing.assert_array_equal(
            sent.sent, np.array([5.0, -2.0, -5.0, 0.0, 0.0, 60.0], dtype=np.float32)
        )
        with follower_emu.paused():
            goals = [s.get("Goal_Position") for s in follower_emu.servos]
        assert tuple(goals) == sent.ticks


def test_bad_actions_and_configs_are_refused(follower_emu: EmulatedArm, calibration_file: Path) -> None:
    with SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file)) as arm:
        handled = follower_emu.packets_handled
        with pytest.raises(ActionError, match="6 finite numbers"):
            arm.send_action([0.0, 0.0, float("nan"), 0.0, 0.0, 0.0])
        with pytest.raises(ActionError):
            arm.send_action([0.0] * 5)
        assert follower_emu.packets_handled == handled  # nothing reached the servos
    with pytest.raises(ConfigError, match="max_relative_target"):
        SO101Follower(FollowerConfig(port="x", max_relative_target={"gripper": 1.0}))


def test_leader_has_torque_off_and_is_never_sent_a_goal(emulate, calibration_file: Path) -> None:
    leader_emu = emulate("leader", motion="wave")
    with SO101Leader(ArmConfig(port=leader_emu.port, calibration=calibration_file)) as leader:
        assert registers(leader_emu, "Torque_Enable") == [0] * 6
        assert registers(leader_emu, "Lock") == [0] * 6
        first = leader.get_action()
        for _ in range(50):
            later = leader.get_action()
            if not np.array_equal(later.values, first.values):
                break
        assert not np.array_equal(later.values, first.values)  # the hand is moving it
        assert not hasattr(leader, "send_action")
    with leader_emu.paused():
        assert [s.log.goal_writes for s in leader_emu.servos] == [0] * 6


def test_servo_calibration_is_rewritten_from_the_file(
    emulate, tmp_path: Path, calibration_file: Path
) -> None:
    fresh = emulate("follower", factory_fresh=True)
    assert registers(fresh, "Homing_Offset") == [0] * 6
    with SO101Follower(FollowerConfig(port=fresh.port, calibration=calibration_file)) as arm:
        assert arm.read().values.tolist() == MIDDLE_POSE
    expected = [cal.homing_offset for cal in fresh.frame.calibration.values()]
    assert registers(fresh, "Homing_Offset") == expected
    other = emulate("follower", factory_fresh=True)
    refuse = FollowerConfig(port=other.port, calibration=calibration_file, write_calibration=False)
    with pytest.raises(CalibrationError, match="hold a calibration different from"):
        SO101Follower(refuse).open()
    assert registers(other, "Torque_Enable") == [0] * 6  # a refused open still leaves it safe


def test_missing_calibration_names_lerobots_path(
    follower_emu: EmulatedArm, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path))
    with pytest.raises(CalibrationError, match=re.escape("robots/so_follower/blue.json: no calibration")):
        SO101Follower(FollowerConfig(port=follower_emu.port, id="blue")).open()


@pytest.mark.slow
def test_open_names_missing_servos(emulate, calibration_file: Path) -> None:
    emu = emulate("follower")
    emu.inject(Fault(kind="missing", servo_id=5))
    config = FollowerConfig(port=emu.port, calibration=calibration_file)
    with pytest.raises(BusTimeoutError, match=r"servo\(s\) 5 \(wrist_roll\) do not answer"):
        SO101Follower(config).open()


def test_overload_stops_the_follower_unless_tolerated(
    follower_emu: EmulatedArm, calibration_file: Path
) -> None:
    strict = FollowerConfig(port=follower_emu.port, calibration=calibration_file)
    with SO101Follower(strict) as arm:
        follower_emu.inject(Fault(kind="overload", servo_id=6))
        with pytest.raises(ServoFaultError, match=r"servo id 6.*overload"):
            arm.read()
    follower_emu.clear_faults()
    tolerant = FollowerConfig(port=follower_emu.port, calibration=calibration_file, tolerated_status=0x20)
    with SO101Follower(tolerant) as arm:
        follower_emu.inject(Fault(kind="overload", servo_id=6))
        reading = arm.read()
        assert reading.status[6] == 0x20 and reading.values.shape == (6,)


def test_opening_ten_times_in_a_row_never_fails(emulate: Callable[..., EmulatedArm], tmp_path: Path) -> None:
    """Each open is about 80 transactions (ping, check, configure, torque): all of ten must work.

    On a loaded machine about 1 open in 10 once failed (pty bytes held 100-700 ms by the kernel's
    flip-buffer worker, so answers to retried requests landed after the next request's flush);
    that late-reply failure is reproduced deterministically in test_bus.py (a late PING reply),
    and the failure rate under load is bench/bench_lerobot_clients.py's to report."""
    emu = emulate("leader")
    calibration = save_calibration(emu.frame.calibration, tmp_path / "leader.json")
    failures: list[str] = []
    for opens in range(10):
        try:
            with SO101Leader(ArmConfig(port=emu.port, calibration=calibration)):
                pass
        except DeviceError as exc:
            failures.append(f"open {opens}: {exc}")
    assert failures == []


def test_out_of_range_goals_are_clamped_to_the_calibrated_range_and_flagged(
    follower_emu: EmulatedArm, calibration_file: Path
) -> None:
    with SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file)) as arm:
        sent = arm.send_action([720.0, -1000.0, 0.0, 0.0, 3.4e38, 150.0])
        assert sent.clamped
        cals = list(arm.calibration.motors.values())
        for tick, cal in zip(sent.ticks, cals, strict=True):
            assert cal.range_min <= tick <= cal.range_max
        limits = arm.limits
        expected = [limits.high[0], limits.low[1], limits.high[4], limits.high[5]]
        np.testing.assert_array_equal(sent.sent[[0, 1, 4, 5]], np.array(expected, dtype=np.float32))
        assert float(sent.sent[5]) == 100.0  # the gripper's range is 0..100
        deadline = time.monotonic() + 5.0  # a sync write has no reply: wait until it has landed
        while True:
            with follower_emu.paused():
                goals = tuple(s.get("Goal_Position") for s in follower_emu.servos)
            if goals == sent.ticks or time.monotonic() > deadline:
                break
        assert goals == sent.ticks  # what the servos hold is what was returned
        inside = arm.send_action([1.0, -2.0, 3.0, 4.0, 5.0, 50.0])
        assert not inside.clamped


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    goal=st.lists(
        st.one_of(st.floats(-1e6, 1e6, width=32), st.sampled_from([3.4e38, -3.4e38, 0.0])),
        min_size=6,
        max_size=6,
    )
)
@pytest.mark.slow
def test_no_finite_goal_converts_to_a_tick_outside_the_calibrated_range(
    follower_emu: EmulatedArm, calibration_file: Path, goal: list[float]
) -> None:
    arm = SO101Follower(FollowerConfig(port=follower_emu.port, calibration=calibration_file))
    arm._calibration = load_calibration(calibration_file)  # the maths only: nothing is sent
    safe, _ = arm.limits.clamp(goal)
    ticks = arm.calibration.units_to_ticks([float(v) for v in safe], arm.config.body_mode)
    for tick, cal in zip(ticks, arm.calibration.motors.values(), strict=True):
        assert cal.range_min <= tick <= cal.range_max
