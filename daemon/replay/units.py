"""What the numbers in a dataset's ``action`` / ``observation.state`` columns mean, for the replay.

The twin speaks LeRobot's ``use_degrees=True`` units: body joints in degrees from the calibrated
mid-range, the gripper in 0..100. A dataset says which units it holds in its hilrec sidecar
(``hilrec/dataset.json``, written by hilrec's recorders). A dataset written by another recorder
(LeRobot's own) has no such file, so the person running the check says it with flags:

- ``--units degrees``: the columns are already the twin's units; nothing else is needed, because
  LeRobot's DEGREES is relative to the mid-range of whatever calibration the arm had.
- ``--units m100_100``: body joints in -100..100 across each joint's calibrated range
  (LeRobot's ``use_degrees=False``); turning that into an angle needs the range width, so the
  arm's LeRobot calibration file is required (``--calibration FILE``).

With neither the sidecar nor ``--units`` the columns' meaning is unknown, and every episode is
reported not replayable with that reason, never guessed from the values.

A flag given for a dataset that does have the sidecar overrides it, and the report says so.

What the mapping assumes of a real arm: 0 deg (the calibrated middle of a joint's range) is the
twin's zero angle, and the gripper's 0..100 spans the twin's jaw range (closed..open). Both hold by
construction for hilrec's emulated arm (:func:`hilrec.sim.units.emulated_calibration`); for a real
arm they hold as far as its calibration put the middle where the model's zero is. A middle that is
off shows as a steady offset against gravity (the twin sags differently) and as range clamping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.dataset import recorded_body_mode
from hilrec.daemon.errors import DatasetError, ReplayError
from hilrec.daemon.so101 import JOINT_NAMES, MAX_TICK, MOTORS, BodyMode, NormMode
from hilrec.drivers.calibration import ArmCalibration, load_calibration

# ``--units`` values: the flag spells -100..100 shorter than the mode's name.
FLAG_UNITS: Final[dict[str, BodyMode]] = {"degrees": BodyMode.DEGREES, "m100_100": BodyMode.RANGE_M100_100}


@dataclass(frozen=True)
class ColumnUnits:
    """How to turn the dataset's columns into the twin's units (degrees / gripper 0..100)."""

    body: BodyMode
    source: str  # where this came from, said in the report
    calibration: ArmCalibration | None = None
    calibration_source: str | None = None
    overridden: str | None = None  # what the flags replaced, if anything

    def __post_init__(self) -> None:
        if self.body == BodyMode.RANGE_M100_100 and self.calibration is None:
            raise ReplayError(
                "body joints in -100..100 need the arm's calibration (range_min, "
                "range_max per joint) to become angles: pass --calibration FILE "
                "(LeRobot's calibration JSON)"
            )

    def to_twin(self, values: np.ndarray) -> np.ndarray:
        """``(n, 6)`` dataset values -> float64 twin units."""
        out = np.asarray(values, dtype=np.float64).copy()
        if self.body == BodyMode.DEGREES:
            return out
        assert self.calibration is not None
        for j, name in enumerate(JOINT_NAMES):
            if MOTORS[name][1] == NormMode.RANGE_0_100:
                continue
            cal = self.calibration[name]
            # Undo LeRobot's RANGE_M100_100 (drive_mode negates it), back to ticks from the range
            # middle, then DEGREES (which ignores drive_mode): deg = ticks_from_mid * 360 / 4095.
            v = -out[:, j] if cal.drive_mode else out[:, j]
            ticks_from_mid = v / 200.0 * (cal.range_max - cal.range_min)
            out[:, j] = ticks_from_mid * 360.0 / MAX_TICK
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "body": "degrees" if self.body == BodyMode.DEGREES else "-100..100",
            "gripper": "0..100",
            "source": self.source,
            "calibration": self.calibration_source,
            "overridden": self.overridden,
        }


def _sidecar_mode(sidecar: Mapping[str, Any]) -> BodyMode | None:
    """The body joints' mode from a hilrec dataset sidecar (see
    :mod:`hilrec.daemon.dataset.format.joint_units`)."""
    try:
        return recorded_body_mode(sidecar)
    except DatasetError as exc:
        raise ReplayError(f"{exc}; the replay converts one mode for all body joints") from None


def _sidecar_calibration(
    sidecar: Mapping[str, Any], root: Path, arm: str | None = None
) -> ArmCalibration | None:
    follower = "follower" if arm is None else f"{arm}_follower"  # a two-arm rig's, by its prefix
    for key in ("calibration", "follower_calibration"):
        data = sidecar.get(key)
        if isinstance(data, Mapping):
            inner = data.get(follower, data)
            if isinstance(inner, Mapping) and set(JOINT_NAMES) <= set(inner):
                return ArmCalibration.from_mapping(
                    {n: inner[n] for n in JOINT_NAMES}, source=f"{root}/hilrec/dataset.json:{key}"
                )
    return None


def resolve_units(
    root: Path,
    sidecar: Mapping[str, Any] | None,
    *,
    units_flag: str | None,
    calibration_flag: Path | None,
    arm: str | None = None,
) -> ColumnUnits:
    """The dataset's units, from the flags or its sidecar (``arm``: the calibration of that arm
    of a two-arm recording); ReplayError says what is missing."""
    calibration = load_calibration(calibration_flag) if calibration_flag is not None else None
    cal_source = str(calibration_flag) if calibration_flag is not None else None
    meta_mode = _sidecar_mode(sidecar) if sidecar else None
    if units_flag is not None:
        if units_flag not in FLAG_UNITS:
            raise ReplayError(f"--units {units_flag!r}: expected one of {', '.join(FLAG_UNITS)}")
        mode = FLAG_UNITS[units_flag]
        if calibration is None and mode == BodyMode.RANGE_M100_100 and sidecar:
            calibration = _sidecar_calibration(sidecar, root, arm)
            cal_source = "dataset metadata" if calibration is not None else None
        overridden = None
        if meta_mode is not None and meta_mode != mode:
            overridden = f"dataset metadata says {meta_mode}"
        return ColumnUnits(
            body=mode,
            source="--units flag",
            calibration=calibration,
            calibration_source=cal_source,
            overridden=overridden,
        )
    if meta_mode is None:
        why = (
            "it has no hilrec metadata (hilrec/dataset.json)"
            if not sidecar
            else "its hilrec/dataset.json does not state the units"
        )
        raise ReplayError(
            f"{root}: the units of action/observation.state are unknown: {why}; "
            "pass --units degrees, or --units m100_100 with --calibration FILE"
        )
    if calibration is None and meta_mode == BodyMode.RANGE_M100_100:
        calibration = _sidecar_calibration(sidecar or {}, root, arm)
        cal_source = "dataset metadata" if calibration is not None else None
    return ColumnUnits(
        body=meta_mode,
        source="dataset metadata (hilrec/dataset.json)",
        calibration=calibration,
        calibration_source=cal_source,
    )
