"""SO-101 calibration: LeRobot's JSON file, where LeRobot keeps it, and its normalisation maths.

A calibration maps raw servo ticks (Present_Position, i.e. after the servo subtracted its
Homing_Offset) to the dataset's units and back. The formulas, their operation order and their
integer truncation are LeRobot's (``SerialMotorsBus._normalize`` / ``_unnormalize`` with
``apply_drive_mode=True`` for Feetech), so the same ticks give bit-identical float64 values here
and in LeRobot; tests compare the two on the same inputs.

- DEGREES: ``(ticks - (min + max) / 2) * 360 / 4095``; not clamped; drive_mode is ignored.
- RANGE_0_100: ``(clip(ticks) - min) / (max - min) * 100``; drive_mode mirrors it (100 - x).
- RANGE_M100_100: ``(clip(ticks) - min) / (max - min) * 200 - 100``; drive_mode negates it.

The file is ``{joint: {id, drive_mode, homing_offset, range_min, range_max}}`` written with
``indent=4`` and no trailing newline, byte for byte what LeRobot's ``_save_calibration`` writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from hilrec.daemon.atomic import atomic_write_bytes, temp_path
from hilrec.daemon.errors import CalibrationError
from hilrec.daemon.so101 import ARM_SIDES, JOINT_NAMES, MAX_TICK, MOTORS, BodyMode, NormMode, Role

HALF_TURN: Final[int] = MAX_TICK // 2  # 2047: where set_half_turn_homings puts the present pose
HOMING_OFFSET_LIMIT: Final[int] = 2047  # sign-magnitude, sign at bit 11
FULL_TURN_JOINT: Final[str] = "wrist_roll"  # LeRobot records no range for it: 0..4095

# LeRobot 0.4.4: Robot.name / Teleoperator.name of the SO-100/101 classes.
_LEROBOT_SUBDIR: Final[dict[Role, tuple[str, str]]] = {
    Role.FOLLOWER: ("robots", "so_follower"),
    Role.LEADER: ("teleoperators", "so_leader"),
}
# The arm ids hilrec uses unless told otherwise: `hilrec calibrate ROLE` writes <id>.json and the
# daemon (configs/hil.toml follower.id / leader.id) reads it. The one source of these defaults.
DEFAULT_ARM_IDS: Final[dict[Role, str]] = {Role.FOLLOWER: "so101_follower", Role.LEADER: "so101_leader"}
_FIELDS: Final[tuple[str, ...]] = ("id", "drive_mode", "homing_offset", "range_min", "range_max")


@dataclass(frozen=True, kw_only=True)
class MotorCalibration:
    """One motor's entry of a LeRobot calibration file."""

    id: int
    drive_mode: int
    homing_offset: int
    range_min: int
    range_max: int

    @property
    def mid(self) -> float:
        return (self.range_min + self.range_max) / 2

    def check(self, joint: str, source: str) -> None:
        where = f"{source}: joint '{joint}'"
        if self.drive_mode not in (0, 1):
            raise CalibrationError(f"{where}: drive_mode must be 0 or 1, got {self.drive_mode}")
        if abs(self.homing_offset) > HOMING_OFFSET_LIMIT:
            raise CalibrationError(
                f"{where}: homing_offset {self.homing_offset} exceeds the register's +-{HOMING_OFFSET_LIMIT}"
            )
        for name in ("range_min", "range_max"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_TICK:
                raise CalibrationError(f"{where}: {name} {value} is outside 0..{MAX_TICK}")
        if self.range_min >= self.range_max:
            raise CalibrationError(
                f"{where}: range_min {self.range_min} must be below range_max {self.range_max}"
            )


# --- the maths (scalars, LeRobot's operation order) ----------------------------------------------


def ticks_to_units(ticks: int | float, cal: MotorCalibration, mode: NormMode) -> float:
    """Present_Position ticks -> dataset units (float64, as LeRobot computes it)."""
    min_, max_ = cal.range_min, cal.range_max
    if mode == "degrees":
        return (ticks - (min_ + max_) / 2) * 360 / MAX_TICK
    bounded = min(max_, max(min_, ticks))
    if mode == "range_0_100":
        norm = ((bounded - min_) / (max_ - min_)) * 100
        return 100 - norm if cal.drive_mode else norm
    if mode == "range_m100_100":
        norm = (((bounded - min_) / (max_ - min_)) * 200) - 100
        return -norm if cal.drive_mode else norm
    raise CalibrationError(f"unknown normalisation mode {mode!r}")


def units_to_ticks(value: float, cal: MotorCalibration, mode: NormMode) -> int:
    """Dataset units -> Goal_Position ticks, truncated toward zero like LeRobot's ``int()``.

    Callers that record what they command must pass the float32 value they record (as a Python
    float): the truncation then happens on exactly the number in the file.
    """
    if not math.isfinite(value):
        raise CalibrationError(f"servo id {cal.id}: cannot command a non-finite goal {value!r}")
    min_, max_ = cal.range_min, cal.range_max
    if mode == "degrees":
        return int((value * MAX_TICK / 360) + (min_ + max_) / 2)
    if mode == "range_0_100":
        value = 100 - value if cal.drive_mode else value
        bounded = min(100.0, max(0.0, value))
        return int((bounded / 100) * (max_ - min_) + min_)
    if mode == "range_m100_100":
        value = -value if cal.drive_mode else value
        bounded = min(100.0, max(-100.0, value))
        return int(((bounded + 100) / 200) * (max_ - min_) + min_)
    raise CalibrationError(f"unknown normalisation mode {mode!r}")


def half_turn_homing(present_ticks: int) -> int:
    """The Homing_Offset that makes the current pose read 2047 (``Present = Actual - Offset``).

    ``present_ticks`` must be read with the offset at 0, as LeRobot's ``set_half_turn_homings``
    does after ``reset_calibration``.
    """
    offset = present_ticks - HALF_TURN
    if abs(offset) > HOMING_OFFSET_LIMIT:
        raise CalibrationError(
            f"present position {present_ticks} gives homing offset {offset}, beyond the "
            f"register's +-{HOMING_OFFSET_LIMIT}; move the joint away from the encoder seam"
        )
    return offset


# --- a whole arm -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmCalibration(Mapping[str, MotorCalibration]):
    """The six motors' calibrations, in SO-101 joint order, with their normalisation modes."""

    motors: Mapping[str, MotorCalibration]
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        names = tuple(self.motors)
        if set(names) != set(JOINT_NAMES):
            missing = sorted(set(JOINT_NAMES) - set(names))
            extra = sorted(set(names) - set(JOINT_NAMES))
            raise CalibrationError(
                f"{self.source}: calibration joints do not match the SO-101 "
                f"(missing {missing}, unexpected {extra})"
            )
        ordered = {name: self.motors[name] for name in JOINT_NAMES}
        object.__setattr__(self, "motors", ordered)
        for name, cal in ordered.items():
            expected_id = MOTORS[name][0]
            if cal.id != expected_id:
                raise CalibrationError(
                    f"{self.source}: joint '{name}' has id {cal.id}, the SO-101 wires it as id {expected_id}"
                )
            cal.check(name, self.source)

    def __getitem__(self, joint: str) -> MotorCalibration:
        return self.motors[joint]

    def __iter__(self) -> Iterator[str]:
        return iter(self.motors)

    def __len__(self) -> int:
        return len(self.motors)

    def to_json(self) -> str:
        """The file content, byte-identical to LeRobot's draccus dump (indent 4, no newline)."""
        return json.dumps({name: asdict(cal) for name, cal in self.motors.items()}, indent=4)

    @classmethod
    def from_mapping(cls, data: object, *, source: str = "<memory>") -> ArmCalibration:
        if not isinstance(data, Mapping):
            raise CalibrationError(f"{source}: expected a JSON object of joints, got {type(data).__name__}")
        motors: dict[str, MotorCalibration] = {}
        for joint, entry in data.items():
            if not isinstance(entry, Mapping):
                raise CalibrationError(f"{source}: joint '{joint}' must be an object")
            unknown = sorted(set(entry) - set(_FIELDS))
            missing = [f for f in _FIELDS if f not in entry]
            if unknown or missing:
                raise CalibrationError(
                    f"{source}: joint '{joint}': missing fields {missing}, unknown fields {unknown}"
                )
            for name in _FIELDS:
                value = entry[name]
                if isinstance(value, bool) or not isinstance(value, int):
                    raise CalibrationError(
                        f"{source}: joint '{joint}': {name} must be an integer, got {value!r}"
                    )
            motors[str(joint)] = MotorCalibration(**{f: int(entry[f]) for f in _FIELDS})
        return cls(motors, source)

    def modes(self, body_mode: BodyMode | NormMode = BodyMode.DEGREES) -> tuple[NormMode, ...]:
        """Per joint normalisation: ``body_mode`` for body joints, RANGE_0_100 for the gripper."""
        body = NormMode(body_mode)  # BodyMode's values are NormMode's
        return tuple(
            mode if mode == NormMode.RANGE_0_100 else body
            for _, mode in (MOTORS[name] for name in self.motors)
        )

    def ticks_to_units(
        self, ticks: Sequence[int], body_mode: BodyMode | NormMode = BodyMode.DEGREES
    ) -> np.ndarray:
        """Six Present_Position values (joint order) -> float64 units, exactly LeRobot's."""
        return np.array(
            [
                ticks_to_units(int(t), cal, mode)
                for t, cal, mode in zip(ticks, self.motors.values(), self.modes(body_mode), strict=True)
            ],
            dtype=np.float64,
        )

    def units_to_ticks(
        self, units: Sequence[float], body_mode: BodyMode | NormMode = BodyMode.DEGREES
    ) -> list[int]:
        """Six unit values (joint order) -> Goal_Position ticks, LeRobot's truncation."""
        return [
            units_to_ticks(float(u), cal, mode)
            for u, cal, mode in zip(units, self.motors.values(), self.modes(body_mode), strict=True)
        ]


# --- files -------------------------------------------------------------------------------------


def lerobot_calibration_root() -> Path:
    """LeRobot's calibration directory, resolved from the same variables in the same order."""
    explicit = os.environ.get("HF_LEROBOT_CALIBRATION")
    if explicit:
        return Path(explicit).expanduser()
    lerobot_home = os.environ.get("HF_LEROBOT_HOME")
    if lerobot_home:
        return Path(lerobot_home).expanduser() / "calibration"
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(hf_home).expanduser() / "lerobot" / "calibration"


def lerobot_calibration_path(role: Role, arm_id: str, root: Path | None = None) -> Path:
    """Where LeRobot 0.4.4 reads and writes the calibration of SO follower/leader ``arm_id``."""
    kind, name = _LEROBOT_SUBDIR[role]
    return (root or lerobot_calibration_root()) / kind / name / f"{_checked_id(arm_id)}.json"


def _checked_id(arm_id: str) -> str:
    if not arm_id or "/" in arm_id or arm_id in (".", ".."):
        raise CalibrationError(f"arm id {arm_id!r} is not usable as a file name")
    return arm_id


def load_calibration(path: str | os.PathLike[str]) -> ArmCalibration:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(f"{path}: no calibration file (run `hilrec calibrate` first)") from None
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON: {exc}") from exc
    return ArmCalibration.from_mapping(data, source=str(path))


def default_arm_id(role: Role | str, arm: str | None = None) -> str:
    """The id hilrec calibrates ``role`` under; with ``arm`` (left/right), that arm's of a pair."""
    base = DEFAULT_ARM_IDS[Role(role)]
    return base if arm is None else arm_calibration_id(base, arm)


def arm_calibration_id(base_id: str, arm: str) -> str:
    """The calibration id of one side of a two-arm bench whose id is ``base_id``: LeRobot 0.4.4's
    BiSOFollower / BiSOLeader give each side ``<id>_left`` / ``<id>_right``, in the one-arm
    directory (robots/so_follower, teleoperators/so_leader), so a pair calibrated by either tool
    is found by the other."""
    if arm not in ARM_SIDES:
        raise CalibrationError(f"arm {arm!r} is not one of {', '.join(ARM_SIDES)}")
    return f"{base_id}_{arm}"


def calibration_output(path: str | os.PathLike[str], arm_id: str) -> Path:
    """Where a calibration asked to go to ``path`` is written: a folder (an existing one, or a
    path ending in a slash) gets ``<folder>/<arm_id>.json`` as LeRobot's ``calibration_dir`` does;
    anything else is the file itself. Checked *before* an arm is touched: the folder must be
    creatable and writable, and the file must not be a folder. Raises CalibrationError."""
    text = os.fspath(path)
    target = Path(text).expanduser()
    if target.is_dir() or text.endswith(("/", os.sep)):
        target = target / f"{_checked_id(arm_id)}.json"
    if target.is_dir():
        raise CalibrationError(f"{target}: is a folder, cannot write the calibration file there")
    folder = target.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CalibrationError(f"{target}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CalibrationError(f"{target}: cannot write in {existing}")
    return target


def save_calibration(calibration: ArmCalibration, path: str | os.PathLike[str]) -> Path:
    """Write durably (temp file, fsync, rename) so a crash never leaves half a calibration; a
    failed write leaves no temp file behind."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, calibration.to_json().encode("utf-8"))
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp_path(path).unlink(missing_ok=True)
        raise CalibrationError(f"{path}: cannot write the calibration: {exc}") from exc
    return path
