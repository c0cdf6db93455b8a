"""Twin angles <-> LeRobot units: the maths, its inverse, and agreement with LeRobot's own code."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hilrec.daemon.so101 import JOINT_NAMES, MOTORS
from hilrec.sim.units import (
    DEG_PER_RAD,
    GRIPPER_INDEX,
    MID_TICKS,
    TICKS_PER_RAD,
    angle_from_present_position,
    default_units_map,
    emulated_calibration,
    present_position,
    units_mapping,
)


def test_body_joints_read_degrees_through_ticks() -> None:
    umap = default_units_map()
    units = umap.units_from_rad(np.array([1.0, -0.5, 0.25, 0.0, 2.0, 0.0]))
    assert units[0] == pytest.approx(4096 / 4095 * 180 / math.pi, rel=1e-15)
    assert units[1] == pytest.approx(-0.5 * DEG_PER_RAD, rel=1e-15)
    assert units[3] == 0.0  # sim zero is the calibrated middle


def test_gripper_reads_0_closed_to_100_open() -> None:
    umap = default_units_map()
    low, high = umap.joint_ranges[GRIPPER_INDEX]
    closed = umap.units_from_rad(np.array([0, 0, 0, 0, 0, low]))[GRIPPER_INDEX]
    wide = umap.units_from_rad(np.array([0, 0, 0, 0, 0, high]))[GRIPPER_INDEX]
    assert closed == 0.0
    # span_ticks is a whole number of ticks, so fully open is 100 up to half a tick
    assert wide == pytest.approx(100.0, abs=50 / umap.gripper_span_ticks)


def test_round_trip_both_ways() -> None:
    umap = default_units_map()
    rng = np.random.default_rng(3)
    low = np.array([lo for lo, _ in umap.joint_ranges])
    high = np.array([hi for _, hi in umap.joint_ranges])
    rad = rng.uniform(low, high, size=(1000, 6))
    np.testing.assert_allclose(umap.rad_from_units(umap.units_from_rad(rad)), rad, rtol=0, atol=1e-13)
    units = umap.units_from_rad(rad)
    np.testing.assert_allclose(umap.units_from_rad(umap.rad_from_units(units)), units, rtol=0, atol=1e-11)


def test_present_position_round_trip() -> None:
    for name in JOINT_NAMES:
        for rad in (-0.7, 0.0, 0.3):
            ticks = present_position(name, rad)
            assert angle_from_present_position(name, ticks) == pytest.approx(rad, abs=1e-12)
    assert present_position("shoulder_pan", 0.0) == MID_TICKS


def test_emulated_calibration_is_lerobot_shaped_and_covers_the_joints() -> None:
    calibration = emulated_calibration()
    umap = default_units_map()
    assert list(calibration) == list(JOINT_NAMES)
    for index, (name, cal) in enumerate(calibration.items()):
        assert set(cal) == {"id", "drive_mode", "homing_offset", "range_min", "range_max"}
        assert cal["id"] == MOTORS[name][0] and cal["drive_mode"] == 0
        assert 0 <= cal["range_min"] < cal["range_max"] <= 4095
        assert abs(cal["homing_offset"]) <= 2047  # sign-magnitude register, bit 11
        low, high = umap.joint_ranges[index]
        if name == "wrist_roll":  # LeRobot's procedure records the full turn for it
            assert (cal["range_min"], cal["range_max"]) == (0, 4095)
        if name not in ("gripper", "wrist_roll"):
            assert cal["range_min"] + cal["range_max"] == 2 * MID_TICKS
            assert cal["range_min"] <= MID_TICKS + low * TICKS_PER_RAD
            assert MID_TICKS + high * TICKS_PER_RAD <= cal["range_max"]
    gripper = calibration["gripper"]
    assert gripper["range_max"] - gripper["range_min"] == umap.gripper_span_ticks


def test_lerobot_normalisation_of_emulated_ticks_equals_twin_units() -> None:
    """A servo reading the twin's angle, normalised by LeRobot 0.4.4, gives the twin's units."""
    from lerobot.motors import Motor, MotorCalibration, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    calibration = emulated_calibration()
    motors = {
        name: Motor(
            cal["id"], "sts3215", MotorNormMode.RANGE_0_100 if name == "gripper" else MotorNormMode.DEGREES
        )
        for name, cal in calibration.items()
    }
    bus = FeetechMotorsBus(
        port="/dev/null",
        motors=motors,
        calibration={k: MotorCalibration(**v) for k, v in calibration.items()},
    )
    umap = default_units_map()
    rng = np.random.default_rng(7)
    for _ in range(50):
        # angles on the tick grid, so the integer register holds them exactly
        rad = np.empty(6)
        for index, name in enumerate(JOINT_NAMES):
            low, high = umap.joint_ranges[index]
            ticks = round(rng.uniform(present_position(name, low), present_position(name, high)))
            rad[index] = angle_from_present_position(name, ticks)
        ticks_by_id = {
            calibration[n]["id"]: round(present_position(n, r)) for n, r in zip(JOINT_NAMES, rad, strict=True)
        }
        lerobot = bus._normalize(ticks_by_id)
        ours = umap.units_from_rad(rad)
        for index, name in enumerate(JOINT_NAMES):
            assert lerobot[calibration[name]["id"]] == pytest.approx(ours[index], abs=1e-9)


def test_units_mapping_is_json_and_matches_the_maths() -> None:
    mapping = json.loads(json.dumps(units_mapping()))
    umap = default_units_map()
    assert mapping["ticks_per_rad"] == TICKS_PER_RAD
    for index, name in enumerate(JOINT_NAMES):
        joint = mapping["joints"][name]
        assert joint["column"] == f"{name}.pos"
        assert joint["units_per_rad"] == umap.scale[index]
        rad = 0.123
        assert (rad - joint["rad_at_zero_units"]) * joint["units_per_rad"] == pytest.approx(
            umap.units_from_rad(np.full(6, rad))[index], rel=1e-15
        )
    assert mapping["emulated_calibration"] == emulated_calibration()
