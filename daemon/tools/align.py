"""``hilrec align A B``: do two datasets meant to train one policy line up, column for column?

Typically A is a sim recording and B a real one (recorded by LeRobot or by hilrec). Checked, side
by side, as a trainer sees them: the feature names, and for each its dtype, shape and names (the
order within the vector); fps, robot type, camera keys and image sizes; the joints' units; and
each joint's range in the two datasets, in one unit, with how far they overlap. They line up
when everything but the ranges is equal: a policy then reads the same number as the same thing in
both. Not judged, since no trainer sees them: the order of the features in ``info.json`` (LeRobot
reads features by key), and which of LeRobot's spellings of the SO follower the robot type uses
(``so100_follower`` and ``so101_follower`` in its 0.3 datasets, ``so_follower`` since 0.4: one
arm, one class). The ranges are reported, not judged: a narrow sim set inside a broad real one
is a coverage question (``hilrec coverage``), not a misalignment.

Units, for each dataset, from the first of: the ``--units-*`` flag; hilrec's own metadata
(``hilrec/dataset.json``); or the ranges themselves, which settle it only when a body joint
passes 100 (it cannot be RANGE_M100_100 then). Where the two differ and one side is RANGE_M100_100,
its ranges are converted to degrees through that arm's calibration (``--calibration-*``, LeRobot's
file) with LeRobot's normalisation maths, so both are compared in degrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.dataset import load_dataset_sidecar, load_info, load_stats, recorded_body_mode
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import (
    ACTION_KEY,
    BIMANUAL_ROBOT_TYPE,
    IMAGE_PREFIX,
    JOINT_NAMES,
    MOTORS,
    NUM_JOINTS,
    ROBOT_TYPE,
    ROBOT_TYPE_SPELLINGS,
    STATE_KEY,
    BodyMode,
    NormMode,
    arms_of,
    joint_names,
)

# A side's calibration: one LeRobot file per arm (left first for two arms), or one for one arm.
Calibration = Path | Sequence[Path] | None

LEROBOT_DEGREES_LIMIT = 100.0  # a body value beyond this cannot be RANGE_M100_100


@dataclass
class Side:
    root: Path
    info: dict[str, Any]
    units: BodyMode | None
    units_source: str
    low: np.ndarray  # per joint, over observation.state and action, in this side's units
    high: np.ndarray
    joints: tuple[str, ...] = JOINT_NAMES  # two arms: left_shoulder_pan ... right_gripper


@dataclass
class Alignment:
    a: Side
    b: Side
    rows: list[tuple[str, str, str, bool]] = field(default_factory=list)  # what, A, B, same
    ranges: list[tuple[str, str, str, float]] = field(default_factory=list)  # joint, A, B, overlap
    fixes: list[str] = field(default_factory=list)

    @property
    def aligned(self) -> bool:
        return all(same for *_, same in self.rows)

    def format_text(self) -> str:
        width = max(len(w) for w, *_ in self.rows)
        lines = [f"A = {self.a.root}", f"B = {self.b.root}", ""]
        lines += [
            f"{'':2}{what:<{width}}  {va:<28}  {vb:<28}  {'same' if same else 'DIFFERS'}"
            for what, va, vb, same in self.rows
        ]
        unit = self.a.units or self.b.units
        lines += [
            "",
            f"joint ranges ({'degrees' if unit == BodyMode.DEGREES else unit or 'as stored'}"
            " for body joints, 0..100 for the gripper; overlap = shared / combined span):",
        ]
        lines += [
            f"  {joint:<20} A {ra:<18} B {rb:<18} overlap {ov:.0%}" for joint, ra, rb, ov in self.ranges
        ]
        lines.append("")
        lines.append("they line up" if self.aligned else "they do NOT line up; to change:")
        lines += [f"  - {fix}" for fix in self.fixes]
        return "\n".join(lines)


def align(
    a: Path,
    b: Path,
    *,
    units: tuple[BodyMode | None, BodyMode | None] = (None, None),
    calibrations: tuple[Calibration, Calibration] = (None, None),
) -> Alignment:
    """Compare A with B. Two-arm datasets (LeRobot's bi_so_follower columns) are compared per
    arm: each joint's range under its prefixed name, and a RANGE_M100_100 side converted with a
    calibration per arm (left first)."""
    result = Alignment(a=_side(Path(a), units[0]), b=_side(Path(b), units[1]))
    _compare_schema(result)
    _compare_units(result, calibrations)
    return result


def _side(root: Path, stated: BodyMode | None) -> Side:
    info = load_info(root)
    stats = load_stats(root)
    lows, highs = [], []
    for key in (STATE_KEY, ACTION_KEY):
        entry = (stats or {}).get(key)
        if entry is None:
            raise DatasetError(f"{root}: meta/stats.json has no '{key}' min/max (run hilrec repair)")
        lows.append(np.asarray(entry["min"], dtype=np.float64))
        highs.append(np.asarray(entry["max"], dtype=np.float64))
    low, high = np.minimum(*lows), np.maximum(*highs)
    names = ((info.get("features") or {}).get(STATE_KEY) or {}).get("names") or []
    joints = joint_names(arms_of(names) or 1)
    if len(low) != len(joints):
        raise DatasetError(
            f"{root}: observation.state has {len(low)} values; "
            f"an SO-101 arm has {NUM_JOINTS}, two {2 * NUM_JOINTS}"
        )
    if stated is not None:
        return Side(root, info, stated, "stated by flag", low, high, joints)
    recorded = recorded_body_mode(load_dataset_sidecar(root))
    if recorded is not None:
        return Side(root, info, recorded, "hilrec metadata", low, high, joints)
    body = [i for i in range(len(low)) if MOTORS[JOINT_NAMES[i % NUM_JOINTS]][1] != NormMode.RANGE_0_100]
    if np.max(np.abs(np.concatenate([low[body], high[body]]))) > LEROBOT_DEGREES_LIMIT:
        return Side(root, info, BodyMode.DEGREES, "inferred: a body joint passes 100", low, high, joints)
    unknown = "unknown: every body joint within ±100 fits both units"
    return Side(root, info, None, unknown, low, high, joints)


def _compare_schema(result: Alignment) -> None:
    fa, fb = result.a.info["features"], result.b.info["features"]

    def add(what: str, va: object, vb: object, fix: str | None = None, *, same: bool | None = None) -> None:
        same = va == vb if same is None else same
        result.rows.append((what, _short(va), _short(vb), same))
        if not same and fix:
            result.fixes.append(fix)

    add(
        "fps",
        result.a.info.get("fps"),
        result.b.info.get("fps"),
        "record both at one fps (hilrec record --sim --fps)",
    )
    type_a, type_b = result.a.info.get("robot_type"), result.b.info.get("robot_type")
    add(
        "robot_type",
        type_a,
        type_b,
        f"use one robot type (LeRobot's for this arm: {ROBOT_TYPE})"
        if len(result.a.joints) == NUM_JOINTS
        else f"use one robot type (LeRobot's for two arms: {BIMANUAL_ROBOT_TYPE})",
        same=_arm(type_a) == _arm(type_b),
    )
    measured = {k for k in fa if not k.startswith(IMAGE_PREFIX) and k not in _LEROBOT_BOOKKEEPING}
    theirs = {k for k in fb if not k.startswith(IMAGE_PREFIX) and k not in _LEROBOT_BOOKKEEPING}
    only = [
        f"only {side} has {', '.join(sorted(keys))}"
        for side, keys in (("A", measured - theirs), ("B", theirs - measured))
        if keys
    ]
    add(
        "features",
        sorted(measured),
        sorted(theirs),
        f"drop or rename the features only one side has ({'; '.join(only)}): hilrec edit remove-feature",
    )
    for key in sorted(measured & theirs):
        for part in ("dtype", "shape", "names"):
            add(f"{key} {part}", fa[key].get(part), fb[key].get(part), f"make '{key}' {part} agree")
    cams_a = {k: fa[k].get("shape") for k in fa if k.startswith(IMAGE_PREFIX)}
    cams_b = {k: fb[k].get("shape") for k in fb if k.startswith(IMAGE_PREFIX)}
    add("cameras", sorted(cams_a), sorted(cams_b), "record the same camera names on both sides")
    for key in sorted(set(cams_a) & set(cams_b)):
        add(
            f"{key} shape",
            cams_a[key],
            cams_b[key],
            f"record '{key}' at one size (hilrec render --size WxH for sim)",
        )


def _compare_units(result: Alignment, calibrations: tuple[Calibration, Calibration]) -> None:
    a, b = result.a, result.b
    result.rows.append(
        (
            "units (body joints)",
            f"{a.units or '?'} ({a.units_source})",
            f"{b.units or '?'} ({b.units_source})",
            a.units is not None and a.units == b.units,
        )
    )
    lows, highs = [a.low, b.low], [a.high, b.high]
    for i, side in enumerate((a, b)):
        if side.units is None:
            result.fixes.append(
                f"state the units of {side.root} (--units-{'ab'[i]} degrees or range_m100_100)"
            )
    if a.units is not None and b.units is not None and a.units != b.units:
        for i, side in enumerate((a, b)):
            if side.units != BodyMode.RANGE_M100_100:
                continue
            per_arm = _per_arm(calibrations[i])
            arms = len(side.joints) // NUM_JOINTS
            if len(per_arm) != arms:
                result.fixes.append(
                    f"{side.root} is RANGE_M100_100: give {'its arm' if arms == 1 else 'each arm'}'s "
                    f"calibration (--calibration-{'ab'[i]}"
                    f"{', once per arm, left first' if arms > 1 else ''}) to compare ranges in degrees"
                )
                continue
            converted = [
                _m100_to_degrees(side.low[k * NUM_JOINTS : (k + 1) * NUM_JOINTS],
                                 side.high[k * NUM_JOINTS : (k + 1) * NUM_JOINTS], per_arm[k])
                for k in range(arms)
            ]  # fmt: skip
            lows[i] = np.concatenate([lo for lo, _ in converted])
            highs[i] = np.concatenate([hi for _, hi in converted])
        m100 = a if a.units == BodyMode.RANGE_M100_100 else b
        files = "FILE" if len(m100.joints) == NUM_JOINTS else "LEFT RIGHT (one per arm, left first)"
        result.fixes.append(
            "record both sides in one unit (LeRobot's use_degrees=True is hilrec's default), or convert "
            f"the RANGE_M100_100 one: hilrec edit convert-units ROOT --to degrees --calibration {files}"
        )
    # Joint by joint where both sides have it (a one-arm side against a two-arm one: its
    # columns against the left arm's, the feature rows above already say they differ).
    for j, name in enumerate(a.joints[: len(b.joints)]):
        joint = name if b.joints[j] == name else f"{name}/{b.joints[j]}"
        (la, ha), (lb, hb) = (lows[0][j], highs[0][j]), (lows[1][j], highs[1][j])
        shared = max(0.0, min(ha, hb) - max(la, lb))
        span = max(ha, hb) - min(la, lb)
        result.ranges.append(
            (joint, f"{la:.1f} .. {ha:.1f}", f"{lb:.1f} .. {hb:.1f}", shared / span if span else 1.0)
        )


def _per_arm(calibration: Calibration) -> list[Path]:
    if calibration is None:
        return []
    if isinstance(calibration, Path | str):
        return [Path(calibration)]
    return [Path(c) for c in calibration]


def _m100_to_degrees(low: np.ndarray, high: np.ndarray, calibration: Path) -> tuple[np.ndarray, np.ndarray]:
    """The maths of ``hilrec edit convert-units``, so both commands give one number."""
    from hilrec.daemon.tools.edit_units import m100_to_ticks, ticks_to_degrees
    from hilrec.drivers.calibration import load_calibration

    cal = load_calibration(calibration)
    ends = ticks_to_degrees(np.rint(m100_to_ticks(np.stack([low, high]), cal)), cal)
    return np.minimum(ends[0], ends[1]), np.maximum(ends[0], ends[1])


def _arm(robot_type: object) -> object:
    """One name for every spelling LeRobot has used for the SO follower, so none of them differs."""
    return ROBOT_TYPE if robot_type in ROBOT_TYPE_SPELLINGS else robot_type


_LEROBOT_BOOKKEEPING = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 28 else text[:25] + "..."
