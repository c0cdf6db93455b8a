"""``hilrec edit convert-units``: a RANGE_M100_100 dataset's joint columns to degrees.

LeRobot records an SO-101's body joints as RANGE_M100_100 unless ``use_degrees=True``, and the
gripper as RANGE_0_100 either way. A value ``v`` of a body joint came from integer
Present_Position ticks ``t`` through LeRobot's ``MotorsBus._normalize``::

    v = ((clip(t) - range_min) / (range_max - range_min)) * 200 - 100     (negated for drive_mode 1)

so the ticks are ``round((v' + 100) / 200 * (range_max - range_min) + range_min)`` with ``v'`` the
value with drive_mode undone, and their degrees LeRobot's own ``(t - mid) * 360 / 4095``
(:func:`hilrec.drivers.calibration.ticks_to_units`, bit-identical to LeRobot's). Rounding, not
LeRobot's ``int()`` of ``_unnormalize``: the ticks were whole numbers, and float32 storage puts
``v`` a hair either side of them. A value off whole ticks by more than :data:`OFF_TICK_NOTE`
means the calibration is not the one the column was recorded with: for ``observation.state``
the edit is refused (the follower's file is the one that matters, and a leader's file given by
mistake would convert it wrongly); for ``action`` (the leader's reading: give
``--leader-calibration``) the report says so.

``observation.state`` goes through ``--calibration`` (the follower's), ``action`` through
``--leader-calibration`` (default: the same file). Only body joints change; the gripper stays
RANGE_0_100, as LeRobot's ``use_degrees=True`` records it. The stats are recomputed from the
converted rows (:func:`hilrec.daemon.tools.edit_write.write_dataset`), and ``hilrec/dataset.json``
records the new units (``units.joints``, read by :mod:`hilrec.daemon.dataset.format.joint_units`) with
the calibrations used, so ``hilrec align`` and ``hilrec replay`` read degrees from it.

A two-arm dataset (LeRobot's ``bi_so_follower`` columns, ``left_*`` then ``right_*``) takes a
calibration per arm, left first (``--calibration LEFT RIGHT``, ``--leader-calibration LEFT
RIGHT``), as LeRobot keeps one file per side (``<id>_left.json``, ``<id>_right.json``): each arm's
six columns go through its own file, and a file given for the wrong side is refused or noted
naming the arm. Its metadata keeps the calibrations per arm (``calibration.left.follower``...).

Refused, naming what and where: a dataset already in degrees (its hilrec metadata says so, or a
body value passes 100), a calibration that does not hold every SO-101 joint, a body value outside
-100..100 (episode, frame, joint), or columns that are not the SO-101's joints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset import column_to_numpy, recorded_body_mode
from hilrec.daemon.errors import CalibrationError, DatasetError, FlagError
from hilrec.daemon.so101 import (
    ACTION_KEY,
    ARM_SIDES,
    JOINT_NAMES,
    MAX_TICK,
    MOTORS,
    NUM_JOINTS,
    STATE_KEY,
    BodyMode,
    NormMode,
    arm_prefixes,
    arms_of,
    position_names,
)
from hilrec.daemon.tools.edit_run import Options, hook_of, run_edit
from hilrec.daemon.tools.edit_source import EditReport, Pick, Source
from hilrec.daemon.tools.edit_write import write_dataset
from hilrec.drivers.calibration import ArmCalibration, load_calibration

M100_LIMIT: Final[float] = 100.0
# float32 holds a value of ±100 to ~8e-6: a stored RANGE_M100_100 value may pass ±100 by that.
M100_SLACK: Final[float] = 1e-4
OFF_TICK_NOTE: Final[float] = 0.01  # ticks; float32 storage alone stays below 2e-4
BODY: Final[tuple[int, ...]] = tuple(
    i for i, name in enumerate(JOINT_NAMES) if MOTORS[name][1] != NormMode.RANGE_0_100
)
KEPT: Final[tuple[int, ...]] = tuple(i for i in range(len(JOINT_NAMES)) if i not in BODY)
# A calibration flag's value: one file, or one per arm (left first).
Calibrations = Path | Sequence[Path]


@dataclass(frozen=True)
class ArmFiles:
    """One arm's calibrations (``side`` None for a one-arm dataset) and the files they came from."""

    side: str | None
    follower: ArmCalibration
    leader: ArmCalibration
    follower_path: Path
    leader_path: Path
    columns: slice

    @property
    def named(self) -> str:
        return "" if self.side is None else f"{self.side} arm: "


def m100_to_ticks(values: np.ndarray, cal: ArmCalibration) -> np.ndarray:
    """``(n, 6)`` RANGE_M100_100 body values -> the real-valued ticks they came from (float64);
    the gripper's column is left as it is."""
    out = np.asarray(values, dtype=np.float64).copy()
    for j in BODY:
        motor = cal.motors[JOINT_NAMES[j]]
        v = -out[:, j] if motor.drive_mode else out[:, j]
        out[:, j] = (v + 100) / 200 * (motor.range_max - motor.range_min) + motor.range_min
    return out


def ticks_to_degrees(ticks: np.ndarray, cal: ArmCalibration) -> np.ndarray:
    """``(n, 6)`` whole body ticks -> LeRobot's DEGREES, its operation order (float64)."""
    out = np.asarray(ticks, dtype=np.float64).copy()
    for j in BODY:
        motor = cal.motors[JOINT_NAMES[j]]
        out[:, j] = (out[:, j] - (motor.range_min + motor.range_max) / 2) * 360 / MAX_TICK
    return out


def convert_units(
    root: Path,
    *,
    to: BodyMode,
    calibration: Calibrations,
    leader_calibration: Calibrations | None = None,
    out: Path | None = None,
    options: Options | None = None,
) -> EditReport:
    """Convert ``root``'s ``observation.state`` and ``action`` to ``to`` (degrees), in place or
    into ``out`` (see the module doc). Two arms: a calibration per arm, left first."""
    if to != BodyMode.DEGREES:
        raise FlagError("--to", f"{to}: only degrees is a conversion target (from RANGE_M100_100)")
    # Read before anything is written: a bad file is refused with nothing touched.
    followers = [(p, _calibration("--calibration", p)) for p in _paths(calibration)]
    leaders = (
        [(p, _calibration("--leader-calibration", p)) for p in _paths(leader_calibration)]
        if leader_calibration is not None
        else None
    )
    hook = hook_of(options)

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        stated = _stated_units(source)
        arms = {_check_columns(source, key) for key in (STATE_KEY, ACTION_KEY)}
        if len(arms) != 1:
            raise DatasetError(f"{source.root}: {STATE_KEY} and {ACTION_KEY} name different arms")
        files = _arm_files(arms.pop(), followers, leaders)
        off_tick = {(key, arm.side): 0.0 for key in (STATE_KEY, ACTION_KEY) for arm in files}

        def transform(pick: Pick, table: pa.Table) -> pa.Table:
            frames = column_to_numpy(table.column("frame_index"), [1], name="frame_index")
            for key in (STATE_KEY, ACTION_KEY):
                values = column_to_numpy(table.column(key), [NUM_JOINTS * len(files)], name=key)
                converted = np.empty_like(values, dtype=np.float32)
                for arm in files:
                    own = values[:, arm.columns]
                    where = (source, key, pick.episode, frames, arm.side)
                    if stated is None:
                        _refuse_degrees_like(*where, own)
                    _refuse_out_of_range(*where, own)
                    cal = arm.follower if key == STATE_KEY else arm.leader
                    ticks = m100_to_ticks(own, cal)
                    whole = np.rint(ticks)
                    worst = float(np.max(np.abs(ticks - whole)[:, BODY], initial=0))
                    off_tick[key, arm.side] = max(off_tick[key, arm.side], worst)
                    part = ticks_to_degrees(whole, cal).astype(np.float32)
                    part[:, KEPT] = own[:, KEPT]  # bit for bit: the gripper is not converted
                    converted[:, arm.columns] = part
                table = table.set_column(table.schema.get_field_index(key), key, _float32_vectors(converted))
            return table

        report.notes.append(
            "units: RANGE_M100_100 "
            + (
                "(hilrec metadata)"
                if stated
                else "assumed (no hilrec metadata; every body value within ±100)"
            )
            + " -> degrees; "
            + "; ".join(
                f"{arm.named}{STATE_KEY} through {arm.follower_path}, {ACTION_KEY} through {arm.leader_path}"
                for arm in files
            )
        )
        write_dataset(
            result,
            sources,
            [Pick(0, i) for i in range(len(source.episodes))],
            command="convert-units",
            report=report,
            hook=hook,
            transform=transform,
            sidecar=_units_sidecar(files, with_leader=leaders is not None),
        )
        _judge_off_ticks(files, off_tick, report)

    return run_edit("convert-units", [root], out or root, build, options)


def _paths(value: Calibrations) -> list[Path]:
    return [Path(value)] if isinstance(value, Path | str) else [Path(v) for v in value]


def _arm_files(
    arms: int,
    followers: list[tuple[Path, ArmCalibration]],
    leaders: list[tuple[Path, ArmCalibration]] | None,
) -> list[ArmFiles]:
    """Each arm's calibrations: one file per arm, left first (the leader's default: the follower's)."""
    for flag, paths in (("--calibration", followers), ("--leader-calibration", leaders)):
        if paths is not None and len(paths) != arms:
            what = "one arm: one file" if arms == 1 else f"{arms} arms: one file per arm, left first"
            raise FlagError(
                flag, f"{len(paths)} file(s) given; the dataset has {what} ({', '.join(ARM_SIDES)})"
            )
    sides: list[str | None] = [None] if arms == 1 else list(ARM_SIDES)
    leader_files = leaders if leaders is not None else followers
    return [
        ArmFiles(
            side=side,
            follower=follower[1],
            leader=leader[1],
            follower_path=follower[0],
            leader_path=leader[0],
            columns=slice(i * NUM_JOINTS, (i + 1) * NUM_JOINTS),
        )
        for i, (side, follower, leader) in enumerate(zip(sides, followers, leader_files, strict=True))
    ]


def _judge_off_ticks(
    files: list[ArmFiles], off_tick: dict[tuple[str, str | None], float], report: EditReport
) -> None:
    for arm in files:
        worst = off_tick[STATE_KEY, arm.side]
        if worst > OFF_TICK_NOTE:
            # The follower's file is the one that matters: refused, not a note in a report.
            other = "" if arm.side is None else ", nor the other arm's (one file per arm, left first)"
            raise FlagError(
                "--calibration",
                f"{arm.named}{arm.follower_path} is not the calibration {STATE_KEY} was recorded with: its "
                f"values lie up to {worst:.2f} ticks off whole ticks of it. Give the follower's file "
                "(the daemon's follower.calibration, by default so101_follower.json), not the "
                f"leader's{other}",
            )
    for (key, side), worst in off_tick.items():
        if worst > OFF_TICK_NOTE:
            arm = next(a for a in files if a.side == side)
            cal = arm.follower if key == STATE_KEY else arm.leader
            report.notes.append(
                f"{arm.named}{key}: values lie up to {worst:.2f} ticks off whole ticks of its calibration: "
                f"was it recorded with {cal.source}? (action holds the leader's reading: "
                "--leader-calibration)"
            )


def _calibration(flag: str, path: Path) -> ArmCalibration:
    try:
        return load_calibration(path)
    except CalibrationError as exc:
        raise FlagError(flag, str(exc)) from exc


def _stated_units(source: Source) -> BodyMode | None:
    """RANGE_M100_100 as hilrec's metadata states it, None where it states nothing; refuses
    degrees."""
    mode = recorded_body_mode(source.sidecar)
    if mode == BodyMode.DEGREES:
        raise DatasetError(
            f"{source.root}: already in degrees (hilrec/dataset.json units); nothing to convert"
        )
    return mode


def _check_columns(source: Source, key: str) -> int:
    """How many arms ``key``'s columns hold (one, or LeRobot's bi_so_follower two)."""
    spec = source.features.get(key)
    if spec is None:
        raise DatasetError(f"{source.root}: no feature '{key}' to convert")
    names = list(spec.get("names") or [])
    arms = arms_of(names)
    if arms is None or list(spec.get("shape") or []) != [len(names)]:
        raise DatasetError(
            f"{source.root}: meta/info.json features.{key}: names {names}, shape {spec.get('shape')}; "
            f"convert-units needs the SO-101's {position_names(1)}, or two arms' {position_names(2)}"
        )
    return arms


def _joint(side: str | None, index: int) -> str:
    prefix = "" if side is None else arm_prefixes(len(ARM_SIDES))[ARM_SIDES.index(side)]
    return prefix + JOINT_NAMES[index]


def _refuse_degrees_like(
    source: Source, key: str, episode: int, frames: np.ndarray, side: str | None, values: np.ndarray
) -> None:
    body = np.abs(values[:, BODY])
    if body.size and float(body.max()) > M100_LIMIT + M100_SLACK:
        row, col = np.unravel_index(int(np.argmax(body)), body.shape)
        raise DatasetError(
            f"{source.root}: episode {episode}, frame {int(frames[row])}, joint "
            f"{_joint(side, BODY[col])}: {key} is {float(values[row, BODY[col]]):.3f}, beyond "
            "RANGE_M100_100's -100..100: the dataset looks like degrees already (hilrec align "
            "infers the same); nothing converted"
        )


def _refuse_out_of_range(
    source: Source, key: str, episode: int, frames: np.ndarray, side: str | None, values: np.ndarray
) -> None:
    body = values[:, BODY].astype(np.float64)
    bad = ~np.isfinite(body) | (np.abs(body) > M100_LIMIT + M100_SLACK)
    if bad.any():
        row, col = (int(i[0]) for i in np.nonzero(bad))
        raise DatasetError(
            f"{source.root}: episode {episode}, frame {int(frames[row])}, joint "
            f"{_joint(side, BODY[col])}: {key} is {float(body[row, col])!r}, outside the calibrated "
            f"range -100..100 of RANGE_M100_100 ({int(bad.sum())} such value(s) in this episode)"
        )


def _float32_vectors(values: np.ndarray) -> pa.Array:
    # From the buffer, as the writer builds its columns: pa.array() would import pandas.
    data = np.ascontiguousarray(values, dtype=np.float32)
    flat = pa.Array.from_buffers(pa.float32(), data.size, [None, pa.py_buffer(data.reshape(-1))])
    return pa.FixedSizeListArray.from_arrays(flat, data.shape[1])


def _units_sidecar(files: Sequence[ArmFiles], *, with_leader: bool) -> dict[str, Any]:
    joints = {
        name: (mode if mode == NormMode.RANGE_0_100 else BodyMode.DEGREES)
        for name, (_, mode) in MOTORS.items()
    }

    def used(arm: ArmFiles) -> dict[str, Any]:
        entry = {"follower": {name: asdict(cal) for name, cal in arm.follower.motors.items()}}
        if with_leader:
            entry["leader"] = {name: asdict(cal) for name, cal in arm.leader.motors.items()}
        return entry

    # One arm: as before ({follower, leader}); two: the same per side ({left: {...}, right: {...}}).
    calibration = used(files[0]) if files[0].side is None else {str(a.side): used(a) for a in files}
    return {
        "units": {
            "body_norm_mode": BodyMode.DEGREES,
            "joints": {k: str(v) for k, v in joints.items()},
            "converted_from": BodyMode.RANGE_M100_100,
            "command": "hilrec edit convert-units",
        },
        "calibration": calibration,
    }
