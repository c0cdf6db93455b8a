"""hilrec record --sim, hilrec check --replay, hilrec render: end to end on small datasets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format.reader import (
    load_episodes,
    load_info,
    probe_video,
    read_episode,
    video_file_path,
)
from hilrec.daemon.dataset.format.sidecar import (
    episode_json_path,
    episode_npz_path,
    load_dataset_sidecar,
    load_episode_sidecar,
)
from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, STATE_KEY
from hilrec.sim.model import locate_model
from hilrec.sim.replay import NOT_REPLAYABLE, replay_check

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

EPISODES = 2


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sim") / "ds"
    code = main(
        [
            "record",
            "--sim",
            "--root",
            str(root),
            "--episodes",
            str(EPISODES),
            "--seed",
            "5",
            "--cameras",
            "none",
            "--pushes",
            "1.5",
            "--no-progress",
        ]
    )
    assert code == 0
    return root


@pytest.fixture()
def copy_of(recorded: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(recorded, target)
    return target


def test_record_writes_a_finalized_dataset(recorded: Path) -> None:
    root = recorded
    info = load_info(root)
    assert info["total_episodes"] == EPISODES and info["fps"] == 25
    assert info["robot_type"] == "so_follower"
    assert {
        k
        for k in info["features"]
        if not k.startswith(("timestamp", "frame_index", "episode_index", "index", "task_index"))
    } == {ACTION_KEY, STATE_KEY}
    rows = read_episode(root, 0, [ACTION_KEY, STATE_KEY])
    assert rows[ACTION_KEY].dtype == np.float32 and rows[STATE_KEY].shape[1] == 6


def test_record_summary_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "one"
    assert (
        main(
            [
                "record",
                "--sim",
                "--root",
                str(root),
                "--episodes",
                "1",
                "--seed",
                "9",
                "--cameras",
                "none",
                "--no-progress",
            ]
        )
        == 0
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("1 episodes, 1 successes, ") and " frames, " in line
    assert str(root) in line and "real time" in line


def test_dataset_sidecar_says_what_world_made_it(recorded: Path) -> None:
    import mujoco

    sidecar = load_dataset_sidecar(recorded)
    assert sidecar is not None
    sim = sidecar["sim"]
    assert sim["mujoco_version"] == mujoco.__version__
    assert {p.name for p in locate_model().meshes} == set(sim["model"]["assets"])
    assert all(len(d) == 64 for d in sim["model"]["assets"].values())
    assert len(sim["model"]["xml"]["sha256"]) == 64 and len(sim["scene"]["sha256"]) == 64
    assert len(sim["operator"]["source"]["sha256"]) == 64
    assert sim["physics"]["timestep"] == 0.005 and sim["physics"]["substeps"] == 8
    assert sim["physics"]["fps"] == 25
    assert sidecar["units"]["joints"]["gripper"]["norm_mode"] == "range_0_100"


def test_episode_sidecar_holds_the_oracle_facts(recorded: Path) -> None:
    meta, arrays = load_episode_sidecar(recorded, 1)
    assert meta is not None
    sim = meta["sim"]
    assert sim["seed"] == 6
    assert set(sim["cube"]) == {"x", "y", "z", "yaw"}
    assert arrays["initial_state"].shape == (sim["physics"]["state_size"],)
    assert isinstance(meta["success"], bool) and "bin" in meta["success_criterion"]
    assert set(meta["final_cube"]) >= {"position", "quaternion"}
    assert sim["contacts"]["frames"] == len(read_episode(recorded, 1, [ACTION_KEY])[ACTION_KEY])
    for push in sim["disturbances"]:
        assert set(push) == {"frame", "body", "force", "torque"}


def test_clean_recording_replays_bit_for_bit(recorded: Path) -> None:
    report = replay_check(recorded)
    assert report.passed, report.format_text()
    assert report.world_differences == []
    for episode in report.episodes:
        assert episode.max_error == 0.0
        assert set(episode.max_error_per_joint) == set(JOINT_NAMES)
        assert episode.outcome["identical"]
    disturbed = [e for e in report.episodes if e.disturbances]
    assert disturbed, "the fixture should have drawn some pushes"
    for e in disturbed:
        assert e.disturbance_effect is not None and e.disturbance_effect["max_state_drift"] > 0


def test_check_replay_json(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(recorded), "--replay", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replay"]["passed"] is True
    assert report["replay"]["counts"]["passed"] == EPISODES


def _shift_state_one_frame_late(root: Path, episode_index: int) -> None:
    info = load_info(root)
    row = next(r for r in load_episodes(root) if r["episode_index"] == episode_index)
    path = root / info["data_path"].format(
        chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
    )
    table = pq.read_table(path)
    column = table.column(STATE_KEY)
    states = np.array(column.to_pylist(), dtype=np.float32)
    rows = np.nonzero(table.column("episode_index").to_numpy() == episode_index)[0]
    states[rows[1:]] = states[rows[:-1]].copy()  # row t now holds observation t - 1
    shifted = pa.array(states.tolist(), type=column.type)
    table = table.set_column(table.schema.get_field_index(STATE_KEY), STATE_KEY, shifted)
    pq.write_table(table, path)


def test_one_frame_late_observations_are_diagnosed_as_lag_one(copy_of: Path) -> None:
    _shift_state_one_frame_late(copy_of, 0)
    report = replay_check(copy_of)
    assert not report.passed
    late, clean = report.episodes
    assert late.status == "failed" and clean.passed
    assert late.shift is not None
    assert late.shift["best_lag"] == 1 and late.shift["exact_at_best_lag"]
    assert late.outcome["identical"]  # the actions were untouched
    assert "lag +1" in report.format_text()


def test_episode_without_start_state_is_not_replayable(copy_of: Path) -> None:
    episode_json_path(copy_of, 1).unlink()
    episode_npz_path(copy_of, 1).unlink()
    report = replay_check(copy_of)
    assert report.episodes[0].passed
    missing = report.episodes[1]
    assert missing.status == NOT_REPLAYABLE and not missing.passed
    assert "no sidecar" in missing.reason and "start state" in missing.reason
    assert not report.passed
    assert "1 not replayable" in report.format_text()


def _record(root: Path, *args: str) -> int:
    return main(["record", "--sim", "--root", str(root), "--cameras", "none", "--no-progress", *args])


def test_record_refuses_a_frame_rate_that_is_not_whole_steps_of_a_given_timestep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "bad"
    assert _record(root, "--episodes", "1", "--fps", "30", "--timestep", "0.005") == 2
    err = capsys.readouterr().err
    assert "fps 30 is not a whole number of 5 ms physics steps" in err
    assert "valid rates near it: 10, 20, 25, 40" in err and "timestep 0.005 s was given" in err
    assert not root.exists()
    assert _record(tmp_path / "worse", "--episodes", "1", "--timestep", "0.5") == 2
    assert "flag --timestep" in capsys.readouterr().err


def test_25_fps_recordings_keep_their_physics(recorded: Path) -> None:
    # Bit for bit as before the step was chosen per fps: 5 ms, 8 steps, in every place it is said.
    sidecar = load_dataset_sidecar(recorded)
    assert sidecar is not None
    physics = sidecar["sim"]["physics"]
    assert (physics["timestep"], physics["substeps"], physics["fps"]) == (0.005, 8, 25)
    assert sidecar["sim"]["scene"]["config"]["timestep"] == 0.005
    for index in range(EPISODES):
        meta, _ = load_episode_sidecar(recorded, index)
        assert meta is not None
        assert (meta["sim"]["physics"]["timestep"], meta["sim"]["physics"]["substeps"]) == (0.005, 8)


@pytest.fixture(scope="module")
def recorded_30fps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sim30") / "ds"
    assert _record(root, "--episodes", str(EPISODES), "--seed", "5", "--pushes", "1.5", "--fps", "30") == 0
    return root


def test_30_fps_records_with_a_chosen_timestep_and_replays_bit_for_bit(
    recorded_30fps: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = recorded_30fps
    info = load_info(root)
    assert info["fps"] == 30 and info["total_episodes"] == EPISODES
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    physics = sidecar["sim"]["physics"]
    assert (physics["timestep"], physics["substeps"], physics["fps"]) == (1 / 210, 7, 30)
    assert sidecar["sim"]["scene"]["config"]["timestep"] == 1 / 210
    for index in range(EPISODES):
        meta, _ = load_episode_sidecar(root, index)
        assert meta is not None and meta["sim"]["physics"]["timestep"] == 1 / 210
    report = replay_check(root)
    assert report.passed, report.format_text()
    assert report.world_differences == []
    assert all(e.max_error == 0.0 and e.outcome["identical"] for e in report.episodes)
    assert main(["check", str(root), "--replay", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["replay"]["counts"]["passed"] == EPISODES


def test_replay_uses_the_recorded_timestep_not_a_default(tmp_path: Path) -> None:
    root = tmp_path / "given"
    assert _record(root, "--episodes", "1", "--seed", "2", "--timestep", "0.004") == 0
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    physics = sidecar["sim"]["physics"]
    assert (physics["timestep"], physics["substeps"], physics["fps"]) == (0.004, 10, 25)
    report = replay_check(root)  # at 5 ms, the default for 25 fps, it would not be bit-exact
    assert report.passed and report.world_differences == [], report.format_text()


def test_render_rebuilds_pixels_and_keeps_columns(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    assert main(["render", str(recorded), "--out", str(out), "--camera", "wrist", "--size", "64x48"]) == 0
    info = load_info(out)
    assert info["features"]["observation.images.wrist"]["shape"] == [48, 64, 3]
    assert "observation.images.front" not in info["features"]
    for row in load_episodes(out):
        index = row["episode_index"]
        before = read_episode(recorded, index, [ACTION_KEY, STATE_KEY])
        after = read_episode(out, index, [ACTION_KEY, STATE_KEY])
        for key in (ACTION_KEY, STATE_KEY):
            np.testing.assert_array_equal(before[key], after[key])
        video = probe_video(video_file_path(out, info, row, "observation.images.wrist"))
        assert (video.height, video.width) == (48, 64)
    total = sum(r["length"] for r in load_episodes(out))
    frames = probe_video(
        video_file_path(out, info, load_episodes(out)[0], "observation.images.wrist")
    ).num_frames
    assert frames == total  # one file holds both episodes, frame for row
    assert replay_check(out).passed


def test_record_refuses_an_existing_dataset(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = load_info(recorded)["total_episodes"]
    assert (
        main(
            [
                "record",
                "--sim",
                "--root",
                str(recorded),
                "--episodes",
                "1",
                "--cameras",
                "none",
                "--no-progress",
            ]
        )
        == 2
    )
    assert "already exists and is not empty" in capsys.readouterr().err
    assert load_info(recorded)["total_episodes"] == before


def test_record_and_eval_refuse_a_task_by_the_one_task_rule(tmp_path: Path) -> None:
    from hilrec.daemon.errors import ConfigError
    from hilrec.daemon.tools.evaluate import EvalConfig
    from hilrec.sim.recorder import RecordConfig

    for bad, why in (
        ("   ", "empty"),
        ("two\nlines", "control characters"),
        ("bad \ud800", "not valid Unicode"),
    ):
        with pytest.raises(ConfigError, match=why):
            RecordConfig(root=tmp_path / "r", episodes=1, task=bad)
        with pytest.raises(ConfigError, match=why):
            EvalConfig(seeds=(0,), task=bad)
    with pytest.raises(ConfigError, match="listed twice"):
        RecordConfig(root=tmp_path / "r", episodes=1, cameras=("front", "front"))
    with pytest.raises(ConfigError, match="unknown camera"):
        EvalConfig(seeds=(0,), cameras=("side",))
