"""``hilrec align``: datasets that line up exit 0; each kind of difference is named with its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.so101 import ACTION_KEY, ROBOT_TYPE, STATE_KEY, BodyMode, so101_features
from hilrec.daemon.tools.align import align
from hilrec.sim.recorder import RecordConfig, record

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("align") / "sim"
    record(
        RecordConfig(root=root, episodes=1, seed=2, image_size=(48, 64), video_codec="libx264"),
        progress=False,
    )
    return root


def lerobot_style(
    root: Path,
    values: np.ndarray,
    *,
    fps: int = 25,
    size: tuple[int, int] = (48, 64),
    robot_type: str = ROBOT_TYPE,
    order: tuple[str, ...] | None = None,
    extra: str | None = None,
) -> Path:
    """A dataset as LeRobot's recorder leaves one: no hilrec sidecar saying the units.

    ``order`` lists the features in the order info.json will hold them; ``extra`` adds a float32
    [6] feature of that name.
    """
    from hilrec.daemon.dataset.writer.lerobot_sink import LeRobotSink

    features = so101_features({"front": size})
    if extra is not None:
        features[extra] = dict(features[STATE_KEY])
    if order is not None:
        features = {key: features[key] for key in order}
    sink = LeRobotSink.create(root, fps=fps, features=features, robot_type=robot_type, video_codec="libx264")
    image = np.zeros((*size, 3), np.uint8)
    for row in values:
        frame = {STATE_KEY: row, ACTION_KEY: row, "observation.images.front": image, "task": "real"}
        sink.add_frame({**frame, **({extra: row} if extra else {})})
    sink.save_episode()
    sink.finalize()
    return root


def sweep(amplitude: float, n: int = 30) -> np.ndarray:
    t = np.linspace(-1, 1, n, dtype=np.float32)[:, None]
    body = amplitude * t * np.ones((1, 5), np.float32)
    return np.concatenate([body, 50 + 40 * t], axis=1).astype(np.float32)


def test_a_sim_recording_and_a_degrees_recording_line_up(sim: Path, tmp_path: Path) -> None:
    real = lerobot_style(tmp_path / "real", sweep(120.0))  # passes 100: degrees, inferred
    result = align(sim, real)
    assert result.aligned, result.format_text()
    assert result.a.units_source == "hilrec metadata" and result.b.units_source.startswith("inferred")
    assert [joint for joint, *_ in result.ranges] == [
        "shoulder_pan",
        "shoulder_lift",
        "elbow_flex",
        "wrist_flex",
        "wrist_roll",
        "gripper",
    ]
    assert all(0.0 <= overlap <= 1.0 for *_, overlap in result.ranges)


def test_fps_camera_size_and_units_differences_are_named_with_what_to_change(
    sim: Path, tmp_path: Path
) -> None:
    other = lerobot_style(tmp_path / "other", sweep(80.0), fps=30, size=(96, 128))  # ±80: units unknown
    result = align(sim, other)
    assert not result.aligned
    differing = {what for what, _, _, same in result.rows if not same}
    assert {"fps", "observation.images.front shape", "units (body joints)"} <= differing
    text = result.format_text()
    assert "state the units of" in text and "--units-b" in text and "one fps" in text


def test_range_m100_100_is_compared_in_degrees_through_the_calibration(sim: Path, tmp_path: Path) -> None:
    from hilrec.drivers.calibration import ArmCalibration, MotorCalibration, save_calibration
    from hilrec.sim.units import emulated_calibration

    cal = ArmCalibration({name: MotorCalibration(**entry) for name, entry in emulated_calibration().items()})
    cal_path = tmp_path / "cal.json"
    save_calibration(cal, cal_path)
    m100 = lerobot_style(tmp_path / "m100", sweep(90.0))
    result = align(sim, m100, units=(None, None))
    assert not result.aligned  # unknown units: never silently assumed
    converted = align(sim, m100, units=(None, BodyMode.RANGE_M100_100), calibrations=(None, cal_path))
    pan = cal.motors["shoulder_pan"]
    # ±90 of a -100..100 range is ±90% of the calibrated half span, here in degrees.
    expected = 0.9 * (pan.range_max - pan.range_min) / 2 * 360 / 4095
    low, high = (float(x) for x in converted.ranges[0][2].split(" .. "))
    assert high == pytest.approx(expected, abs=0.2) and low == pytest.approx(-expected, abs=0.2)
    assert abs(expected - 90.0) > 1.0  # degrees, not the ±90 units it was stored in
    assert any("one unit" in fix for fix in converted.fixes)


def test_the_command_exits_0_when_aligned_and_1_otherwise(sim: Path, tmp_path: Path) -> None:
    real = lerobot_style(tmp_path / "real", sweep(120.0))
    ok = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "align", str(sim), str(real)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0 and "they line up" in ok.stdout, ok.stdout + ok.stderr
    off = lerobot_style(tmp_path / "off", sweep(120.0), fps=30)
    bad = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "align", str(sim), str(off)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1 and "DIFFERS" in bad.stdout


def test_the_order_of_features_in_info_json_is_no_difference(sim: Path, tmp_path: Path) -> None:
    import json

    order = ("observation.images.front", STATE_KEY, ACTION_KEY)
    real = lerobot_style(tmp_path / "reordered", sweep(120.0), order=order)
    written = json.loads((real / "meta" / "info.json").read_text())["features"]
    assert [k for k in written if k in order] == list(order)  # the other order, as LeRobot wrote it
    result = align(sim, real)
    assert result.aligned, result.format_text()
    assert not result.fixes and "drop or rename" not in result.format_text()


@pytest.mark.parametrize("spelling", ["so101_follower", "so100_follower", "so_follower"])
def test_lerobots_spellings_of_the_so_follower_are_one_arm(sim: Path, tmp_path: Path, spelling: str) -> None:
    real = lerobot_style(tmp_path / spelling, sweep(120.0), robot_type=spelling)
    result = align(sim, real)
    assert result.aligned, result.format_text()
    assert ("robot_type", ROBOT_TYPE, spelling, True) in result.rows


def test_another_arm_differs_and_the_advice_names_it(sim: Path, tmp_path: Path) -> None:
    other = lerobot_style(tmp_path / "koch", sweep(120.0), robot_type="koch_follower")
    result = align(sim, other)
    assert not result.aligned
    assert result.fixes == [f"use one robot type (LeRobot's for this arm: {ROBOT_TYPE})"]


def test_a_feature_only_one_side_has_is_named_in_the_advice(sim: Path, tmp_path: Path) -> None:
    real = lerobot_style(tmp_path / "extra", sweep(120.0), extra="observation.effort")
    result = align(sim, real)
    assert not result.aligned
    assert [what for what, _, _, same in result.rows if not same] == ["features"]
    assert result.fixes == [
        "drop or rename the features only one side has (only B has observation.effort): "
        "hilrec edit remove-feature"
    ]


def test_the_order_within_a_vector_differs(sim: Path, tmp_path: Path) -> None:
    import json

    real = lerobot_style(tmp_path / "names", sweep(120.0))
    path = real / "meta" / "info.json"
    info = json.loads(path.read_text())
    names = info["features"][STATE_KEY]["names"]
    info["features"][STATE_KEY]["names"] = [names[1], names[0], *names[2:]]  # one swap: another vector
    path.write_text(json.dumps(info, indent=4))
    result = align(sim, real)
    assert [what for what, _, _, same in result.rows if not same] == [f"{STATE_KEY} names"]
    assert result.fixes == [f"make '{STATE_KEY}' names agree"]
