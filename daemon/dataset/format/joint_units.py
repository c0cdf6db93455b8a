"""What units a dataset's joint columns are in, as its hilrec sidecar states them.

Per joint, ``units.joints.<joint>`` in ``hilrec/dataset.json`` is either a mapping with a
``norm_mode`` (sim recordings, :func:`hilrec.sim.units.units_mapping`) or the mode itself
(hardware recordings, :mod:`hilrec.daemon.control.hardware`). Replay and ``hilrec align`` both read
it here. Body joints that disagree with each other are refused rather than half-converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import JOINT_NAMES, MOTORS, BodyMode, NormMode


def recorded_body_mode(sidecar: Mapping[str, Any] | None) -> BodyMode | None:
    """The body joints' mode the sidecar states, or None where it states none."""
    units = sidecar.get("units") if isinstance(sidecar, Mapping) else None
    if not isinstance(units, Mapping):
        return None
    joints = units.get("joints")
    if not isinstance(joints, Mapping):
        return None
    modes: set[str] = set()
    for name in JOINT_NAMES:
        if MOTORS[name][1] == NormMode.RANGE_0_100:
            continue
        entry = joints.get(name)
        mode = entry.get("norm_mode") if isinstance(entry, Mapping) else entry
        if not isinstance(mode, str):
            return None
        modes.add(mode.lower())
    if len(modes) != 1:
        raise DatasetError(
            f"hilrec/dataset.json: body joints have mixed units {sorted(modes)}; "
            "one mode for all body joints is expected"
        )
    mode = modes.pop()
    try:
        return BodyMode(mode)
    except ValueError:
        raise DatasetError(f"hilrec/dataset.json: unknown body-joint norm_mode {mode!r}") from None
