"""`hilrec replay` on recordings with known faults (issue 6, item 3).

| recording                           | made by                 | expected                                   |
|-------------------------------------|-------------------------|--------------------------------------------|
| clean                               | emulated follower (pty) | consistent                                 |
| a servo jams mid-episode            | emulated follower       | diverged, from the jam                     |
| a servo stops answering mid-episode | emulated (bus fault)    | diverged, from the silence                 |
| follower 70 ms late (1.75 frames)   | emulated follower       | lagging, within a frame                    |
| observation column one frame late   | twin recorder           | lagging by one frame                       |
| follower commands 3 frames late     | twin recorder           | lagging by 3 frames                        |
| pick and place: jaw closes on cube  | twin, scripted operator | consistent, grasp reported                 |
| LeRobot's writer, no hilrec files   | LeRobotDataset          | replayed with --units, else not replayable |
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _recordings import (
    Frozen,
    RecordingSpec,
    make_twin,
    record,
    record_emulated,
    record_operator,
    write_calibration,
    write_native,
    write_with_lerobot,
)
from _results import gripper_of, lag_frames, lag_of, onset_of, trajectories_of

from hilrec.daemon.cli import main
from hilrec.daemon.replay.check import DatasetCheck, replay_dataset
from hilrec.daemon.replay.results import EpisodeResult, ReplayVerdict
from hilrec.daemon.replay.settings import ReplaySettings

SETTINGS = ReplaySettings()
EMULATED = {
    "clean": RecordingSpec(seed=0, frames=100),
    "jammed": RecordingSpec(seed=10, frames=100, frozen=Frozen("elbow_flex", 60)),
    "silent": RecordingSpec(seed=4, frames=65, unresponsive=Frozen("wrist_flex", 50)),
    "latency": RecordingSpec(seed=1, frames=100, latency_ms=70.0),
}
SYNTHETIC = {
    "clean": RecordingSpec(seed=0, frames=200),
    "obs_late": RecordingSpec(seed=1, frames=200, obs_shift_frames=1),
    "latency": RecordingSpec(seed=2, frames=200, latency_frames=3),
    "frozen": RecordingSpec(seed=3, frames=200, frozen=Frozen("shoulder_lift", 120)),
    # The recorder missed whole tick slots (a loaded machine): 3 before row 50, 2 before row 120.
    "missed": RecordingSpec(seed=8, frames=200, missed_slots=((50, 3), (120, 2))),
    "missed_unknown": RecordingSpec(seed=8, frames=200, missed_slots=((50, 3), (120, 2)), keep_slots=False),
}
# A follower calibration unlike the emulated one: narrower and wider ranges, one inverted joint.
ARM_CALIBRATION = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": 120, "range_min": 700, "range_max": 3400},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": -300, "range_min": 800, "range_max": 3300},
    "elbow_flex": {"id": 3, "drive_mode": 1, "homing_offset": 50, "range_min": 850, "range_max": 3250},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": 0, "range_min": 900, "range_max": 3200},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": -20, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 10, "range_min": 2000, "range_max": 3300},
}


def by_name(check: DatasetCheck, names: dict[str, RecordingSpec]) -> dict[str, EpisodeResult]:
    return {name: check.results[i] for i, name in enumerate(names)}


@pytest.fixture(scope="module")
def emulated_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("emulated")
    episodes = [record_emulated(spec, work) for spec in EMULATED.values()]
    return write_native(work / "dataset", episodes, make_twin())


@pytest.fixture(scope="module")
def emulated(emulated_root: Path) -> dict[str, EpisodeResult]:
    check = replay_dataset(emulated_root, settings=SETTINGS, settings_source="defaults")
    return by_name(check, EMULATED)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EpisodeResult]:
    from hilrec.sim.twin import Twin

    twin = make_twin()
    episodes = [record(spec, twin) for spec in SYNTHETIC.values()]
    episodes.append(record_operator(0, Twin(fps=25, cameras=())))
    root = write_native(tmp_path_factory.mktemp("synthetic") / "dataset", episodes, twin)
    check = replay_dataset(root, settings=SETTINGS, settings_source="defaults")
    return {**by_name(check, SYNTHETIC), "grasp": check.results[-1]}


@pytest.fixture(scope="module")
def lerobot_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("lerobot")
    twin30 = make_twin(30)  # LeRobot's default rate: 30 fps, not a multiple of the twin's 5 ms
    degrees = [
        record(RecordingSpec(seed=5, frames=150), twin30),
        record(RecordingSpec(seed=6, frames=150, obs_shift_frames=1), twin30),
    ]
    twin25 = make_twin()
    m100 = [record(RecordingSpec(seed=7, frames=150), twin25)]
    return {
        "degrees": write_with_lerobot(work / "degrees", degrees, fps=30),
        "m100": write_with_lerobot(work / "m100", m100, body_units="m100_100", calibration=ARM_CALIBRATION),
        "calibration": write_calibration(work / "follower.json", ARM_CALIBRATION),
    }


# --- the emulated follower ---------------------------------------------------------------------


@pytest.mark.slow
def test_clean_emulated_recording_is_consistent(emulated: dict[str, EpisodeResult]) -> None:
    clean = emulated["clean"]
    assert clean.verdict is ReplayVerdict.CONSISTENT, clean.reason
    assert abs(lag_frames(clean)) < SETTINGS.lag.tolerance_frames
    # Servo ticks quantise both columns (0.088 deg): the twin tracks to a fraction of a degree.
    assert all(j.aligned_rms_error < 0.5 for j in clean.joints)


def test_jammed_servo_diverges_from_the_jam(emulated: dict[str, EpisodeResult]) -> None:
    jammed = emulated["jammed"]
    assert jammed.verdict is ReplayVerdict.DIVERGED
    assert jammed.divergence_joint == "elbow_flex"
    # Jammed as tick 60 starts, so row 60 already reads a joint that missed row 59's goal.
    assert 60 <= onset_of(jammed) <= 62, jammed.reason
    assert "frame" in jammed.reason and f"{onset_of(jammed) / 25:.2f} s" in jammed.reason
    others = [j for j in jammed.joints if j.name not in ("elbow_flex",)]
    assert all(j.divergence is None for j in others)


def test_silent_servo_diverges_from_the_silence(emulated: dict[str, EpisodeResult]) -> None:
    silent = emulated["silent"]
    assert silent.verdict is ReplayVerdict.DIVERGED
    # From frame 50 every read fails and the row repeats the last good one (frame 49's).
    assert 49 <= onset_of(silent) <= 51, silent.reason
    count, first = silent.recorder_flags["follower_failed"]
    assert (count, first) == (15, 50)
    assert any("follower_failed" in note for note in silent.notes)
    assert abs(lag_frames(silent)) < SETTINGS.lag.tolerance_frames


def test_follower_latency_is_measured_within_a_frame(emulated: dict[str, EpisodeResult]) -> None:
    late = emulated["latency"]
    assert late.verdict is ReplayVerdict.LAGGING, late.reason
    lag = lag_frames(late)
    assert abs(lag - 70.0 / 40.0) <= 1.0
    assert late.ms(lag) == pytest.approx(lag * 40.0)


# --- the twin recorder: column and timing faults -----------------------------------------------


@pytest.mark.slow
def test_clean_twin_recording_matches_exactly(synthetic: dict[str, EpisodeResult]) -> None:
    clean = synthetic["clean"]
    assert clean.verdict is ReplayVerdict.CONSISTENT
    assert max(j.max_error for j in clean.joints) < 1e-3


def test_observations_written_a_frame_late_are_lagging_by_one_frame(
    synthetic: dict[str, EpisodeResult],
) -> None:
    late = synthetic["obs_late"]
    assert late.verdict is ReplayVerdict.LAGGING
    assert lag_of(late).frames == pytest.approx(1.0, abs=0.1)
    assert lag_of(late).best_shift == 1
    assert "lags the replay by 1.00 frames (40 ms)" in late.reason


def test_latency_of_three_frames_is_found(synthetic: dict[str, EpisodeResult]) -> None:
    late = synthetic["latency"]
    assert late.verdict is ReplayVerdict.LAGGING
    lag = lag_of(late)
    assert lag.frames == pytest.approx(3.0, abs=0.25)
    assert lag.response_recorded is not None and lag.response_replayed is not None
    response = lag.response_recorded - lag.response_replayed
    assert response == pytest.approx(3.0, abs=0.5)


def test_frozen_servo_diverges_from_the_frame_it_froze(synthetic: dict[str, EpisodeResult]) -> None:
    frozen = synthetic["frozen"]
    assert frozen.verdict is ReplayVerdict.DIVERGED
    assert frozen.divergence_joint == "shoulder_lift"
    assert 120 <= onset_of(frozen) <= 123


def test_missed_tick_slots_are_replayed_as_recorded(synthetic: dict[str, EpisodeResult]) -> None:
    # With the slots beside the episode the replay holds the command through the missed frames,
    # as the follower did, and matches exactly; without them the rows look 1/fps apart and the
    # recording jumps ahead of the replay at the missed slots (a transient the servo recovers).
    missed = synthetic["missed"]
    assert missed.verdict is ReplayVerdict.CONSISTENT, missed.reason
    assert max(j.max_error for j in missed.joints) < 1e-3
    assert any("5 missed slot(s)" in note for note in missed.notes)
    unknown = synthetic["missed_unknown"]
    traj = trajectories_of(unknown)
    off = np.flatnonzero(np.abs(traj.recorded - traj.replayed).max(axis=1) > 0.5)
    assert off.size and off[0] == 50


def test_a_grasp_is_reported_and_not_judged(synthetic: dict[str, EpisodeResult]) -> None:
    # The follower's jaw stops on the cube; the replay's twin has no cube in reach and closes.
    grasp = synthetic["grasp"]
    assert grasp.verdict is ReplayVerdict.CONSISTENT, grasp.reason
    g = gripper_of(grasp)
    assert len(g.grasps) == 1 and g.grasp_frames >= 20
    assert g.held_opening is not None
    assert g.commanded[0] < 5.0 and 10.0 < g.held_opening < 25.0  # 30 mm cube, jaw held open
    assert g.replayed[0] < 5.0 and g.replayed_grasp_frames == 0
    assert all(j.divergence is None for j in grasp.joints)


# --- LeRobot's own writer, no hilrec metadata --------------------------------------------------


def test_lerobot_dataset_without_units_is_not_replayable(lerobot_roots: dict[str, Path]) -> None:
    check = replay_dataset(lerobot_roots["degrees"], settings=SETTINGS, settings_source="defaults")
    assert [r.verdict for r in check.results] == [ReplayVerdict.NOT_REPLAYABLE] * 2
    reason = check.results[0].reason
    assert "no hilrec metadata" in reason and "--units" in reason
    assert check.exit_status == 5


def test_lerobot_dataset_replays_with_the_units_flag(lerobot_roots: dict[str, Path]) -> None:
    check = replay_dataset(
        lerobot_roots["degrees"], settings=SETTINGS, settings_source="defaults", units_flag="degrees"
    )
    assert check.twin["substeps"] == 7 and check.twin["fps"] == 30
    clean, late = check.results
    assert clean.verdict is ReplayVerdict.CONSISTENT, clean.reason
    assert late.verdict is ReplayVerdict.LAGGING and lag_of(late).frames == pytest.approx(1.0, abs=0.1)
    assert "33 ms" in late.reason  # one frame at 30 fps


def test_m100_dataset_needs_the_calibration(lerobot_roots: dict[str, Path]) -> None:
    check = replay_dataset(
        lerobot_roots["m100"], settings=SETTINGS, settings_source="defaults", units_flag="m100_100"
    )
    assert check.results[0].verdict is ReplayVerdict.NOT_REPLAYABLE
    assert "--calibration" in check.results[0].reason
    check = replay_dataset(
        lerobot_roots["m100"],
        settings=SETTINGS,
        settings_source="defaults",
        units_flag="m100_100",
        calibration_flag=lerobot_roots["calibration"],
    )
    assert check.results[0].verdict is ReplayVerdict.CONSISTENT, check.results[0].reason
    assert max(j.max_error for j in check.results[0].joints) < 0.01


def test_a_calibration_too_wide_drives_commands_past_the_range(
    lerobot_roots: dict[str, Path], tmp_path: Path
) -> None:
    # A wrong range width only rescales a joint, in both columns alike, which a replay cannot
    # see; what it sees is the rescaled arm leaving its range (clamped) and no longer tracking.
    wrong = {name: dict(cal) for name, cal in ARM_CALIBRATION.items()}
    wrong["shoulder_lift"].update(range_min=0, range_max=4095)  # 1.6x the arm's 2500 ticks
    path = write_calibration(tmp_path / "wrong.json", wrong)
    check = replay_dataset(
        lerobot_roots["m100"],
        settings=SETTINGS,
        settings_source="defaults",
        units_flag="m100_100",
        calibration_flag=path,
    )
    result = check.results[0]
    lift = result.joints[1]
    assert lift.beyond_range_frames > 0
    assert any("shoulder_lift" in note and "beyond the joint range" in note for note in result.notes)
    assert result.verdict is ReplayVerdict.DIVERGED and result.divergence_joint == "shoulder_lift"


# --- the command ---------------------------------------------------------------------------------


def test_cli_json_and_exit_status(emulated_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["replay", str(emulated_root), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert status == doc["exit_status"] == 4  # worst verdict: diverged
    assert [e["verdict"] for e in doc["episodes"]] == ["consistent", "diverged", "diverged", "lagging"]
    assert doc["units"]["source"].startswith("dataset metadata")
    assert doc["exit_codes"] == {"consistent": 0, "lagging": 3, "diverged": 4, "not_replayable": 5}
    assert doc["frames_replayed"] == 365


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_cli_report_writes_plots_and_a_summary(
    emulated_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    status = main(["replay", str(emulated_root), "--episodes", "0,3", "--report", str(report)])
    out = capsys.readouterr().out
    assert status == 3  # consistent + lagging
    assert "consistent" in out and "lagging" in out and "exit status 3" in out
    summary = (report / "summary.md").read_text()
    for index in (0, 3):
        png = report / f"episode-{index:06d}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](episode-{index:06d}.png)" in summary
    assert not (report / "episode-000001.png").exists()
    assert json.loads((report / "report.json").read_text())["worst_verdict"] == "lagging"


def test_cli_consistent_episode_exits_zero(emulated_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(emulated_root), "--episodes", "0"]) == 0


def test_cli_not_replayable_and_usage_errors(
    lerobot_roots: dict[str, Path], emulated_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(lerobot_roots["degrees"])]) == 5
    assert "--units" in capsys.readouterr().out
    assert main(["replay", str(lerobot_roots["degrees"]), "--units", "degrees", "--episodes", "0"]) == 0
    capsys.readouterr()
    assert main(["replay", str(emulated_root), "--episodes", "7"]) == 2
    assert "episode(s) [7] not in the dataset" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[lag]\ntolerance_frames = 3\n")
    assert main(["replay", str(emulated_root), "--config", str(bad)]) == 2
    assert "lag.tolerance_frames" in capsys.readouterr().err


def test_replay_is_deterministic(emulated_root: Path) -> None:
    a = replay_dataset(emulated_root, settings=SETTINGS, settings_source="x", episodes=[1])
    b = replay_dataset(emulated_root, settings=SETTINGS, settings_source="x", episodes=[1])
    assert np.array_equal(trajectories_of(a.results[0]).replayed, trajectories_of(b.results[0]).replayed)
