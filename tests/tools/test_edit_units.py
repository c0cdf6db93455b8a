"""``hilrec edit convert-units``: RANGE_M100_100 to degrees with LeRobot's own maths.

The datasets hold what LeRobot 0.4.4 records: integer ticks normalised by its own
``FeetechMotorsBus._normalize`` (RANGE_M100_100 body, RANGE_0_100 gripper), written by LeRobot's
writer (hilrec's LeRobotSink). The converted columns must equal, bit for bit as float32, what the
same bus gives in DEGREES mode for the same ticks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors import MotorCalibration as LeRobotCalibration
from lerobot.motors.feetech import FeetechMotorsBus

from hilrec.daemon.dataset.format import reader
from hilrec.daemon.dataset.format.joint_units import recorded_body_mode
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, sidecar_dir
from hilrec.daemon.errors import DatasetError, FlagError
from hilrec.daemon.so101 import ACTION_KEY, MOTORS, ROBOT_TYPE, STATE_KEY, BodyMode, so101_features
from hilrec.daemon.tools.align import align
from hilrec.daemon.tools.edit_units import convert_units

FOLLOWER = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": -1021, "range_min": 740, "range_max": 3412},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": 15, "range_min": 812, "range_max": 3195},
    "elbow_flex": {"id": 3, "drive_mode": 1, "homing_offset": 2047, "range_min": 901, "range_max": 3111},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": -2047, "range_min": 880, "range_max": 3226},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 3, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 1104, "range_min": 2016, "range_max": 3471},
}
LEADER = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": 12, "range_min": 801, "range_max": 3290},
    "shoulder_lift": {"id": 2, "drive_mode": 1, "homing_offset": -40, "range_min": 700, "range_max": 3333},
    "elbow_flex": {"id": 3, "drive_mode": 0, "homing_offset": 900, "range_min": 1000, "range_max": 3001},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": 0, "range_min": 777, "range_max": 3100},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 0, "range_min": 2000, "range_max": 3000},
}
LENGTHS = (23, 17)


def bus(cal: dict[str, Any], body: MotorNormMode) -> FeetechMotorsBus:
    motors = {
        name: Motor(mid, "sts3215", MotorNormMode.RANGE_0_100 if mode == "range_0_100" else body)
        for name, (mid, mode) in MOTORS.items()
    }
    calibration = {name: LeRobotCalibration(**entry) for name, entry in cal.items()}
    return FeetechMotorsBus(port="/dev/null-not-opened", motors=motors, calibration=calibration)


def lerobot_values(cal: dict[str, Any], ticks: np.ndarray, body: MotorNormMode) -> np.ndarray:
    """LeRobot 0.4.4's own normalisation of ``(n, 6)`` ticks, stored as LeRobot stores it."""
    arm = bus(cal, body)
    rows = []
    for row in ticks:
        values = arm._normalize({mid: int(t) for mid, t in zip(range(1, 7), row, strict=True)})
        rows.append([values[mid] for mid in range(1, 7)])
    return np.asarray(rows, dtype=np.float64).astype(np.float32)


def random_ticks(cal: dict[str, Any], n: int, rng: np.random.Generator) -> np.ndarray:
    ticks = np.stack([rng.integers(c["range_min"], c["range_max"] + 1, n) for c in cal.values()], axis=1)
    ticks[0] = [c["range_min"] for c in cal.values()]  # both ends of every range
    ticks[1] = [c["range_max"] for c in cal.values()]
    return ticks


def write_m100(root: Path, states: list[np.ndarray], actions: list[np.ndarray]) -> Path:
    from hilrec.daemon.dataset.writer.lerobot_sink import LeRobotSink

    sink = LeRobotSink.create(root, fps=25, features=so101_features(), robot_type=ROBOT_TYPE)
    for state, action in zip(states, actions, strict=True):
        for s, a in zip(state, action, strict=True):
            sink.add_frame({STATE_KEY: s, ACTION_KEY: a, "task": "pick"})
        sink.save_episode()
    sink.finalize()
    return root


def save(tmp_path: Path, name: str, cal: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cal, indent=4))
    return path


def columns(root: Path, key: str) -> np.ndarray:
    return np.concatenate([reader.read_episode(root, e)[key] for e in range(len(LENGTHS))])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A LeRobot RANGE_M100_100 recording: follower ticks in state, leader ticks in action."""
    base = tmp_path_factory.mktemp("units")
    rng = np.random.default_rng(14)
    follower_ticks = [random_ticks(FOLLOWER, n, rng) for n in LENGTHS]
    leader_ticks = [random_ticks(LEADER, n, rng) for n in LENGTHS]
    m100 = MotorNormMode.RANGE_M100_100
    root = write_m100(
        base / "m100",
        [lerobot_values(FOLLOWER, t, m100) for t in follower_ticks],
        [lerobot_values(LEADER, t, m100) for t in leader_ticks],
    )
    return {
        "root": root,
        "base": base,
        "follower": save(base, "follower", FOLLOWER),
        "leader": save(base, "leader", LEADER),
        "state_degrees": np.concatenate(
            [lerobot_values(FOLLOWER, t, MotorNormMode.DEGREES) for t in follower_ticks]
        ),
        "action_degrees": np.concatenate(
            [lerobot_values(LEADER, t, MotorNormMode.DEGREES) for t in leader_ticks]
        ),
    }


def test_converted_columns_are_lerobots_degrees_of_the_same_ticks(recorded: dict[str, Any]) -> None:
    root, out = recorded["root"], recorded["base"] / "degrees"
    info_before = (root / "meta/info.json").read_bytes()
    state_before = columns(root, STATE_KEY)
    report = convert_units(
        root,
        to=BodyMode.DEGREES,
        calibration=recorded["follower"],
        leader_calibration=recorded["leader"],
        out=out,
    )
    assert report.episodes == len(LENGTHS) and report.frames == sum(LENGTHS)
    assert not any("off whole ticks" in note for note in report.notes), report.notes
    state, action = columns(out, STATE_KEY), columns(out, ACTION_KEY)
    assert state.dtype == np.float32
    assert state.tobytes() == recorded["state_degrees"].tobytes()  # bit for bit, gripper included
    assert action.tobytes() == recorded["action_degrees"].tobytes()
    assert np.abs(state[:, :5]).max() > 100  # degrees now, not ±100 units
    # the stats are the converted data's
    stats = reader.load_stats(out)
    assert stats is not None
    both = np.concatenate([state, action])
    np.testing.assert_array_equal(np.minimum(stats[STATE_KEY]["min"], stats[ACTION_KEY]["min"]), both.min(0))
    np.testing.assert_array_equal(np.asarray(stats[STATE_KEY]["max"], np.float32), state.max(0))
    # the metadata records the units; align reads them from it
    sidecar = load_dataset_sidecar(out)
    assert recorded_body_mode(sidecar) == BodyMode.DEGREES
    assert sidecar is not None and sidecar["calibration"]["leader"]["shoulder_lift"]["drive_mode"] == 1
    lined_up = align(out, out)
    assert lined_up.a.units == BodyMode.DEGREES and lined_up.a.units_source == "hilrec metadata"
    # the source is untouched
    assert (root / "meta/info.json").read_bytes() == info_before
    assert columns(root, STATE_KEY).tobytes() == state_before.tobytes()


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_the_command_converts_in_place_and_then_refuses_a_dataset_in_degrees(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(recorded["root"]), str(root)], check=True)
    command = [
        *(sys.executable, "-m", "hilrec.daemon.cli", "edit", "convert-units", str(root)),
        *("--to", "degrees", "--calibration", str(recorded["follower"]), "--json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)[0]["swap"] == "exchange"
    assert columns(root, STATE_KEY).tobytes() == recorded["state_degrees"].tobytes()
    # action went through the follower's file: the leader's ticks are not its whole ticks
    assert any("off whole ticks" in note for note in json.loads(done.stdout)[0]["notes"])
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode != 0 and "already in degrees" in again.stderr, again.stderr
    assert columns(root, STATE_KEY).tobytes() == recorded["state_degrees"].tobytes()


def test_a_calibration_missing_a_joint_is_refused(recorded: dict[str, Any], tmp_path: Path) -> None:
    partial = save(tmp_path, "partial", {k: v for k, v in FOLLOWER.items() if k != "wrist_roll"})
    with pytest.raises(FlagError, match=r"flag --calibration: .*partial\.json.*missing \['wrist_roll'\]"):
        convert_units(recorded["root"], to=BodyMode.DEGREES, calibration=partial, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_value_outside_the_calibrated_range_is_named(recorded: dict[str, Any], tmp_path: Path) -> None:
    state = lerobot_values(
        FOLLOWER, random_ticks(FOLLOWER, 12, np.random.default_rng(1)), MotorNormMode.RANGE_M100_100
    )
    bad = state.copy()
    bad[7, 2] = 100.5  # episode 1, frame 7, elbow_flex
    root = write_m100(tmp_path / "bad", [state, bad], [state, state])
    # hilrec's metadata states RANGE_M100_100 (as a hardware recording's does)
    path = sidecar_dir(root) / "dataset.json"
    sidecar = json.loads(path.read_text()) if path.exists() else {}
    sidecar["units"] = {
        "joints": {
            name: mode if mode == "range_0_100" else "range_m100_100" for name, (_, mode) in MOTORS.items()
        }
    }
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(sidecar))
    with pytest.raises(
        DatasetError, match=r"episode 1, frame 7, joint elbow_flex: observation.state is 100\.5.*outside"
    ):
        convert_units(root, to=BodyMode.DEGREES, calibration=recorded["follower"], out=tmp_path / "out")
    # no metadata: a value past 100 says the dataset is in degrees already
    path.unlink()
    bad[7, 2] = 131.0
    degrees_like = write_m100(tmp_path / "degrees_like", [state, bad], [state, state])
    with pytest.raises(
        DatasetError, match=r"episode 1, frame 7, joint elbow_flex: .*looks like degrees already"
    ):
        convert_units(
            degrees_like, to=BodyMode.DEGREES, calibration=recorded["follower"], out=tmp_path / "out2"
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def _without(cal: dict[str, Any], joint: str) -> dict[str, Any]:
    return {k: v for k, v in cal.items() if k != joint}


def _with(cal: dict[str, Any], joint: str, **fields: Any) -> dict[str, Any]:
    return {**cal, joint: {**cal[joint], **fields}}


# (flag whose file is bad, its content, what the refusal names)
BAD_CALIBRATIONS = [
    ("--leader-calibration", _without(LEADER, "shoulder_lift"), r"missing \['shoulder_lift'\]"),
    ("--calibration", _without(FOLLOWER, "gripper"), r"missing \['gripper'\]"),
    ("--calibration", {}, r"missing \["),
    ("--calibration", _with(FOLLOWER, "elbow_flex", range_min=2000, range_max=2000), "elbow_flex"),
    ("--calibration", _with(FOLLOWER, "wrist_flex", range_min=3000, range_max=1000), "wrist_flex"),
    ("--calibration", _with(FOLLOWER, "shoulder_pan", range_max="4095"), "shoulder_pan"),
    ("--leader-calibration", [1, 2, 3], "JSON object"),
]


@pytest.mark.parametrize(("flag", "content", "named"), BAD_CALIBRATIONS)
def test_every_bad_calibration_is_refused_naming_the_flag_and_the_joint(
    recorded: dict[str, Any], tmp_path: Path, flag: str, content: Any, named: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(content))
    files = {"--calibration": recorded["follower"], "--leader-calibration": recorded["leader"], flag: bad}
    with pytest.raises(FlagError, match=rf"flag {flag}: .*bad\.json.*{named}"):
        convert_units(
            recorded["root"],
            to=BodyMode.DEGREES,
            calibration=files["--calibration"],
            leader_calibration=files["--leader-calibration"],
            out=tmp_path / "out",
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_leaders_file_as_calibration_is_refused_naming_the_followers(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    """observation.state is the follower's reading: through the leader's file it would be converted
    wrongly; that was a success with only notes."""
    root = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(recorded["root"]), str(root)], check=True)
    state_before = columns(root, STATE_KEY)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "hilrec.daemon.cli", "edit", "convert-units", str(root)),
            *("--to", "degrees", "--calibration", str(recorded["leader"])),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"flag --calibration: {recorded['leader']} is not the calibration" in done.stderr, done.stderr
    assert "follower" in done.stderr
    assert columns(root, STATE_KEY).tobytes() == state_before.tobytes()
