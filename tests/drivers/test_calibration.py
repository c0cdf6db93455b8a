"""Calibration maths and files, checked against LeRobot 0.4.4's own code on the same inputs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import draccus
import numpy as np
import pytest
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors import MotorCalibration as LeRobotCalibration
from lerobot.motors.feetech import FeetechMotorsBus

from hilrec.daemon.errors import CalibrationError
from hilrec.daemon.so101 import JOINT_NAMES, MOTORS, BodyMode, NormMode, Role
from hilrec.drivers.calibration import (
    ArmCalibration,
    half_turn_homing,
    lerobot_calibration_path,
    load_calibration,
    save_calibration,
    ticks_to_units,
    units_to_ticks,
)

CAL = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": -1021, "range_min": 740, "range_max": 3412},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": 15, "range_min": 812, "range_max": 3195},
    "elbow_flex": {"id": 3, "drive_mode": 1, "homing_offset": 2047, "range_min": 901, "range_max": 3111},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": -2047, "range_min": 880, "range_max": 3226},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 3, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 1104, "range_min": 2016, "range_max": 3471},
}


def lerobot_bus(body_mode: MotorNormMode, cal: dict = CAL, gripper_drive_mode: int = 0) -> FeetechMotorsBus:
    motors = {
        name: Motor(mid, "sts3215", MotorNormMode.RANGE_0_100 if mode == "range_0_100" else body_mode)
        for name, (mid, mode) in MOTORS.items()
    }
    calibration = {name: LeRobotCalibration(**entry) for name, entry in cal.items()}
    calibration["gripper"].drive_mode = gripper_drive_mode
    return FeetechMotorsBus(port="/dev/null-not-opened", motors=motors, calibration=calibration)


@pytest.mark.parametrize("body_mode", list(BodyMode))
def test_normalisation_is_bit_identical_to_lerobot(body_mode: BodyMode) -> None:
    ours = ArmCalibration.from_mapping(CAL)
    theirs = lerobot_bus(MotorNormMode(body_mode))
    rng = np.random.default_rng(0)
    for ticks in [rng.integers(0, 4096, 6) for _ in range(300)] + [np.full(6, 0), np.full(6, 4095)]:
        expected = theirs._normalize({mid: int(t) for mid, t in zip(range(1, 7), ticks, strict=True)})
        got = ours.ticks_to_units([int(t) for t in ticks], body_mode)
        assert got.tolist() == [expected[mid] for mid in range(1, 7)]  # exact, not approx


@pytest.mark.parametrize("body_mode", list(BodyMode))
def test_unnormalisation_truncates_like_lerobot(body_mode: BodyMode) -> None:
    ours = ArmCalibration.from_mapping(CAL)
    theirs = lerobot_bus(MotorNormMode(body_mode))
    rng = np.random.default_rng(1)
    for units in rng.uniform(-130, 130, (300, 6)):
        units[5] = abs(units[5]) % 110  # the gripper, a bit beyond 100 to exercise the clip
        expected = theirs._unnormalize({mid: float(u) for mid, u in zip(range(1, 7), units, strict=True)})
        got = ours.units_to_ticks(units.tolist(), body_mode)
        assert got == [expected[mid] for mid in range(1, 7)]


def test_drive_mode_mirrors_the_gripper_like_lerobot() -> None:
    cal = {**CAL, "gripper": {**CAL["gripper"], "drive_mode": 1}}
    ours = ArmCalibration.from_mapping(cal)
    theirs = lerobot_bus(MotorNormMode.DEGREES, gripper_drive_mode=1)
    for ticks in (2016, 2500, 3471, 100, 4000):
        assert (
            ticks_to_units(ticks, ours["gripper"], NormMode.RANGE_0_100) == theirs._normalize({6: ticks})[6]
        )
        assert (
            units_to_ticks(30.0, ours["gripper"], NormMode.RANGE_0_100) == theirs._unnormalize({6: 30.0})[6]
        )
    # DEGREES ignores drive_mode in LeRobot, and so do we (elbow_flex has drive_mode 1 above).
    assert ticks_to_units(2006, ours["elbow_flex"], NormMode.DEGREES) == (2006 - 2006) * 360 / 4095


def test_file_is_byte_identical_to_lerobots_dump(tmp_path: Path) -> None:
    calibration = ArmCalibration.from_mapping(CAL)
    path = save_calibration(calibration, tmp_path / "robots" / "so_follower" / "arm.json")
    buffer = io.StringIO()
    with draccus.config_type("json"):
        motors = {n: LeRobotCalibration(**e) for n, e in CAL.items()}
        draccus.dump(motors, buffer, indent=4)  # type: ignore[type-var, unused-ignore]  # its stubs take dataclasses only
    assert path.read_text() == buffer.getvalue()
    assert load_calibration(path) == calibration
    with open(path) as fh, draccus.config_type("json"):  # and LeRobot loads ours
        loaded = draccus.load(dict[str, LeRobotCalibration], fh)  # type: ignore[type-var, unused-ignore]  # as dump()
    assert {n: vars(c) for n, c in loaded.items()} == CAL


def test_lerobot_calibration_directory_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_LEROBOT_CALIBRATION", "HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert (
        lerobot_calibration_path(Role.FOLLOWER, "blue")
        == tmp_path / ".cache/huggingface/lerobot/calibration/robots/so_follower/blue.json"
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert (
        lerobot_calibration_path(Role.LEADER, "red")
        == tmp_path / "hf/lerobot/calibration/teleoperators/so_leader/red.json"
    )
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path / "cal"))
    assert lerobot_calibration_path(Role.LEADER, "red") == tmp_path / "cal/teleoperators/so_leader/red.json"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("gripper"), "missing ['gripper']"),
        (lambda d: d["elbow_flex"].update(range_min=3200), "elbow_flex': range_min 3200 must be below"),
        (lambda d: d["wrist_flex"].update(homing_offset=2048), "homing_offset 2048 exceeds"),
        (lambda d: d["shoulder_pan"].update(id=7), "joint 'shoulder_pan' has id 7"),
        (lambda d: d["gripper"].update(range_max="3471"), "range_max must be an integer"),
        (lambda d: d["gripper"].pop("drive_mode"), "missing fields ['drive_mode']"),
    ],
)
def test_bad_files_are_refused_naming_file_and_joint(tmp_path: Path, edit, message: str) -> None:
    data = json.loads(json.dumps(CAL))
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=re.escape(message)) as info:
        load_calibration(path)
    assert str(path) in str(info.value)


def test_missing_and_unparsable_files_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no calibration file"):
        load_calibration(tmp_path / "absent.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CalibrationError, match=re.escape("broken.json: not valid JSON")):
        load_calibration(tmp_path / "broken.json")


def test_half_turn_homing_matches_lerobot_and_refuses_the_seam() -> None:
    theirs = lerobot_bus(MotorNormMode.DEGREES)
    for pos in (0, 1, 2047, 3000, 4094):
        assert half_turn_homing(pos) == theirs._get_half_turn_homings({"shoulder_pan": pos})["shoulder_pan"]
    with pytest.raises(CalibrationError, match="beyond the register"):
        half_turn_homing(4095)  # 4095 - 2047 = 2048 does not fit: lerobot issue #1296


def test_joint_order_is_the_so101_order_whatever_the_file_order() -> None:
    reordered = dict(reversed(list(CAL.items())))
    assert tuple(ArmCalibration.from_mapping(reordered)) == JOINT_NAMES
