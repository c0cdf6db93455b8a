"""The two-arm columns are LeRobot 0.4.4's bi_so_follower's, read from its own classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hilrec.daemon.errors import FeatureSpecError
from hilrec.daemon.so101 import (
    BIMANUAL_ROBOT_TYPE,
    POSITION_NAMES,
    ROBOT_TYPE,
    arm_prefixes,
    arms_of,
    joint_names,
    position_names,
    robot_type,
    so101_features,
)
from hilrec.sim.features import check_measurable, sim_features


def lerobot_bimanual(tmp_path: Path) -> Any:
    from lerobot.cameras.opencv import OpenCVCameraConfig
    from lerobot.robots.bi_so_follower import BiSOFollower, BiSOFollowerConfig
    from lerobot.robots.so_follower import SOFollowerConfig

    camera = OpenCVCameraConfig(index_or_path=0, fps=25, width=640, height=480)
    config = BiSOFollowerConfig(
        id="bench",
        calibration_dir=tmp_path,
        left_arm_config=SOFollowerConfig(port="/dev/null", use_degrees=True, cameras={"wrist": camera}),
        right_arm_config=SOFollowerConfig(port="/dev/null", use_degrees=True),
    )
    return BiSOFollower(config)  # constructing opens no port


def test_two_arm_features_are_lerobots_bi_so_follower_features(tmp_path: Path) -> None:
    from lerobot.datasets.utils import hw_to_dataset_features

    robot = lerobot_bimanual(tmp_path)
    theirs = {
        **hw_to_dataset_features(robot.action_features, "action"),
        **hw_to_dataset_features(robot.observation_features, "observation"),
    }
    ours = so101_features({"left_wrist": (480, 640)}, arms=2)
    assert list(ours) == ["action", "observation.state", "observation.images.left_wrist"]
    for key, spec in theirs.items():
        assert ours[key]["dtype"] == spec["dtype"], key
        assert list(ours[key]["shape"]) == list(spec["shape"]), key
        assert ours[key]["names"] == spec["names"], key
    assert robot_type(2) == robot.name == BIMANUAL_ROBOT_TYPE


def test_one_arm_naming_is_unchanged() -> None:
    assert arm_prefixes() == ("",)
    assert position_names() == POSITION_NAMES
    assert so101_features({"front": (4, 6)})["action"]["names"] == POSITION_NAMES
    assert robot_type() == ROBOT_TYPE == "so_follower"
    assert joint_names(2)[0] == "left_shoulder_pan" and joint_names(2)[-1] == "right_gripper"
    assert arms_of(position_names(2)) == 2 and arms_of(POSITION_NAMES) == 1 and arms_of(["x"]) is None
    with pytest.raises(ValueError, match="1 or 2 arms"):
        arm_prefixes(3)


def test_sim_features_check_the_arm_count_they_were_asked_for() -> None:
    two = sim_features({"front": (4, 6)}, arms=2)
    assert two["observation.state"]["shape"] == [12]
    check_measurable(two, arms=2)
    with pytest.raises(FeatureSpecError, match=r"columns of 2 arm\(s\)"):
        check_measurable(two)  # 12 columns where one arm's six are expected
    with pytest.raises(FeatureSpecError, match="bi_so_follower"):
        check_measurable(sim_features({}), arms=2)
