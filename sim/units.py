"""Twin joint angles <-> LeRobot SO-101 units, defined through servo ticks.

A dataset column must mean the same thing whether the twin or a real arm wrote it, so the twin
converts the way a real STS3215 would be read by LeRobot (``use_degrees=True``):

- a servo at angle ``rad`` from its calibrated middle reads ``rad * TICKS_PER_RAD`` ticks from it;
- body joints are DEGREES: ``deg = ticks_from_mid * 360 / 4095`` (LeRobot divides by the
  resolution minus one), i.e. ``deg = rad * 4096 / 4095 * 180 / pi``;
- the gripper is RANGE_0_100 over its sim joint range ``[lo, hi]``, which spans
  ``span_ticks = round((hi - lo) * TICKS_PER_RAD)``: ``units = (rad - lo) * TICKS_PER_RAD /
  span_ticks * 100``, 0 closed (``lo``), 100 open (``hi``).

:func:`emulated_calibration` is the LeRobot calibration of an arm built this way; an emulated
servo's Present_Position for a twin angle (:func:`present_position`), normalised with LeRobot's
formulas and that calibration, gives back exactly these units (tested against LeRobot's code).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import SimError
from hilrec.daemon.so101 import JOINT_NAMES, MAX_TICK, MOTORS, NUM_JOINTS, TICKS_PER_TURN

TICKS_PER_RAD: Final[float] = TICKS_PER_TURN / (2 * math.pi)
MID_TICKS: Final[int] = 2047  # Present_Position at the calibrated middle
SIM_ZERO_RAW_TICKS: Final[int] = 2048  # the emulated encoder's raw reading at sim angle 0
DEG_PER_RAD: Final[float] = TICKS_PER_RAD * 360 / MAX_TICK
GRIPPER_INDEX: Final[int] = JOINT_NAMES.index("gripper")
# LeRobot's calibration records no range for wrist_roll (a full turn): it always writes 0..4095,
# whose middle is 2047.5, half a tick from MID_TICKS; its zero is that half tick off sim angle 0.
FULL_TURN_INDEX: Final[int] = JOINT_NAMES.index("wrist_roll")
FULL_TURN_RANGE: Final[tuple[int, int]] = (0, MAX_TICK)


@dataclass(frozen=True, kw_only=True)
class UnitsMap:
    """The per-joint affine maps ``units = scale * (rad - offset)`` and their sim ranges."""

    joint_ranges: tuple[tuple[float, float], ...]  # sim joint limits (rad), in JOINT_NAMES order
    gripper_span_ticks: int

    @functools.cached_property
    def scale(self) -> np.ndarray:
        """Units per radian, per joint (read-only)."""
        scale = np.full(NUM_JOINTS, DEG_PER_RAD)
        scale[GRIPPER_INDEX] = TICKS_PER_RAD / self.gripper_span_ticks * 100
        scale.flags.writeable = False
        return scale

    @functools.cached_property
    def offset(self) -> np.ndarray:
        """The angle (rad) at which each joint reads 0 units (read-only)."""
        offset = np.zeros(NUM_JOINTS)
        offset[GRIPPER_INDEX] = self.joint_ranges[GRIPPER_INDEX][0]
        offset[FULL_TURN_INDEX] = (sum(FULL_TURN_RANGE) / 2 - MID_TICKS) / TICKS_PER_RAD
        offset.flags.writeable = False
        return offset

    def units_from_rad(self, rad: np.ndarray) -> np.ndarray:
        """Sim joint angles (6,) or (n, 6) -> LeRobot units, float64 (cast by the caller)."""
        return (np.asarray(rad, dtype=np.float64) - self.offset) * self.scale

    def rad_from_units(self, units: np.ndarray) -> np.ndarray:
        return np.asarray(units, dtype=np.float64) / self.scale + self.offset

    def units_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """The sim joint ranges in units (float64)."""
        low = self.units_from_rad(np.array([lo for lo, _ in self.joint_ranges]))
        high = self.units_from_rad(np.array([hi for _, hi in self.joint_ranges]))
        return low, high


def units_map_from_ranges(joint_ranges: dict[str, tuple[float, float]]) -> UnitsMap:
    missing = [name for name in JOINT_NAMES if name not in joint_ranges]
    if missing:
        raise SimError(f"the model has no joint range for {', '.join(missing)}")
    ranges = tuple((float(joint_ranges[n][0]), float(joint_ranges[n][1])) for n in JOINT_NAMES)
    lo, hi = ranges[GRIPPER_INDEX]
    if not hi > lo:
        raise SimError(f"gripper joint range [{lo}, {hi}] is empty")
    return UnitsMap(joint_ranges=ranges, gripper_span_ticks=round((hi - lo) * TICKS_PER_RAD))


@functools.lru_cache(maxsize=1)
def default_units_map() -> UnitsMap:
    """The map for the packaged SO-101 model (joint ranges read from the compiled MJCF)."""
    from hilrec.sim.scene import SceneConfig, compile_scene

    model = compile_scene(SceneConfig(), "none")
    return units_map_from_ranges({name: tuple(model.joint(name).range) for name in JOINT_NAMES})


def _body_half_range_ticks(low: float, high: float) -> int:
    return min(MID_TICKS, math.ceil(max(abs(low), abs(high)) * TICKS_PER_RAD))


def emulated_calibration(units_map: UnitsMap | None = None) -> dict[str, dict[str, int]]:
    """LeRobot-format calibration of an SO-101 whose servos read the twin's angles.

    Body joints: symmetric range ``2047 +/- h`` (h covers the sim joint range), so the sim zero
    pose reads 2047 = the calibrated middle = 0 deg; wrist_roll, like every LeRobot calibration,
    0..4095 (its zero is half a tick off, in the units map too). Gripper: ``range_min = 2047 - span // 2``,
    ``range_max = range_min + span``, with ``range_min`` at the sim lower limit (closed).
    ``homing_offset`` (Present = Actual - Homing_Offset) makes the raw encoder read 2048 at the
    sim zero angle for every joint.
    """
    umap = units_map or default_units_map()
    calibration: dict[str, dict[str, int]] = {}
    for index, name in enumerate(JOINT_NAMES):
        low, high = umap.joint_ranges[index]
        if index == GRIPPER_INDEX:
            range_min = MID_TICKS - umap.gripper_span_ticks // 2
            range_max = range_min + umap.gripper_span_ticks
        elif index == FULL_TURN_INDEX:
            range_min, range_max = FULL_TURN_RANGE
        else:
            half = _body_half_range_ticks(low, high)
            range_min, range_max = MID_TICKS - half, MID_TICKS + half
        calibration[name] = {
            "id": MOTORS[name][0],
            "drive_mode": 0,
            "homing_offset": SIM_ZERO_RAW_TICKS - round(_present(umap, index, 0.0, range_min)),
            "range_min": range_min,
            "range_max": range_max,
        }
    return calibration


def _present(umap: UnitsMap, index: int, rad: float, range_min: int) -> float:
    if index == GRIPPER_INDEX:
        return range_min + (rad - umap.joint_ranges[index][0]) * TICKS_PER_RAD
    return MID_TICKS + rad * TICKS_PER_RAD


def present_position(joint: str, rad: float, units_map: UnitsMap | None = None) -> float:
    """Present_Position (ticks, unrounded) an emulated servo reads at sim angle ``rad``.

    A real register holds an integer: round it. For angles on the tick grid the rounding is
    exact and LeRobot's normalisation of the result equals :meth:`UnitsMap.units_from_rad`.
    """
    umap = units_map or default_units_map()
    index = _joint_index(joint)
    range_min = emulated_calibration(umap)[joint]["range_min"]
    return _present(umap, index, rad, range_min)


def angle_from_present_position(joint: str, ticks: float, units_map: UnitsMap | None = None) -> float:
    """Inverse of :func:`present_position`: the sim angle (rad) a Present_Position stands for."""
    umap = units_map or default_units_map()
    index = _joint_index(joint)
    if index == GRIPPER_INDEX:
        range_min = emulated_calibration(umap)[joint]["range_min"]
        return umap.joint_ranges[index][0] + (ticks - range_min) / TICKS_PER_RAD
    return (ticks - MID_TICKS) / TICKS_PER_RAD


def _joint_index(joint: str) -> int:
    try:
        return JOINT_NAMES.index(joint)
    except ValueError:
        raise SimError(f"unknown joint '{joint}' (joints: {', '.join(JOINT_NAMES)})") from None


def units_mapping(units_map: UnitsMap | None = None) -> dict[str, Any]:
    """The conversion as data, written beside every sim dataset (hilrec/dataset.json)."""
    umap = units_map or default_units_map()
    scale, offset = umap.scale, umap.offset
    joints = {}
    for index, name in enumerate(JOINT_NAMES):
        mode = MOTORS[name][1]
        joints[name] = {
            "column": f"{name}.pos",
            "sim_joint": name,
            "norm_mode": mode,
            "unit": "deg" if mode == "degrees" else "percent_0_100",
            "sim_range_rad": list(umap.joint_ranges[index]),
            "units_per_rad": float(scale[index]),
            "rad_at_zero_units": float(offset[index]),
            "formula": ("units = (rad - rad_at_zero_units) * units_per_rad"),
        }
    return {
        "convention": "lerobot_so101_use_degrees_true",
        "ticks_per_rad": TICKS_PER_RAD,
        "degrees_formula": "deg = rad * ticks_per_rad * 360 / 4095",
        "gripper_formula": "units = (rad - lo) * ticks_per_rad / span_ticks * 100, 0 = closed",
        "gripper_span_ticks": umap.gripper_span_ticks,
        "dtype": "float32",
        "joints": joints,
        "emulated_calibration": emulated_calibration(umap),
    }
