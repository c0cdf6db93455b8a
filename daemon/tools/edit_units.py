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

Refused, naming what and where: a dataset already in degrees (its hilrec metadata says so, or a
body value passes 100), a calibration that does not hold every SO-101 joint, a body value outside
-100..100 (episode, frame, joint), or columns that are not the SO-101's joints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset import column_to_numpy, recorded_body_mode
from hilrec.daemon.errors import CalibrationError, DatasetError, FlagError
from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, MAX_TICK, MOTORS, STATE_KEY, BodyMode, NormMode
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
    calibration: Path,
    leader_calibration: Path | None = None,
    out: Path | None = None,
    options: Options | None = None,
) -> EditReport:
    """Convert ``root``'s ``observation.state`` and ``action`` to ``to`` (degrees), in place or
    into ``out`` (see the module doc)."""
    if to != BodyMode.DEGREES:
        raise FlagError("--to", f"{to}: only degrees is a conversion target (from RANGE_M100_100)")
    follower = _calibration("--calibration", calibration)
    leader = (
        _calibration("--leader-calibration", leader_calibration)
        if leader_calibration is not None
        else follower
    )
    cals = {STATE_KEY: follower, ACTION_KEY: leader}
    hook = hook_of(options)

    def build(sources: Sequence[Source], result: Path, report: EditReport) -> None:
        source = sources[0]
        stated = _stated_units(source)
        for key in cals:
            _check_columns(source, key)
        off_tick = dict.fromkeys(cals, 0.0)

        def transform(pick: Pick, table: pa.Table) -> pa.Table:
            frames = column_to_numpy(table.column("frame_index"), [1], name="frame_index")
            for key, cal in cals.items():
                values = column_to_numpy(table.column(key), [6], name=key)
                if stated is None:
                    _refuse_degrees_like(source, key, pick.episode, frames, values)
                _refuse_out_of_range(source, key, pick.episode, frames, values)
                ticks = m100_to_ticks(values, cal)
                whole = np.rint(ticks)
                off_tick[key] = max(off_tick[key], float(np.max(np.abs(ticks - whole)[:, BODY], initial=0)))
                converted = ticks_to_degrees(whole, cal).astype(np.float32)
                converted[:, KEPT] = values[:, KEPT]  # bit for bit: the gripper is not converted
                table = table.set_column(table.schema.get_field_index(key), key, _float32_vectors(converted))
            return table

        report.notes.append(
            "units: RANGE_M100_100 "
            + (
                "(hilrec metadata)"
                if stated
                else "assumed (no hilrec metadata; every body value within ±100)"
            )
            + f" -> degrees; {STATE_KEY} through {calibration}, {ACTION_KEY} through "
            + f"{leader_calibration or calibration}"
        )
        write_dataset(
            result,
            sources,
            [Pick(0, i) for i in range(len(source.episodes))],
            command="convert-units",
            report=report,
            hook=hook,
            transform=transform,
            sidecar=_units_sidecar(follower, leader if leader_calibration is not None else None),
        )
        if off_tick[STATE_KEY] > OFF_TICK_NOTE:
            # The follower's file is the one that matters: refused, not a note in a report.
            raise FlagError(
                "--calibration",
                f"{calibration} is not the calibration {STATE_KEY} was recorded with: its values lie up "
                f"to {off_tick[STATE_KEY]:.2f} ticks off whole ticks of it. Give the follower's file "
                "(the daemon's follower.calibration, by default so101_follower.json), not the leader's",
            )
        for key, worst in off_tick.items():
            if worst > OFF_TICK_NOTE:
                report.notes.append(
                    f"{key}: values lie up to {worst:.2f} ticks off whole ticks of its calibration: was "
                    f"it recorded with {cals[key].source}? (action holds the leader's reading: "
                    "--leader-calibration)"
                )

    return run_edit("convert-units", [root], out or root, build, options)


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


def _check_columns(source: Source, key: str) -> None:
    spec = source.features.get(key)
    if spec is None:
        raise DatasetError(f"{source.root}: no feature '{key}' to convert")
    names = list(spec.get("names") or [])
    want = [f"{name}.pos" for name in JOINT_NAMES]
    if names != want or list(spec.get("shape") or []) != [6]:
        raise DatasetError(
            f"{source.root}: meta/info.json features.{key}: names {names}, shape {spec.get('shape')}; "
            f"convert-units needs the SO-101's {want}"
        )


def _refuse_degrees_like(
    source: Source, key: str, episode: int, frames: np.ndarray, values: np.ndarray
) -> None:
    body = np.abs(values[:, BODY])
    if body.size and float(body.max()) > M100_LIMIT + M100_SLACK:
        row, col = np.unravel_index(int(np.argmax(body)), body.shape)
        raise DatasetError(
            f"{source.root}: episode {episode}, frame {int(frames[row])}, joint "
            f"{JOINT_NAMES[BODY[col]]}: {key} is {float(values[row, BODY[col]]):.3f}, beyond "
            "RANGE_M100_100's -100..100: the dataset looks like degrees already (hilrec align "
            "infers the same); nothing converted"
        )


def _refuse_out_of_range(
    source: Source, key: str, episode: int, frames: np.ndarray, values: np.ndarray
) -> None:
    body = values[:, BODY].astype(np.float64)
    bad = ~np.isfinite(body) | (np.abs(body) > M100_LIMIT + M100_SLACK)
    if bad.any():
        row, col = (int(i[0]) for i in np.nonzero(bad))
        raise DatasetError(
            f"{source.root}: episode {episode}, frame {int(frames[row])}, joint "
            f"{JOINT_NAMES[BODY[col]]}: {key} is {float(body[row, col])!r}, outside the calibrated "
            f"range -100..100 of RANGE_M100_100 ({int(bad.sum())} such value(s) in this episode)"
        )


def _float32_vectors(values: np.ndarray) -> pa.Array:
    # From the buffer, as the writer builds its columns: pa.array() would import pandas.
    data = np.ascontiguousarray(values, dtype=np.float32)
    flat = pa.Array.from_buffers(pa.float32(), data.size, [None, pa.py_buffer(data.reshape(-1))])
    return pa.FixedSizeListArray.from_arrays(flat, data.shape[1])


def _units_sidecar(follower: ArmCalibration, leader: ArmCalibration | None) -> dict[str, Any]:
    joints = {
        name: (mode if mode == NormMode.RANGE_0_100 else BodyMode.DEGREES)
        for name, (_, mode) in MOTORS.items()
    }
    calibration = {"follower": {name: asdict(cal) for name, cal in follower.motors.items()}}
    if leader is not None:
        calibration["leader"] = {name: asdict(cal) for name, cal in leader.motors.items()}
    return {
        "units": {
            "body_norm_mode": BodyMode.DEGREES,
            "joints": {k: str(v) for k, v in joints.items()},
            "converted_from": BodyMode.RANGE_M100_100,
            "command": "hilrec edit convert-units",
        },
        "calibration": calibration,
    }
