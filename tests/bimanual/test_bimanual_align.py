"""hilrec align: a hilrec two-arm dataset against one LeRobot 0.4.4's bi_so_follower wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY, BodyMode, joint_names
from hilrec.daemon.tools.align import align

SIZE = (48, 64)  # (height, width)


@pytest.fixture(scope="module")
def hilrec_two_arm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("align2") / "sim"
    argv = ["record", "--sim", "--arms", "2", "--episodes", "1", "--cameras", "left_wrist"]
    assert main([*argv, "--size", "64x48", "--root", str(root), "--no-progress"]) == 0
    return root


def lerobot_written(root: Path, values: np.ndarray, *, arms: int = 2) -> Path:
    """A dataset as ``lerobot-record --robot.type=bi_so_follower`` writes one: the features from
    the robot class itself, a wrist camera on the left arm, no hilrec sidecar."""
    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.utils import hw_to_dataset_features
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower import SOFollower, SOFollowerConfig, SOFollowerRobotConfig

    camera = {"wrist": OpenCVCameraConfig(index_or_path=0, fps=25, width=SIZE[1], height=SIZE[0])}
    calibration = root.parent / f"{root.name}-calibration"
    robot: Any
    if arms == 2:
        robot = BiSOFollower(
            BiSOFollowerConfig(
                id="bench",
                calibration_dir=calibration,
                left_arm_config=SOFollowerConfig(port="/dev/null", use_degrees=True, cameras=camera),
                right_arm_config=SOFollowerConfig(port="/dev/null", use_degrees=True),
            )
        )
    else:
        robot = SOFollower(
            SOFollowerRobotConfig(
                id="bench", calibration_dir=calibration, port="/dev/null", use_degrees=True, cameras=camera
            )
        )
    features = {
        **hw_to_dataset_features(robot.action_features, "action"),
        **hw_to_dataset_features(robot.observation_features, "observation"),
    }
    dataset = LeRobotDataset.create(
        f"lerobot/{root.name}", fps=25, features=features, root=root, robot_type=robot.name
    )
    camera_key = next(k for k in features if k.startswith("observation.images."))
    image = np.zeros((*SIZE, 3), np.uint8)
    for row in values:
        dataset.add_frame({STATE_KEY: row, ACTION_KEY: row, camera_key: image, "task": "handover"})
    dataset.save_episode()
    dataset.finalize()
    return root


def sweep(amplitude: float, arms: int = 2, n: int = 20) -> np.ndarray:
    t = np.linspace(-1, 1, n, dtype=np.float32)[:, None]
    arm = np.concatenate([amplitude * t * np.ones((1, 5), np.float32), 50 + 40 * t], axis=1)
    return np.tile(arm, (1, arms)).astype(np.float32)


@pytest.mark.slow
def test_a_two_arm_recording_lines_up_with_lerobots_bi_so_follower(
    hilrec_two_arm: Path, tmp_path: Path
) -> None:
    real = lerobot_written(tmp_path / "real", sweep(120.0))  # passes 100: degrees, inferred
    result = align(hilrec_two_arm, real)
    assert result.aligned, result.format_text()
    assert [joint for joint, *_ in result.ranges] == list(joint_names(2))
    rows = {what: (a, b) for what, a, b, _ in result.rows}
    assert rows["robot_type"] == ("bi_so_follower", "bi_so_follower")
    assert rows["cameras"][0] == rows["cameras"][1]
    assert "observation.images.left_wrist" in result.a.info["features"]
    assert "observation.images.left_wrist" in result.b.info["features"]
    assert "left_gripper" in result.format_text() and "right_shoulder_pan" in result.format_text()


@pytest.mark.slow
def test_a_one_arm_dataset_does_not_line_up_with_a_two_arm_one(hilrec_two_arm: Path, tmp_path: Path) -> None:
    one = lerobot_written(tmp_path / "one", sweep(120.0, arms=1), arms=1)
    result = align(hilrec_two_arm, one)
    assert not result.aligned
    differing = {what for what, _, _, same in result.rows if not same}
    assert {"robot_type", f"{STATE_KEY} shape", f"{STATE_KEY} names", f"{ACTION_KEY} shape"} <= differing
    assert result.ranges[0][0] == "left_shoulder_pan/shoulder_pan"
    assert main(["align", str(hilrec_two_arm), str(one)]) == 1


def test_range_m100_100_arms_convert_each_with_its_own_calibration(
    hilrec_two_arm: Path, tmp_path: Path
) -> None:
    from hilrec.drivers.calibration import ArmCalibration, MotorCalibration, save_calibration
    from hilrec.sim.units import emulated_calibration

    entries = emulated_calibration()
    left = ArmCalibration({name: MotorCalibration(**entry) for name, entry in entries.items()})
    wide = {**entries["shoulder_pan"], "range_min": 1047, "range_max": 3047}  # a wider right pan
    right = ArmCalibration({**left.motors, "shoulder_pan": MotorCalibration(**wide)})
    paths = [tmp_path / "left.json", tmp_path / "right.json"]
    for cal, path in zip((left, right), paths, strict=True):
        save_calibration(cal, path)
    m100 = lerobot_written(tmp_path / "m100", sweep(90.0))
    units = (None, BodyMode.RANGE_M100_100)
    one_file = align(hilrec_two_arm, m100, units=units, calibrations=(None, paths[:1]))
    assert any("once per arm, left first" in fix for fix in one_file.fixes)
    assert any("convert-units ROOT --to degrees --calibration LEFT RIGHT" in fix for fix in one_file.fixes)
    converted = align(hilrec_two_arm, m100, units=units, calibrations=(None, paths))
    ranges = {joint: b for joint, _, b, _ in converted.ranges}
    for joint, cal in (("left_shoulder_pan", left), ("right_shoulder_pan", right)):
        pan = cal.motors["shoulder_pan"]
        expected = 0.9 * (pan.range_max - pan.range_min) / 2 * 360 / 4095
        low, high = (float(x) for x in ranges[joint].split(" .. "))
        assert high == pytest.approx(expected, abs=0.2) and low == pytest.approx(-expected, abs=0.2), joint
