"""What an SO-101 arm is, as data: its motors, their ids, and the dataset columns they make.

Names, order, dtype and units follow LeRobot's SO-101 follower/leader with ``use_degrees=True``
(LeRobot >= 0.4.4): body joints in DEGREES (0 at the calibrated mid-range), the gripper in
RANGE_0_100. Both the drivers and the MuJoCo twin produce columns through this table, so a sim
column and a real column mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final


class NormMode(StrEnum):
    """How a joint's ticks become dataset units (LeRobot's ``MotorNormMode`` values)."""

    DEGREES = "degrees"
    RANGE_0_100 = "range_0_100"
    RANGE_M100_100 = "range_m100_100"


class BodyMode(StrEnum):
    """The units of the five body joints; the gripper is always RANGE_0_100."""

    DEGREES = "degrees"  # LeRobot use_degrees=True
    RANGE_M100_100 = "range_m100_100"


class Role(StrEnum):
    """Which arm of the pair: the follower is commanded, the leader only read."""

    FOLLOWER = "follower"
    LEADER = "leader"


# motor name -> (servo id, normalisation mode). Order is the column order.
MOTORS: Final[dict[str, tuple[int, NormMode]]] = {
    "shoulder_pan": (1, NormMode.DEGREES),
    "shoulder_lift": (2, NormMode.DEGREES),
    "elbow_flex": (3, NormMode.DEGREES),
    "wrist_flex": (4, NormMode.DEGREES),
    "wrist_roll": (5, NormMode.DEGREES),
    "gripper": (6, NormMode.RANGE_0_100),
}
JOINT_NAMES: Final[tuple[str, ...]] = tuple(MOTORS)
MOTOR_IDS: Final[tuple[int, ...]] = tuple(mid for mid, _ in MOTORS.values())
POSITION_NAMES: Final[list[str]] = [f"{name}.pos" for name in JOINT_NAMES]
NUM_JOINTS: Final[int] = len(JOINT_NAMES)

# The STS3215's encoder: ticks per turn, and the highest tick, LeRobot's ``max_res`` (the divisor
# of its DEGREES formula, so a degree is 4096/4095 of a servo's own degree).
TICKS_PER_TURN: Final[int] = 4096
MAX_TICK: Final[int] = TICKS_PER_TURN - 1

ROBOT_TYPE: Final[str] = "so_follower"  # LeRobot >= 0.4.3 robot.name for SO-100/SO-101 followers
# Two arms, as LeRobot 0.4.4's BiSOFollower / BiSOLeader name them: every motor (and every camera
# an arm carries) prefixed with its side, left first.
BIMANUAL_ROBOT_TYPE: Final[str] = "bi_so_follower"
ARM_SIDES: Final[tuple[str, ...]] = ("left", "right")
# Every robot_type LeRobot has written for this arm: its 0.3 datasets say so100_follower or
# so101_follower (the robot.name of two classes then), 0.4 merged them into one SOFollower
# class (both config names are still registered as aliases of it).
ROBOT_TYPE_SPELLINGS: Final[frozenset[str]] = frozenset({ROBOT_TYPE, "so100_follower", "so101_follower"})

ACTION_KEY: Final[str] = "action"
STATE_KEY: Final[str] = "observation.state"
IMAGE_PREFIX: Final[str] = "observation.images."


def arm_prefixes(arms: int = 1) -> tuple[str, ...]:
    """The column prefix of each arm: ``("",)`` for one arm, ``("left_", "right_")`` for two."""
    if arms == 1:
        return ("",)
    if arms == len(ARM_SIDES):
        return tuple(f"{side}_" for side in ARM_SIDES)
    raise ValueError(f"an SO-101 bench has 1 or {len(ARM_SIDES)} arms, not {arms}")


def joint_names(arms: int = 1) -> tuple[str, ...]:
    """Every motor of ``arms`` arms in column order: ``left_shoulder_pan ... right_gripper``."""
    return tuple(prefix + name for prefix in arm_prefixes(arms) for name in JOINT_NAMES)


def position_names(arms: int = 1) -> list[str]:
    return [f"{name}.pos" for name in joint_names(arms)]


def robot_type(arms: int = 1) -> str:
    return ROBOT_TYPE if arms == 1 else BIMANUAL_ROBOT_TYPE


def arms_of(names: list[str] | tuple[str, ...]) -> int | None:
    """How many arms a feature's ``names`` stand for (1 or 2), or None if they are neither."""
    for arms in (1, len(ARM_SIDES)):
        if list(names) == position_names(arms):
            return arms
    return None


def position_feature(arms: int = 1) -> dict[str, Any]:
    names = position_names(arms)
    return {"dtype": "float32", "shape": [len(names)], "names": names}


def camera_feature(height: int, width: int, *, video: bool = True) -> dict[str, Any]:
    return {
        "dtype": "video" if video else "image",
        "shape": [height, width, 3],
        "names": ["height", "width", "channels"],
    }


def so101_features(
    cameras: Mapping[str, tuple[int, int]] | None = None, *, video: bool = True, arms: int = 1
) -> dict[str, dict[str, Any]]:
    """The dataset features of SO-101 followers teleoperated by leaders, as LeRobot builds them
    (``arms=2``: its ``bi_so_follower``, 12 columns, left arm first).

    ``cameras`` maps a camera name to its (height, width).
    """
    features: dict[str, dict[str, Any]] = {
        ACTION_KEY: position_feature(arms),
        STATE_KEY: position_feature(arms),
    }
    for name, (height, width) in (cameras or {}).items():
        features[IMAGE_PREFIX + name] = camera_feature(height, width, video=video)
    return features


def arm_groups(count: int) -> tuple[tuple[str | None, slice], ...] | None:
    """Which of a ``count``-joint vector's values are which arm's, for showing each arm apart:
    six, one arm, ``((None, 0:6),)``; twelve, ``(("left", 0:6), ("right", 6:12))`` in
    :func:`joint_names` order; None for any other count."""
    if count == NUM_JOINTS:
        return ((None, slice(0, NUM_JOINTS)),)
    if count == NUM_JOINTS * len(ARM_SIDES):
        return tuple((side, slice(k * NUM_JOINTS, (k + 1) * NUM_JOINTS)) for k, side in enumerate(ARM_SIDES))
    return None
