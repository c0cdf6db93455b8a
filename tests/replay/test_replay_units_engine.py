"""What the columns mean (sidecar or flags), and how the twin is started and stepped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.errors import CalibrationError, ReplayError
from hilrec.daemon.replay.engine import ReplayEngine, timestep_for
from hilrec.daemon.replay.units import resolve_units
from hilrec.daemon.so101 import JOINT_NAMES

# The dataset sidecar fields hilrec's hardware rigs write (daemon/control/hardware.py dataset_fields).
CAL = {
    name: {
        "id": i + 1,
        "drive_mode": int(name == "elbow_flex"),
        "homing_offset": 0,
        "range_min": 1000,
        "range_max": 3000 + 100 * i,
    }
    for i, name in enumerate(JOINT_NAMES)
}


def rig_sidecar(body: str) -> dict:
    joints = {name: ("range_0_100" if name == "gripper" else body) for name in JOINT_NAMES}
    return {
        "units": {"body_norm_mode": body, "joints": joints},
        "calibration": {"follower": CAL, "leader": CAL},
    }


def test_units_from_a_hilrec_sidecar() -> None:
    units = resolve_units(Path("/ds"), rig_sidecar("degrees"), units_flag=None, calibration_flag=None)
    assert units.body == "degrees" and units.source.startswith("dataset metadata")
    values = np.array([[10.0, -20.0, 30.0, 40.0, 50.0, 60.0]])
    assert np.array_equal(units.to_twin(values), values)


def test_m100_units_use_the_recorded_calibration() -> None:
    units = resolve_units(Path("/ds"), rig_sidecar("range_m100_100"), units_flag=None, calibration_flag=None)
    assert units.body == "range_m100_100" and units.calibration_source == "dataset metadata"
    out = units.to_twin(np.array([[100.0, 50.0, 50.0, 0.0, -100.0, 42.0]]))[0]
    # +100 is the range's top: half the range above the middle, in degrees.
    assert out[0] == pytest.approx(2000 / 2 * 360 / 4095)
    assert out[1] == pytest.approx(2100 / 4 * 360 / 4095)
    assert out[2] == pytest.approx(-2200 / 4 * 360 / 4095)  # drive_mode 1 negates -100..100
    assert out[3] == 0.0 and out[5] == 42.0  # the gripper stays 0..100


def test_without_metadata_or_flags_the_units_are_unknown() -> None:
    with pytest.raises(ReplayError, match=r"no hilrec metadata.*--units"):
        resolve_units(Path("/ds"), None, units_flag=None, calibration_flag=None)
    with pytest.raises(ReplayError, match="does not state the units"):
        resolve_units(Path("/ds"), {"writer": {"name": "lerobot"}}, units_flag=None, calibration_flag=None)


def test_flags_override_the_sidecar_and_say_so(tmp_path: Path) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CAL))
    units = resolve_units(Path("/ds"), rig_sidecar("degrees"), units_flag="m100_100", calibration_flag=cal)
    assert units.body == "range_m100_100" and units.calibration_source == str(cal)
    assert units.overridden == "dataset metadata says degrees"
    with pytest.raises(ReplayError, match="--calibration"):
        resolve_units(Path("/ds"), None, units_flag="m100_100", calibration_flag=None)
    with pytest.raises(CalibrationError, match="no calibration file"):
        resolve_units(Path("/ds"), None, units_flag="m100_100", calibration_flag=tmp_path / "no.json")


def test_mixed_body_units_are_refused() -> None:
    sidecar = rig_sidecar("degrees")
    sidecar["units"]["joints"]["elbow_flex"] = "range_m100_100"
    with pytest.raises(ReplayError, match="mixed units"):
        resolve_units(Path("/ds"), sidecar, units_flag=None, calibration_flag=None)


def test_timestep_makes_whole_frames() -> None:
    assert timestep_for(25, None) == (0.005, "chosen for 25 fps (8 steps per frame)")
    step, why = timestep_for(30, None)
    assert step * 30 * 7 == pytest.approx(1.0) and "7 steps" in why
    assert timestep_for(30, {"physics": {"timestep": 0.002}}) == (0.002, "dataset metadata")
    assert timestep_for(25, {"sim": {"physics": {"timestep": 0.004, "substeps": 10}}}) == (
        0.004,
        "dataset metadata",
    )


def test_engine_starts_at_rest_at_the_first_recorded_state() -> None:
    start = np.array([12.0, -75.0, 40.0, 35.0, -20.0, 30.0])
    with ReplayEngine.create(25, None) as engine:
        rest = engine.start_at(start)
        assert np.max(np.abs(rest - start)) < 0.01  # where it settled, not where it was put
        # Commanding the reading itself is not holding: under gravity the servo rests below its
        # goal, so the twin sags, as the real arm would.
        replayed = engine.replay(start, np.tile(start, (25, 1)))
        assert np.max(np.abs(replayed[0] - start)) < 0.01
        assert np.max(np.abs(replayed[-1] - start)) > 0.1
        low, high = engine.limits().T
        assert np.all(low[:5] < 0) and high[0] == pytest.approx(110.0, abs=0.1) and low[5] == 0.0


def test_engine_refuses_a_rate_the_recorded_timestep_does_not_divide() -> None:
    from hilrec.daemon.errors import FrameRateError

    with pytest.raises(FrameRateError, match="valid rates near it"):
        ReplayEngine.create(30, {"physics": {"timestep": 0.005}})
