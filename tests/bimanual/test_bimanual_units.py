"""``hilrec edit convert-units`` on a two-arm dataset: a calibration per arm, left first.

The dataset holds what LeRobot 0.4.4's bi_so_follower records in RANGE_M100_100: each arm's
integer ticks normalised by its own calibration (the two sides' files differ, as two arms'
do). Converted, each arm's six columns must equal, bit for bit, LeRobot's DEGREES of the same
ticks under that arm's file; the sides swapped must be refused naming the arm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors import MotorCalibration as LeRobotCalibration
from lerobot.motors.feetech import FeetechMotorsBus

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format import reader
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar
from hilrec.daemon.errors import FlagError
from hilrec.daemon.so101 import ACTION_KEY, BIMANUAL_ROBOT_TYPE, MOTORS, STATE_KEY, BodyMode, so101_features
from hilrec.daemon.tools.align import align
from hilrec.daemon.tools.edit_units import convert_units

LEFT = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": -1021, "range_min": 740, "range_max": 3412},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": 15, "range_min": 812, "range_max": 3195},
    "elbow_flex": {"id": 3, "drive_mode": 1, "homing_offset": 2047, "range_min": 901, "range_max": 3111},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": -2047, "range_min": 880, "range_max": 3226},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 3, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 1104, "range_min": 2016, "range_max": 3471},
}
RIGHT = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": 12, "range_min": 801, "range_max": 3290},
    "shoulder_lift": {"id": 2, "drive_mode": 1, "homing_offset": -40, "range_min": 700, "range_max": 3333},
    "elbow_flex": {"id": 3, "drive_mode": 0, "homing_offset": 900, "range_min": 1000, "range_max": 3001},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": 0, "range_min": 777, "range_max": 3100},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 0, "range_min": 2000, "range_max": 3000},
}
LENGTHS = (19, 13)


def lerobot_values(cal: dict[str, Any], ticks: np.ndarray, body: MotorNormMode) -> np.ndarray:
    """LeRobot 0.4.4's own normalisation of ``(n, 6)`` ticks of one arm, stored as float32."""
    motors = {
        name: Motor(mid, "sts3215", MotorNormMode.RANGE_0_100 if mode == "range_0_100" else body)
        for name, (mid, mode) in MOTORS.items()
    }
    calibration = {name: LeRobotCalibration(**entry) for name, entry in cal.items()}
    arm = FeetechMotorsBus(port="/dev/null-not-opened", motors=motors, calibration=calibration)
    rows = []
    for row in ticks:
        values = arm._normalize({mid: int(t) for mid, t in zip(range(1, 7), row, strict=True)})
        rows.append([values[mid] for mid in range(1, 7)])
    return np.asarray(rows, dtype=np.float64).astype(np.float32)


def random_ticks(cal: dict[str, Any], n: int, rng: np.random.Generator) -> np.ndarray:
    ticks = np.stack([rng.integers(c["range_min"], c["range_max"] + 1, n) for c in cal.values()], axis=1)
    ticks[0] = [c["range_min"] for c in cal.values()]
    ticks[1] = [c["range_max"] for c in cal.values()]
    return ticks


def two_arms(ticks: tuple[np.ndarray, np.ndarray], body: MotorNormMode) -> np.ndarray:
    return np.concatenate(
        [lerobot_values(LEFT, ticks[0], body), lerobot_values(RIGHT, ticks[1], body)], axis=1
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from hilrec.daemon.dataset.writer.lerobot_sink import LeRobotSink

    base = tmp_path_factory.mktemp("units2")
    rng = np.random.default_rng(21)
    ticks = [(random_ticks(LEFT, n, rng), random_ticks(RIGHT, n, rng)) for n in LENGTHS]
    root = base / "m100"
    sink = LeRobotSink.create(root, fps=25, features=so101_features(arms=2), robot_type=BIMANUAL_ROBOT_TYPE)
    for episode in ticks:
        for row in two_arms(episode, MotorNormMode.RANGE_M100_100):
            sink.add_frame({STATE_KEY: row, ACTION_KEY: row, "task": "handover"})
        sink.save_episode()
    sink.finalize()
    files = {}
    for side, cal in (("left", LEFT), ("right", RIGHT)):
        files[side] = base / f"bench_{side}.json"  # LeRobot's bi_so_follower names: <id>_left, <id>_right
        files[side].write_text(json.dumps(cal, indent=4))
    degrees = np.concatenate([two_arms(episode, MotorNormMode.DEGREES) for episode in ticks])
    return {"root": root, "base": base, "files": files, "degrees": degrees}


def columns(root: Path, key: str) -> np.ndarray:
    return np.concatenate([reader.read_episode(root, e)[key] for e in range(len(LENGTHS))])


def test_each_arm_converts_through_its_own_calibration(recorded: dict[str, Any]) -> None:
    files, out = recorded["files"], recorded["base"] / "degrees"
    argv = ["edit", "convert-units", str(recorded["root"]), "--to", "degrees", "--out", str(out)]
    assert main([*argv, "--calibration", str(files["left"]), str(files["right"])]) == 0
    state, action = columns(out, STATE_KEY), columns(out, ACTION_KEY)
    assert state.shape[1] == 12
    assert state.tobytes() == recorded["degrees"].tobytes()  # bit for bit, both arms, grippers included
    assert action.tobytes() == recorded["degrees"].tobytes()
    sidecar = load_dataset_sidecar(out)
    assert sidecar is not None
    assert sidecar["calibration"]["left"]["follower"]["elbow_flex"]["drive_mode"] == 1
    assert sidecar["calibration"]["right"]["follower"]["shoulder_lift"]["drive_mode"] == 1
    lined_up = align(out, out)
    assert lined_up.aligned and lined_up.a.units == BodyMode.DEGREES
    assert [row[0] for row in lined_up.ranges][:1] == ["left_shoulder_pan"]


def test_the_arms_swapped_or_one_file_for_two_arms_is_refused(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    files = recorded["files"]
    with pytest.raises(
        FlagError, match=r"--calibration: left arm: .*bench_right\.json is not the calibration"
    ):
        convert_units(
            recorded["root"],
            to=BodyMode.DEGREES,
            calibration=[files["right"], files["left"]],
            out=tmp_path / "swapped",
        )
    with pytest.raises(
        FlagError, match=r"1 file\(s\) given; the dataset has 2 arms: one file per arm, left first"
    ):
        convert_units(recorded["root"], to=BodyMode.DEGREES, calibration=files["left"], out=tmp_path / "one")
    assert not (tmp_path / "one").exists() and not (tmp_path / "swapped").exists()
